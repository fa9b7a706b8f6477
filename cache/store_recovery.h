// Opening the artifact store's RocksDB database whatever a crash or a bad disk left in its
// directory. Nothing inside the directory is fatal: a damaged write-ahead log is replayed as far
// as its records verify, a database RocksDB cannot open is repaired (RepairDB) or, failing that,
// moved aside for an empty one, and table files whose blocks fail their checksums are set aside
// after the entries that still read have been written again. Every step is reported.
//
// What is set aside goes to "<path>.damaged" (the previous recovery's leftovers are removed
// first, so at most one copy is kept), for a person to look at; kilnd never reads it again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
struct ColumnFamilyDescriptor;
struct DBOptions;
}  // namespace rocksdb

namespace kiln::cache {

// What recovery found and did. Counts are per recovery; the store sums them into its stats.
struct RecoveryReport {
  bool wal_damaged = false;    // The write-ahead log held damaged records; intact ones replayed.
  bool repaired = false;       // RepairDB rebuilt the database's metadata from its files.
  bool moved_aside = false;    // Unusable: moved to <path>.damaged, an empty database made.
  uint64_t damaged_files = 0;  // Table files that failed their checksums, set aside.
  uint64_t salvaged = 0;       // Entries of damaged files that still read, written again.
  uint64_t unreadable = 0;     // Entries of damaged files that did not read (dropped).
  std::vector<std::string> events;  // What happened and why, in order, for the log.

  bool clean() const { return events.empty(); }
};

// An open RocksDB database and its column family handles, in the order they were asked for.
struct OpenDatabase {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;

  // Releases the handles and closes the database; a no-op when none is open.
  void Close();
};

// Opens (creating if missing) the database at `path` with `families`, recovering as the file
// comment says. Fails only when the directory cannot be used at all (permissions on the parent,
// a full disk), with the reason.
absl::Status OpenOrRecover(const std::string& path, const rocksdb::DBOptions& options,
                           const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                           OpenDatabase* db, RecoveryReport* report);

// Closes `db` if open, moves the database at `path` aside and opens an empty one in its place:
// the last resort when what is there cannot be read even after SetAsideDamagedFiles.
absl::Status ReplaceWithEmpty(const std::string& path, const rocksdb::DBOptions& options,
                              const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                              const std::string& why, OpenDatabase* db, RecoveryReport* report);

// For an open database whose reads met corruption: checks every live table file's checksums,
// reads back each key in a damaged file's range of family `records` (the keys are enumerated
// from family `keys`, which names the same keys; one whose read fails is dropped) and writes
// what reads again, then closes the database, sets the damaged files aside, rebuilds it with
// RepairDB and opens it again into `db`. When no file fails its checksum, changes nothing.
absl::Status SetAsideDamagedFiles(const std::string& path, const rocksdb::DBOptions& options,
                                  const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                                  size_t records, size_t keys, OpenDatabase* db,
                                  RecoveryReport* report);

}  // namespace kiln::cache
