// The local artifact store: a RocksDB database of framed records under a byte-size limit.
//
// Contract:
//  - Get returns exactly the bytes a Put stored, or NotFound. A record that fails its framing
//    check (truncated, bit-flipped) is deleted and reported as DataLoss, so the caller recompiles.
//  - A Put that returned OK is in the synced write-ahead log: it survives kill -9 and power loss.
//  - When the stored bytes exceed max_bytes, the least recently used entries (by Get or Put) are
//    evicted; the entry just written is never the one evicted. Access order lives in its own
//    column family so that reads do not rewrite artifacts.
//  - Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace kiln::cache {

struct ArtifactStoreOptions {
  std::string path;                        // Directory of the RocksDB database.
  uint64_t max_bytes = uint64_t{4} << 30;  // Limit on keys + framed values.
};

struct ArtifactStoreStats {
  uint64_t bytes = 0;      // Keys + framed values now stored.
  uint64_t entries = 0;    // Artifacts now stored.
  uint64_t evictions = 0;  // Entries evicted since Open.
  uint64_t corrupt = 0;    // Corrupt records found and deleted since Open.
};

class ArtifactStore {
 public:
  // Column families, named here so that tools (and tests) can open the database directly.
  static constexpr const char* kRecordsFamily = "default";
  static constexpr const char* kAccessFamily = "access";

  // Opens (creating if missing) the database at options.path.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(const ArtifactStoreOptions& options);
  ~ArtifactStore();

  ArtifactStore(const ArtifactStore&) = delete;
  ArtifactStore& operator=(const ArtifactStore&) = delete;

  // Returns the payload stored under `key`; NotFound; or DataLoss (the record was deleted).
  absl::StatusOr<std::string> Get(std::string_view key);
  // Stores `payload` under `key`, replacing any previous value, then evicts down to the limit.
  absl::Status Put(std::string_view key, std::string_view payload);
  // Removes `key` if present.
  absl::Status Delete(std::string_view key);

  ArtifactStoreStats Stats() const;

 private:
  struct Entry {
    uint64_t size = 0;
    uint64_t access = 0;
  };

  ArtifactStore(ArtifactStoreOptions options, rocksdb::DB* db,
                std::vector<rocksdb::ColumnFamilyHandle*> handles);
  absl::Status Load();
  // All below require mu_.
  void Touch(const std::string& key, Entry& entry);
  absl::Status DeleteLocked(const std::string& key);
  void EvictLocked(const std::string& keep);

  const ArtifactStoreOptions options_;
  rocksdb::DB* db_;
  rocksdb::ColumnFamilyHandle* records_;
  rocksdb::ColumnFamilyHandle* access_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::map<uint64_t, std::string> lru_;  // access sequence -> key, oldest first
  uint64_t next_access_ = 1;
  ArtifactStoreStats stats_;
};

}  // namespace kiln::cache
