// RedisStore: GET/SET of framed records over hiredis.
#include "cache/remote_store.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include "absl/strings/str_cat.h"
#include "cache/record.h"

namespace kiln::cache {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval ToTimeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000),
                 static_cast<suseconds_t>((ms.count() % 1000) * 1000)};
}

}  // namespace

RedisStore::RedisStore(RedisStoreOptions options) : options_(std::move(options)) {}

RedisStore::~RedisStore() {
  std::lock_guard<std::mutex> lock(mu_);
  DropLocked();
}

std::string RedisStore::RedisKey(std::string_view key) const {
  return absl::StrCat(options_.key_namespace, ":", std::string(key));
}

void RedisStore::DropLocked() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

absl::Status RedisStore::ConnectLocked() {
  if (context_ != nullptr) return absl::OkStatus();
  if (std::chrono::steady_clock::now() < next_attempt_) {
    return absl::UnavailableError("redis tier is down; not retrying yet");
  }
  context_ =
      redisConnectWithTimeout(options_.host.c_str(), options_.port, ToTimeval(options_.timeout));
  if (context_ == nullptr || context_->err != 0) {
    std::string why = context_ != nullptr ? context_->errstr : "out of memory";
    DropLocked();
    next_attempt_ = std::chrono::steady_clock::now() + options_.retry_after;
    return absl::UnavailableError(
        absl::StrCat("redis ", options_.host, ":", options_.port, ": ", why));
  }
  redisSetTimeout(context_, ToTimeval(options_.timeout));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisStore::Get(std::string_view key) {
  std::string redis_key = RedisKey(key);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ConnectLocked(); !s.ok()) return s;
  Reply reply(static_cast<redisReply*>(
      redisCommand(context_, "GET %b", redis_key.data(), redis_key.size())));
  if (!reply) {
    std::string why = context_->errstr;
    DropLocked();
    return absl::UnavailableError(absl::StrCat("redis GET: ", why));
  }
  if (reply->type == REDIS_REPLY_NIL) return absl::NotFoundError("not in redis");
  if (reply->type != REDIS_REPLY_STRING) {
    return absl::UnavailableError(absl::StrCat("redis GET: unexpected reply type ", reply->type));
  }
  return DecodeRecord(std::string_view(reply->str, reply->len));
}

absl::Status RedisStore::Put(std::string_view key, std::string_view payload) {
  if (options_.read_only) return absl::FailedPreconditionError("redis tier is read-only");
  std::string redis_key = RedisKey(key);
  std::string record = EncodeRecord(payload);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ConnectLocked(); !s.ok()) return s;
  Reply reply(static_cast<redisReply*>(redisCommand(
      context_, "SET %b %b", redis_key.data(), redis_key.size(), record.data(), record.size())));
  if (!reply) {
    std::string why = context_->errstr;
    DropLocked();
    return absl::UnavailableError(absl::StrCat("redis SET: ", why));
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::UnavailableError(absl::StrCat("redis SET: ", std::string(reply->str, reply->len)));
  }
  return absl::OkStatus();
}

}  // namespace kiln::cache
