// ArtifactStore over RocksDB: records in the default column family, last-access sequence
// numbers in "access", an in-memory index of both rebuilt on Open, and one background thread
// that compacts after evictions and sets damaged files aside.
#include "cache/artifact_store.h"

#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cache/record.h"

namespace kiln::cache {
namespace {

constexpr size_t kRecords = 0;  // index of each family in the handles
constexpr size_t kAccess = 1;

absl::Status FromRocks(const rocksdb::Status& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(s.ToString());
  return absl::UnavailableError(absl::StrCat("rocksdb: ", s.ToString()));
}

// Access sequences are stored big-endian so the column family also sorts by them.
std::string EncodeSeq(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

uint64_t DecodeSeq(std::string_view s) {
  uint64_t v = 0;
  for (unsigned char c : s.substr(0, 8)) v = (v << 8) | c;
  return v;
}

// The memtable holds recent writes, evicted ones too, until it is flushed: sized to the store
// so that a small store does not keep many times its limit in memory and in the log.
uint64_t WriteBufferBytes(uint64_t max_bytes) {
  return std::clamp<uint64_t>(max_bytes / 4, uint64_t{64} << 10, uint64_t{64} << 20);
}

rocksdb::DBOptions DatabaseOptions(uint64_t max_bytes) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.max_open_files = 256;
  options.paranoid_checks = true;  // (the default) what RocksDB reads is checked, and said
  // RocksDB's own LOG: warnings only, two files of 1 MiB at most. Recovery logs through kilnd.
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  options.max_log_file_size = 1 << 20;
  options.keep_log_file_num = 2;
  options.max_manifest_file_size = 4 << 20;
  // The access family's small writes would otherwise keep old logs, and the artifacts in them,
  // on disk long after the records family was flushed.
  options.max_total_wal_size = 2 * WriteBufferBytes(max_bytes);
  // RocksDB would reserve a write buffer's worth (up to 70 MiB) of disk for each open log ahead
  // of any write: a cache whose records are a few KB to a few MB each should not hold that much
  // disk it does not use, least of all on a machine running several daemons.
  options.allow_fallocate = false;
  return options;
}

std::vector<rocksdb::ColumnFamilyDescriptor> Families(uint64_t max_bytes) {
  rocksdb::ColumnFamilyOptions family;
  family.write_buffer_size = WriteBufferBytes(max_bytes);
  family.max_write_buffer_number = 2;
  return {{ArtifactStore::kRecordsFamily, family}, {ArtifactStore::kAccessFamily, family}};
}

}  // namespace

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(
    const ArtifactStoreOptions& options) {
  std::unique_ptr<ArtifactStore> store(new ArtifactStore(options));
  // RocksDB locks the database too, but recovery moves and rebuilds it: only a process that
  // holds this lock may, so a second daemon on the same cache directory is refused instead.
  const std::string lock_path = options.path + ".lock";
  store->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (store->lock_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(store->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("another process has the artifact database ", options.path, " open"));
  }
  RecoveryReport report;
  if (absl::Status s = OpenOrRecover(options.path, DatabaseOptions(options.max_bytes),
                                     Families(options.max_bytes), &store->db_, &report);
      !s.ok()) {
    return s;
  }
  {
    std::unique_lock<std::shared_mutex> db_lock(store->db_mu_);
    store->AddReport(report);
    if (absl::Status loaded = store->Load(); !loaded.ok()) store->RecoverLocked(loaded);
    if (store->db_.db == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot open an artifact database at ",
                                                 options.path, " even after recovery"));
    }
  }
  store->background_ = std::thread([s = store.get()] { s->Background(); });
  return store;
}

ArtifactStore::ArtifactStore(ArtifactStoreOptions options) : options_(std::move(options)) {}

