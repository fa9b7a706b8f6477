// CompileLeases: SET NX PX to take a lease, a script (or GET, then act) to renew and release only
// our own, and one thread renewing every lease held.
#include "cache/compile_lease.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::cache {
namespace {

// Runs ARGV[2] on the lease with ARGV[3..] while it holds ARGV[1]: renewal (PEXPIRE) and release
// (DEL) in one atomic step, so that neither touches a lease that passed to another daemon.
constexpr std::string_view kIfOurs =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call(ARGV[2], KEYS[1], unpack(ARGV, 3)) end return 0";

}  // namespace

CompileLeases::CompileLeases(RedisStore* redis, CompileLeaseOptions options)
    : redis_(redis), options_(std::move(options)), ttl_ms_(std::to_string(options_.ttl.count())) {
  renewer_ = std::thread([this] { Renew(); });
}

CompileLeases::~CompileLeases() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  renewer_.join();
}

std::string CompileLeases::LeaseKey(std::string_view key) const {
  return redis_->RedisKey(absl::StrCat("lease:", std::string(key)));
}

size_t CompileLeases::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

absl::StatusOr<Lease> CompileLeases::Acquire(std::string_view key) {
  absl::StatusOr<RedisReply> reply =
      redis_->Run({"SET", LeaseKey(key), options_.holder, "NX", "PX", ttl_ms_});
  if (!reply.ok()) return reply.status();
  switch (reply->type) {
    case RedisReply::Type::kStatus: {
      std::lock_guard<std::mutex> lock(mu_);
      held_.insert(std::string(key));
      return Lease::kOurs;
    }
    case RedisReply::Type::kNil:
      return Lease::kTheirs;
    default:
      return absl::UnavailableError(absl::StrCat("redis SET NX: ", reply->str));
  }
}

void CompileLeases::Release(std::string_view key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(std::string(key));
  }
  absl::StatusOr<bool> released = IfOurs(LeaseKey(key), "DEL", {});
  if (!released.ok()) {
    spdlog::debug("compile lease of {} not released ({}); it expires within {} ms", key,
                  released.status().ToString(), ttl_ms_);
  }
}

absl::StatusOr<bool> CompileLeases::Held(std::string_view key) {
  absl::StatusOr<RedisReply> reply = redis_->Run({"EXISTS", LeaseKey(key)});
  if (!reply.ok()) return reply.status();
  if (reply->type != RedisReply::Type::kInteger) {
    return absl::UnavailableError(absl::StrCat("redis EXISTS: ", reply->str));
  }
  return reply->integer > 0;
}

absl::StatusOr<bool> CompileLeases::IfOurs(const std::string& lease_key, std::string_view command,
                                           std::vector<std::string_view> extra) {
  if (scripting_) {
    std::vector<std::string_view> args = {"EVAL",    kIfOurs,         "1",
                                          lease_key, options_.holder, command};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<RedisReply> reply = redis_->Run(args);
    if (!reply.ok()) return reply.status();
    if (reply->type == RedisReply::Type::kInteger) return reply->integer == 1;
    // A Redis that refuses scripts (EVAL renamed away, or denied to kilnd's ACL user).
    spdlog::info("redis refuses EVAL ({}); compile leases are renewed and released after a GET",
                 reply->str);
    scripting_ = false;
  }
  // Not atomic: the lease may pass to another daemon between the GET and the command, but only
  // if it expired in that instant.
  absl::StatusOr<RedisReply> owner = redis_->Run({"GET", lease_key});
  if (!owner.ok()) return owner.status();
  if (owner->type != RedisReply::Type::kString || owner->str != options_.holder) return false;
  std::vector<std::string_view> args = {command, lease_key};
  args.insert(args.end(), extra.begin(), extra.end());
  absl::StatusOr<RedisReply> reply = redis_->Run(args);
  if (!reply.ok()) return reply.status();
  return reply->type == RedisReply::Type::kInteger && reply->integer == 1;
}

void CompileLeases::Renew() {
  const auto period = std::max(std::chrono::milliseconds(1), options_.ttl / 3);
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stopping_; })) {
    const std::vector<std::string> keys(held_.begin(), held_.end());
    lock.unlock();
    for (const std::string& key : keys) {
      absl::StatusOr<bool> renewed = IfOurs(LeaseKey(key), "PEXPIRE", {ttl_ms_});
      // A tier that does not answer is retried next period; the lease may expire meanwhile.
      if (!renewed.ok() || *renewed) continue;
      std::lock_guard<std::mutex> relock(mu_);
      if (held_.erase(key) > 0) {  // not released meanwhile: it expired
        spdlog::warn(
            "compile lease of {} expired before its compile ended; another kilnd may "
            "compile it too",
            key);
      }
    }
    lock.lock();
  }
}

}  // namespace kiln::cache
