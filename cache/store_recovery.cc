// OpenOrRecover, SetAsideDamagedFiles and ReplaceWithEmpty over RocksDB's own tools: the
// write-ahead log recovery modes, RepairDB and per-file checksum verification.
#include "cache/store_recovery.h"

#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kiln::cache {
namespace {

namespace fs = std::filesystem;

std::string DamagedDir(const std::string& path) { return path + ".damaged"; }

rocksdb::Status TryOpen(const std::string& path, const rocksdb::DBOptions& options,
                        rocksdb::WALRecoveryMode wal_mode,
                        const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                        OpenDatabase* db) {
  rocksdb::DBOptions with_mode = options;
  with_mode.wal_recovery_mode = wal_mode;
  return rocksdb::DB::Open(with_mode, path, families, &db->handles, &db->db);
}

// Failures that say nothing about the database's contents: moving it aside would throw away a
// healthy cache for a full disk or a lock another process holds.
bool IsEnvironmentFailure(const rocksdb::Status& s) {
  return s.IsNoSpace() || s.IsBusy() || s.IsTimedOut() ||
         (s.IsIOError() && s.ToString().find("lock") != std::string::npos);
}

// Removes what an earlier recovery set aside and makes the folder anew, 0700.
absl::Status FreshDamagedDir(const std::string& path) {
  std::error_code ec;
  fs::remove_all(DamagedDir(path), ec);
  if (!fs::create_directory(DamagedDir(path), ec) || ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", DamagedDir(path), ": ", ec ? ec.message() : "exists"));
  }
  fs::permissions(DamagedDir(path), fs::perms::owner_all, ec);
  return absl::OkStatus();
}

// RepairDB leaves the files it could not use in <path>/lost; they go with the rest of what was
// set aside, so that the database folder holds only what is live.
void MoveLostFiles(const std::string& path) {
  std::error_code ec;
  const fs::path lost = fs::path(path) / "lost";
  if (!fs::exists(lost, ec)) return;
  if (!fs::exists(DamagedDir(path), ec) && !FreshDamagedDir(path).ok()) return;
  fs::rename(lost, fs::path(DamagedDir(path)) / "lost", ec);
  if (ec) fs::remove_all(lost, ec);
}

absl::Status Repair(const std::string& path, const rocksdb::DBOptions& options,
                    const std::vector<rocksdb::ColumnFamilyDescriptor>& families, OpenDatabase* db,
                    RecoveryReport* report) {
  rocksdb::Status s = rocksdb::RepairDB(path, options, families);
  if (s.ok()) {
    // The repaired database's logs were turned into tables; replay leniently all the same.
    s = TryOpen(path, options, rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords, families, db);
  }
  MoveLostFiles(path);
  if (!s.ok()) return absl::DataLossError(s.ToString());
  report->repaired = true;
  report->events.push_back("RepairDB rebuilt the database from the files that read");
  return absl::OkStatus();
}

}  // namespace

void OpenDatabase::Close() {
  if (db == nullptr) return;
  for (rocksdb::ColumnFamilyHandle* h : handles) db->DestroyColumnFamilyHandle(h);
  handles.clear();
  db->Close().PermitUncheckedError();
  delete db;
  db = nullptr;
}

absl::Status ReplaceWithEmpty(const std::string& path, const rocksdb::DBOptions& options,
                              const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                              const std::string& why, OpenDatabase* db, RecoveryReport* report) {
  db->Close();
  std::error_code ec;
  fs::remove_all(DamagedDir(path), ec);
  fs::rename(path, DamagedDir(path), ec);
  if (ec) fs::remove_all(path, ec);  // cannot keep it: at least do not serve it
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot move the damaged database ", path, " aside: ", ec.message()));
  }
  report->moved_aside = true;
  report->events.push_back(
      absl::StrCat("moved the database aside to ", DamagedDir(path), " (", why, ")"));
  rocksdb::Status s =
      TryOpen(path, options, rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords, families, db);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot create an artifact database at ", path, ": ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status OpenOrRecover(const std::string& path, const rocksdb::DBOptions& options,
                           const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                           OpenDatabase* db, RecoveryReport* report) {
  // A torn last record is what kill -9 or a power cut leaves, not damage; a bad record before
  // the end is damage, and must be said, not silently cut at (RocksDB's default).
  rocksdb::Status s =
      TryOpen(path, options, rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords, families, db);
  if (s.ok()) return absl::OkStatus();
  if (IsEnvironmentFailure(s)) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", s.ToString()));
  }
  const std::string first_error = s.ToString();
  if (s.IsCorruption()) {
    rocksdb::Status lenient =
        TryOpen(path, options, rocksdb::WALRecoveryMode::kSkipAnyCorruptedRecords, families, db);
    if (lenient.ok()) {
      report->wal_damaged = true;
      report->events.push_back(absl::StrCat("write-ahead log damaged (", first_error,
                                            "): replayed the records that verify, dropped the "
                                            "damaged ones"));
      return absl::OkStatus();
    }
  }
  report->events.push_back(absl::StrCat("RocksDB cannot open the database: ", first_error));
  if (Repair(path, options, families, db, report).ok()) return absl::OkStatus();
  return ReplaceWithEmpty(path, options, families, first_error, db, report);
}