ArtifactStore::~ArtifactStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  {
    std::shared_lock<std::shared_mutex> db_lock(db_mu_);
    if (db_.db != nullptr) db_.db->DisableManualCompaction();  // a compaction running now stops
  }
  if (background_.joinable()) background_.join();
  if (db_.db != nullptr) {
    // Into table files, so that the next start replays no log (and a log damaged while kilnd
    // was down costs nothing).
    rocksdb::FlushOptions flush;
    flush.wait = true;
    db_.db->Flush(flush, db_.handles).PermitUncheckedError();
  }
  db_.Close();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void ArtifactStore::AddReport(const RecoveryReport& report) {
  for (const std::string& event : report.events) {
    spdlog::warn("artifact database {}: {}", options_.path, event);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.wal_damaged += report.wal_damaged ? 1 : 0;
  stats_.repairs += (report.repaired ? 1 : 0) + (report.moved_aside ? 1 : 0);
  stats_.damaged_files += report.damaged_files;
  // Entries that did not read are counted by Load, which finds their access entries alone.
}

absl::Status ArtifactStore::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  lru_.clear();
  next_access_ = 1;
  stats_.bytes = 0;
  // Every block of both families is read, and so checked: the paranoid scan at start. It does
  // not fill the block cache, which is for what clients ask for.
  rocksdb::ReadOptions scan;
  scan.fill_cache = false;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(scan, db_.handles[kRecords]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      entries_[it->key().ToString()].size = it->key().size() + it->value().size();
    }
    if (!it->status().ok()) return FromRocks(it->status());
  }
  std::vector<std::string> stale;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_.db->NewIterator(scan, db_.handles[kAccess]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto e = entries_.find(it->key().ToString());
      if (e == entries_.end()) {
        stale.push_back(it->key().ToString());
        continue;
      }
      e->second.access = DecodeSeq(it->value().ToStringView());
      if (e->second.access >= next_access_) next_access_ = e->second.access + 1;
    }
    if (!it->status().ok()) return FromRocks(it->status());
  }
  // A record and its access entry are written and deleted in one batch: an access entry alone
  // is a record lost with a damaged file.
  if (!stale.empty()) {
    spdlog::warn("artifact database {}: {} entries were lost with damaged files", options_.path,
                 stale.size());
    stats_.corrupt += stale.size();
  }
  for (const auto& key : stale) {
    db_.db->Delete(rocksdb::WriteOptions(), db_.handles[kAccess], key).PermitUncheckedError();
  }
  // An entry without an access record (a crash between writes) counts as just used.
  for (auto& [key, entry] : entries_) {
    if (entry.access == 0) entry.access = next_access_++;
    lru_[entry.access] = key;
    stats_.bytes += entry.size;
  }
  stats_.entries = entries_.size();
  EvictLocked("");
  return absl::OkStatus();
}

void ArtifactStore::RecoverLocked(const absl::Status& why) {
  spdlog::warn("artifact database {}: {}; checking its files", options_.path, why.ToString());
  RecoveryReport report;
  const rocksdb::DBOptions db_options = DatabaseOptions(options_.max_bytes);
  const auto families = Families(options_.max_bytes);
  absl::Status s =
      SetAsideDamagedFiles(options_.path, db_options, families, kRecords, kAccess, &db_, &report);
  AddReport(report);
  if (s.ok()) s = Load();
  if (!s.ok()) {
    RecoveryReport last_resort;
    if (ReplaceWithEmpty(options_.path, db_options, families, s.ToString(), &db_, &last_resort)
            .ok()) {
      Load().IgnoreError();  // an empty database
    }
    AddReport(last_resort);
  }
  if (db_.db == nullptr) {
    spdlog::error("artifact database {}: unusable; serving without a local cache", options_.path);
  }
}

void ArtifactStore::RequestRecovery() {
  recovery_requested_ = true;
  work_cv_.notify_all();
}

void ArtifactStore::Background() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || compact_requested_ || recovery_requested_; });
    if (stopping_) return;
    const bool recover = recovery_requested_;
    const bool compact = compact_requested_;
    recovery_requested_ = compact_requested_ = false;
    working_ = true;
    lock.unlock();
    if (recover) {
      std::unique_lock<std::shared_mutex> db_lock(db_mu_);
      RecoverLocked(absl::DataLossError("a read met a damaged block"));
    }
    if (compact) {
      if (absl::Status s = Compact(); !s.ok()) {
        spdlog::warn("artifact database {}: compaction after evictions: {}", options_.path,
                     s.ToString());
      }
    }
    lock.lock();
    working_ = false;
    work_cv_.notify_all();
  }
}

void ArtifactStore::WaitForBackgroundWork() {
  std::unique_lock<std::mutex> lock(mu_);
  work_cv_.wait(lock, [this] {
    return stopping_ || (!compact_requested_ && !recovery_requested_ && !working_);
  });
}

