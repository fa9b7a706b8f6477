// ArtifactStore over RocksDB: records in the default column family, last-access sequence
// numbers in "access", an in-memory index of both rebuilt on Open.
#include "cache/artifact_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"
#include "cache/record.h"

namespace kiln::cache {
namespace {

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

}  // namespace

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(
    const ArtifactStoreOptions& options) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_open_files = 256;
  rocksdb::ColumnFamilyOptions cf_options;
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {{kRecordsFamily, cf_options},
                                                           {kAccessFamily, cf_options}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, families, &handles, &db);
  if (!s.ok()) return FromRocks(s);
  std::unique_ptr<ArtifactStore> store(new ArtifactStore(options, db, std::move(handles)));
  if (absl::Status st = store->Load(); !st.ok()) return st;
  return store;
}

ArtifactStore::ArtifactStore(ArtifactStoreOptions options, rocksdb::DB* db,
                             std::vector<rocksdb::ColumnFamilyHandle*> handles)
    : options_(std::move(options)), db_(db), records_(handles[0]), access_(handles[1]) {}

ArtifactStore::~ArtifactStore() {
  db_->DestroyColumnFamilyHandle(records_);
  db_->DestroyColumnFamilyHandle(access_);
  db_->Close();
  delete db_;
}

absl::Status ArtifactStore::Load() {
  std::lock_guard<std::mutex> lock(mu_);
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), records_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      entries_[it->key().ToString()].size = it->key().size() + it->value().size();
    }
    if (!it->status().ok()) return FromRocks(it->status());
  }
  std::vector<std::string> stale;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), access_));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      auto e = entries_.find(it->key().ToString());
      if (e == entries_.end()) {
        stale.push_back(it->key().ToString());  // a crash between the two deletes of an eviction
        continue;
      }
      e->second.access = DecodeSeq(it->value().ToStringView());
      if (e->second.access >= next_access_) next_access_ = e->second.access + 1;
    }
    if (!it->status().ok()) return FromRocks(it->status());
  }
  for (const auto& key : stale) db_->Delete(rocksdb::WriteOptions(), access_, key);
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

void ArtifactStore::Touch(const std::string& key, Entry& entry) {
  lru_.erase(entry.access);
  entry.access = next_access_++;
  lru_[entry.access] = key;
  // Losing an access update in a crash only makes the LRU order slightly stale.
  db_->Put(rocksdb::WriteOptions(), access_, key, EncodeSeq(entry.access));
}

absl::StatusOr<std::string> ArtifactStore::Get(std::string_view key_view) {
  std::string key(key_view);
  std::string record;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), records_, key, &record);
  if (s.IsNotFound()) return absl::NotFoundError("no artifact under this key");
  if (!s.ok() && !s.IsCorruption()) return FromRocks(s);
  absl::StatusOr<std::string> payload =
      s.ok() ? DecodeRecord(record) : absl::StatusOr<std::string>(FromRocks(s));
  std::lock_guard<std::mutex> lock(mu_);
  if (!payload.ok()) {
    ++stats_.corrupt;
    DeleteLocked(key).IgnoreError();
    return absl::DataLossError(absl::StrCat("stored artifact was corrupt and has been dropped: ",
                                            payload.status().message()));
  }
  auto it = entries_.find(key);
  if (it != entries_.end()) Touch(key, it->second);
  return payload;
}

absl::Status ArtifactStore::Put(std::string_view key_view, std::string_view payload) {
  std::string key(key_view);
  std::string record = EncodeRecord(payload);
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = entries_[key];
  const uint64_t old_size = entry.size;
  const uint64_t old_access = entry.access;
  const uint64_t access = next_access_++;
  rocksdb::WriteBatch batch;
  batch.Put(records_, key, record);
  batch.Put(access_, key, EncodeSeq(access));
  // A compile costs seconds; an fsync of its artifact costs milliseconds. Synced, the artifact
  // survives a power cut as well as kill -9 (which the WAL alone already survives).
  rocksdb::WriteOptions durable;
  durable.sync = true;
  rocksdb::Status s = db_->Write(durable, &batch);
  if (!s.ok()) {
    if (old_size == 0) entries_.erase(key);
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
  std::lock_guard<std::mutex> lock(mu_);
  return DeleteLocked(std::string(key));
}

absl::Status ArtifactStore::DeleteLocked(const std::string& key) {
  rocksdb::WriteBatch batch;
  batch.Delete(records_, key);
  batch.Delete(access_, key);
  rocksdb::Status s = db_->Write(rocksdb::WriteOptions(), &batch);
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
    ++it;  // DeleteLocked erases the victim's lru_ node; advance first.
    if (DeleteLocked(victim).ok()) ++stats_.evictions;
  }
}

ArtifactStoreStats ArtifactStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kiln::cache