absl::Status SetAsideDamagedFiles(const std::string& path, const rocksdb::DBOptions& options,
                                  const std::vector<rocksdb::ColumnFamilyDescriptor>& families,
                                  size_t records, size_t keys, OpenDatabase* db,
                                  RecoveryReport* report) {
  std::vector<rocksdb::LiveFileMetaData> files;
  db->db->GetLiveFilesMetaData(&files);
  const rocksdb::Options file_options(options, rocksdb::ColumnFamilyOptions());
  std::vector<rocksdb::LiveFileMetaData> damaged;
  for (const rocksdb::LiveFileMetaData& file : files) {
    rocksdb::Status s = rocksdb::VerifySstFileChecksum(file_options, rocksdb::EnvOptions(),
                                                       file.db_path + file.name);
    if (s.ok()) continue;
    report->events.push_back(absl::StrCat("table file ", fs::path(file.name).filename().string(),
                                          " of '", file.column_family_name,
                                          "' is damaged: ", s.ToString()));
    damaged.push_back(file);
  }
  if (damaged.empty()) return absl::OkStatus();

  // Save what still reads. A key's value is read through the database, so the newest version
  // wins and a block that fails its checksum fails only the keys it holds.
  for (const rocksdb::LiveFileMetaData& file : damaged) {
    if (file.column_family_name != families[records].name) continue;
    rocksdb::ReadOptions scan;
    std::unique_ptr<rocksdb::Iterator> it(db->db->NewIterator(scan, db->handles[keys]));
    for (it->Seek(file.smallestkey); it->Valid() && it->key().compare(file.largestkey) <= 0;
         it->Next()) {
      std::string value;
      rocksdb::Status got =
          db->db->Get(rocksdb::ReadOptions(), db->handles[records], it->key(), &value);
      if (got.IsNotFound()) continue;
      if (!got.ok() ||
          !db->db->Put(rocksdb::WriteOptions(), db->handles[records], it->key(), value).ok()) {
        ++report->unreadable;
        continue;
      }
      ++report->salvaged;
    }
    if (!it->status().ok()) {
      report->events.push_back(absl::StrCat("enumerating the keys of ",
                                            fs::path(file.name).filename().string(),
                                            " stopped early: ", it->status().ToString()));
    }
  }
  // What was written again goes to new table files before the old ones leave.
  rocksdb::FlushOptions flush;
  flush.wait = true;
  if (rocksdb::Status s = db->db->Flush(flush, db->handles); !s.ok()) {
    report->events.push_back(absl::StrCat("flush after salvage failed: ", s.ToString()));
  }
  db->Close();

  if (absl::Status s = FreshDamagedDir(path); !s.ok()) return s;
  for (const rocksdb::LiveFileMetaData& file : damaged) {
    std::error_code ec;
    fs::rename(fs::path(file.db_path) / fs::path(file.name).relative_path(),
               fs::path(DamagedDir(path)) / fs::path(file.name).filename(), ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot set aside damaged table file ", file.name, ": ", ec.message()));
    }
    ++report->damaged_files;
  }
  report->events.push_back(absl::StrCat("set aside ", damaged.size(), " damaged table file(s) in ",
                                        DamagedDir(path), "; ", report->salvaged, " entries kept, ",
                                        report->unreadable, " unreadable"));
  if (absl::Status s = Repair(path, options, families, db, report); !s.ok()) {
    return ReplaceWithEmpty(path, options, families, std::string(s.message()), db, report);
  }
  return absl::OkStatus();
}

}  // namespace kiln::cache