absl::Status ArtifactStore::Compact() {
  std::shared_lock<std::shared_mutex> db_lock(db_mu_);
  if (db_.db == nullptr) return absl::UnavailableError("no artifact database");
  rocksdb::CompactRangeOptions options;
  // Down to the last level even when it is the only one: deleted data goes only there.
  options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  for (rocksdb::ColumnFamilyHandle* family : db_.handles) {
    rocksdb::Status s = db_.db->CompactRange(options, family, nullptr, nullptr);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (s.IsCorruption()) RequestRecovery();
      return FromRocks(s);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.compactions;
  return absl::OkStatus();
}

void ArtifactStore::Touch(const std::string& key, Entry& entry) {
  lru_.erase(entry.access);
  entry.access = next_access_++;
  lru_[entry.access] = key;
  // Losing an access update in a crash only makes the LRU order slightly stale.
  db_.db->Put(rocksdb::WriteOptions(), db_.handles[kAccess], key, EncodeSeq(entry.access))
      .PermitUncheckedError();
}

absl::StatusOr<std::string> ArtifactStore::Get(std::string_view key_view) {
  std::string key(key_view);
  std::shared_lock<std::shared_mutex> db_lock(db_mu_);
  if (db_.db == nullptr) return absl::UnavailableError("no artifact database");
  std::string record;
  rocksdb::Status s = db_.db->Get(rocksdb::ReadOptions(), db_.handles[kRecords], key, &record);
  if (s.IsNotFound()) return absl::NotFoundError("no artifact under this key");
  if (!s.ok() && !s.IsCorruption()) return FromRocks(s);
  absl::StatusOr<std::string> payload =
      s.ok() ? DecodeRecord(record) : absl::StatusOr<std::string>(FromRocks(s));
  std::lock_guard<std::mutex> lock(mu_);
  if (!payload.ok()) {
    ++stats_.corrupt;
    DeleteLocked(key).IgnoreError();
    // A block that fails its checksum stays in its file: set the file aside before a
    // compaction meets it (which would stop every write).
    if (s.IsCorruption()) RequestRecovery();
    return absl::DataLossError(
        absl::StrCat("corrupt artifact record for ", key, ": ", payload.status().message()));
  }
  auto it = entries_.find(key);
  if (it != entries_.end()) Touch(key, it->second);
  return payload;
}

absl::Status ArtifactStore::Put(std::string_view key_view, std::string_view payload) {
  std::string key(key_view);
  std::string record = EncodeRecord(payload);
  std::shared_lock<std::shared_mutex> db_lock(db_mu_);
  if (db_.db == nullptr) return absl::UnavailableError("no artifact database");
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = entries_[key];
  const uint64_t old_size = entry.size;
  const uint64_t old_access = entry.access;
  const uint64_t access = next_access_++;
  rocksdb::WriteBatch batch;
  batch.Put(db_.handles[kRecords], key, record);
  batch.Put(db_.handles[kAccess], key, EncodeSeq(access));
  // A compile costs seconds; an fsync of its artifact costs milliseconds. Synced, the artifact
  // survives a power cut as well as kill -9 (which the WAL alone already survives).
  rocksdb::WriteOptions durable;
  durable.sync = true;
  rocksdb::Status s = db_.db->Write(durable, &batch);
  if (!s.ok()) {
    if (old_size == 0) entries_.erase(key);
    // A compaction that met a damaged block stops writes with its error until recovery.
    if (s.IsCorruption()) RequestRecovery();
    return FromRocks(s);
  }
  if (old_access != 0) lru_.erase(old_access);
  entry.access = access;
  entry.size = key.size() + record.size();
  lru_[access] = key;
  stats_.bytes = stats_.bytes - old_size + entry.size;
  stats_.entries = entries_.size();
  EvictLocked(key);
  return absl::OkStatus();
}

absl::Status ArtifactStore::Delete(std::string_view key) {
  std::shared_lock<std::shared_mutex> db_lock(db_mu_);
  if (db_.db == nullptr) return absl::UnavailableError("no artifact database");
  std::lock_guard<std::mutex> lock(mu_);
  return DeleteLocked(std::string(key));
}

absl::Status ArtifactStore::DeleteLocked(const std::string& key) {
  rocksdb::WriteBatch batch;
  batch.Delete(db_.handles[kRecords], key);
  batch.Delete(db_.handles[kAccess], key);
  rocksdb::Status s = db_.db->Write(rocksdb::WriteOptions(), &batch);
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    lru_.erase(it->second.access);
    stats_.bytes -= it->second.size;
    entries_.erase(it);
    stats_.entries = entries_.size();
  }
  return FromRocks(s);
}

void ArtifactStore::EvictLocked(const std::string& keep) {
  auto it = lru_.begin();
  while (stats_.bytes > options_.max_bytes && it != lru_.end()) {
    if (it->second == keep) {
      ++it;
      continue;
    }
    std::string victim = it->second;
    const uint64_t size = entries_[victim].size;
    ++it;  // DeleteLocked erases the victim's lru_ node; advance first.
    if (DeleteLocked(victim).ok()) {
      ++stats_.evictions;
      evicted_since_compaction_ += size;
    }
  }
  // Deleted entries leave the disk only when compacted away.
  if (evicted_since_compaction_ >= std::max<uint64_t>(options_.max_bytes / 4, 1)) {
    evicted_since_compaction_ = 0;
    compact_requested_ = true;
    work_cv_.notify_all();
  }
}

ArtifactStoreStats ArtifactStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kiln::cache
