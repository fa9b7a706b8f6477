// RedisStore: GET (and SET for PutNow) on the caller's thread under a circuit breaker, queued
// SETs and probes behind it.
#include "cache/remote_store.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "cache/record.h"

namespace kiln::cache {

absl::StatusOr<std::unique_ptr<RedisStore>> RedisStore::Create(RedisStoreOptions options) {
  std::unique_ptr<RedisTls> tls;
  if (options.endpoint.tls) {
    absl::StatusOr<std::unique_ptr<RedisTls>> created = RedisTls::Create(options.endpoint);
    if (!created.ok()) return created.status();
    tls = *std::move(created);
  }
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(options), std::move(tls)));
}

RedisStore::RedisStore(RedisStoreOptions options, std::unique_ptr<RedisTls> tls)
    : options_(std::move(options)),
      tls_(std::move(tls)),
      breaker_(options_.retry_after, options_.max_retry_after) {
  background_ = std::thread([this] { Background(); });
}

RedisStore::~RedisStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    stats_.writes_dropped += queue_.size();
    queue_.clear();
  }
  cv_.notify_all();
  background_.join();
}

std::string RedisStore::RedisKey(std::string_view key) const {
  return absl::StrCat(options_.key_namespace, ":", std::string(key));
}

void RedisStore::Failed(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
  }
  if (breaker_.RecordFailure(status)) {
    spdlog::warn(
        "shared cache tier {} is down or hung ({}); serving from the local tier alone, "
        "probing it every {} ms at first",
        options_.endpoint.Describe(), status.ToString(), options_.retry_after.count());
    cv_.notify_all();  // the background thread schedules the probe
  }
}

absl::StatusOr<RedisReply> RedisStore::RunUnchecked(const std::vector<std::string_view>& args) {
  const auto start = Clock::now();
  std::unique_ptr<RedisConnection> connection;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      connection = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  absl::StatusOr<RedisReply> reply = absl::UnavailableError("not connected");
  if (connection != nullptr) {
    reply = connection->Command(args, start + options_.command_deadline);
    // A pooled connection the server has closed since (a restart, its idle timeout) says
    // nothing about the server now: one fresh connection decides.
    if (!reply.ok() && !absl::IsDeadlineExceeded(reply.status())) connection.reset();
  }
  if (connection == nullptr) {
    absl::StatusOr<std::unique_ptr<RedisConnection>> made = RedisConnection::Connect(
        options_.endpoint, tls_.get(), options_.timeout, start + 4 * options_.timeout);
    if (!made.ok()) return made.status();
    connection = *std::move(made);
    reply = connection->Command(args, start + options_.command_deadline);
  }
  if (!reply.ok()) return reply.status();  // the connection is broken: dropped here
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < options_.idle_connections) idle_.push_back(std::move(connection));
  return reply;
}

absl::StatusOr<RedisReply> RedisStore::Run(const std::vector<std::string_view>& args) {
  if (!breaker_.Allow()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.skipped;
    return absl::UnavailableError(absl::StrCat("redis tier is down (", breaker_.reason(), ")"));
  }
  absl::StatusOr<RedisReply> reply = RunUnchecked(args);
  if (reply.ok()) {
    breaker_.RecordSuccess();
  } else {
    Failed(reply.status());
  }
  return reply;
}

absl::StatusOr<std::string> RedisStore::Get(std::string_view key) {
  const std::string redis_key = RedisKey(key);
  absl::StatusOr<RedisReply> reply = Run({"GET", redis_key});
  if (!reply.ok()) {
    return absl::UnavailableError(absl::StrCat("redis GET: ", reply.status().message()));
  }
  switch (reply->type) {
    case RedisReply::Type::kNil:
      return absl::NotFoundError("not in redis");
    case RedisReply::Type::kString:
      return DecodeRecord(reply->str);
    case RedisReply::Type::kError:
      return absl::UnavailableError(absl::StrCat("redis GET: ", reply->str));
    default:
      return absl::UnavailableError("redis GET: unexpected reply type");
  }
}

absl::Status RedisStore::Put(std::string_view key, std::string_view payload) {
  if (options_.read_only) return absl::FailedPreconditionError("redis tier is read-only");
  std::string record = EncodeRecord(payload);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!breaker_.Allow() || queued_bytes_ + record.size() > options_.write_queue_bytes) {
      ++stats_.writes_dropped;
      return absl::ResourceExhaustedError(
          breaker_.Allow() ? "too many values waiting to be written to redis"
                           : absl::StrCat("redis tier is down (", breaker_.reason(), ")"));
    }
    queued_bytes_ += record.size();
    queue_.emplace_back(RedisKey(key), std::move(record));
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status RedisStore::Set(const std::string& redis_key, const std::string& record) {
  absl::StatusOr<RedisReply> reply = Run({"SET", redis_key, record});
  absl::Status written = !reply.ok() ? reply.status()
                         : reply->type == RedisReply::Type::kError
                             ? absl::UnavailableError(absl::StrCat("redis SET: ", reply->str))
                             : absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (written.ok()) {
    ++stats_.writes;
  } else {
    ++stats_.writes_dropped;
  }
  return written;
}

absl::Status RedisStore::PutNow(std::string_view key, std::string_view payload) {
  if (options_.read_only) return absl::FailedPreconditionError("redis tier is read-only");
  return Set(RedisKey(key), EncodeRecord(payload));
}

void RedisStore::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

RemoteStoreStats RedisStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RemoteStoreStats stats = stats_;
  stats.down = breaker_.open();
  return stats;
}

void RedisStore::Background() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (!queue_.empty()) {
      auto [key, record] = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= record.size();
      writing_ = true;
      lock.unlock();
      if (breaker_.Allow()) {
        Set(key, record).IgnoreError();  // counted there
        lock.lock();
      } else {
        lock.lock();
        ++stats_.writes_dropped;
      }
      writing_ = false;
      cv_.notify_all();
      continue;
    }
    if (breaker_.open()) {
      const auto due = breaker_.next_probe();
      if (Clock::now() < due) {
        cv_.wait_until(lock, due);
        continue;
      }
      lock.unlock();
      absl::StatusOr<RedisReply> pong = RunUnchecked({"PING"});
      if (pong.ok()) {
        breaker_.RecordSuccess();
        spdlog::warn("shared cache tier {} answers again", options_.endpoint.Describe());
      } else {
        breaker_.RecordProbeFailure(pong.status());
      }
      lock.lock();
      continue;
    }
    cv_.wait(lock);
  }
}

}  // namespace kiln::cache
