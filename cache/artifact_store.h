// The local artifact store: a RocksDB database of framed records under a byte-size limit.
//
// Contract:
//  - Get returns exactly the bytes a Put stored, or NotFound. A record that fails its framing
//    check or RocksDB's block checksum (truncated, bit-flipped) is deleted and reported as
//    DataLoss, so the caller recompiles; the table file that held a damaged block is then set
//    aside in the background (see store_recovery.h), the entries that still read kept.
//  - Open never fails because of what is in the database folder: a damaged write-ahead log,
//    MANIFEST or table file is recovered from (what verifies is served, what does not is
//    dropped and counted in Stats), and a database RocksDB cannot open even after RepairDB is
//    moved aside for an empty one. Every recovery is logged with its reason. Open fails only
//    when the folder cannot be used at all, or another process has the store open.
//  - A Put that returned OK is in the synced write-ahead log: it survives kill -9 and power loss.
//  - When the stored bytes exceed max_bytes, the least recently used entries (by Get or Put) are
//    evicted; the entry just written is never the one evicted. Once evictions have deleted a
//    quarter of max_bytes, the store compacts in the background so that the disk (and the write
//    buffer's memory) is freed too, not only the index. Access order lives in its own column
//    family so that reads do not rewrite artifacts.
//  - Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cache/store_recovery.h"

namespace kiln::cache {

struct ArtifactStoreOptions {
  std::string path;                        // Directory of the RocksDB database.
  uint64_t max_bytes = uint64_t{4} << 30;  // Limit on keys + framed values.
};

struct ArtifactStoreStats {
  uint64_t bytes = 0;          // Keys + framed values now stored.
  uint64_t entries = 0;        // Artifacts now stored.
  uint64_t evictions = 0;      // Entries evicted since Open.
  uint64_t corrupt = 0;        // Damaged records found and dropped since Open.
  uint64_t damaged_files = 0;  // Table files set aside for failing their checksums.
  uint64_t wal_damaged = 0;    // Opens that found the write-ahead log damaged.
  uint64_t repairs = 0;        // Times the database was rebuilt (RepairDB) or moved aside.
  uint64_t compactions = 0;    // Compactions run to free what evictions deleted.
};

class ArtifactStore {
 public:
  // Column families, named here so that tools (and tests) can open the database directly.
  static constexpr const char* kRecordsFamily = "default";
  static constexpr const char* kAccessFamily = "access";

  // Opens (creating if missing, recovering if damaged) the database at options.path.
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
  // Compacts both column families now, dropping deleted and evicted data from disk.
  absl::Status Compact();
  // Waits until the background work asked for so far (compaction, setting aside damaged
  // files) is done. For tests and orderly shutdown.
  void WaitForBackgroundWork();

  ArtifactStoreStats Stats() const;

 private:
  struct Entry {
    uint64_t size = 0;
    uint64_t access = 0;
  };

  explicit ArtifactStore(ArtifactStoreOptions options);
  // Rebuilds the index from both column families; DataLoss when a read met corruption.
  absl::Status Load();
  // Sets aside damaged files and reloads the index; the last resort is an empty database.
  // Requires db_mu_ held exclusively.
  void RecoverLocked(const absl::Status& why);
  void AddReport(const RecoveryReport& report);
  void Background();
  void RequestRecovery();
  // All below require mu_.
  void Touch(const std::string& key, Entry& entry);
  absl::Status DeleteLocked(const std::string& key);
  void EvictLocked(const std::string& keep);

  const ArtifactStoreOptions options_;
  int lock_fd_ = -1;

  // Guards the database handle: shared by every read and write, exclusive while recovery
  // closes and reopens it.
  mutable std::shared_mutex db_mu_;
  OpenDatabase db_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::map<uint64_t, std::string> lru_;  // access sequence -> key, oldest first
  uint64_t next_access_ = 1;
  uint64_t evicted_since_compaction_ = 0;
  ArtifactStoreStats stats_;

  // Background work: one thread, woken for compaction after evictions and for recovery after a
  // read met a damaged block.
  std::condition_variable work_cv_;
  bool compact_requested_ = false;
  bool recovery_requested_ = false;
  bool working_ = false;
  bool stopping_ = false;
  std::thread background_;
};

}  // namespace kiln::cache
