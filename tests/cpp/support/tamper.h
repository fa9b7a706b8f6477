// Damaging an artifact database behind the store's back, as a disk or a bad actor would. The
// database must not be open in this process when these run.
#pragma once

#include <rocksdb/db.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cache/artifact_store.h"

namespace kiln::testing {

// Calls `edit` on every stored record (key, value) and writes back what it leaves in `value`.
// Returns the number of records visited.
inline int EditRecords(const std::string& db_path,
                       const std::function<void(const std::string&, std::string&)>& edit) {
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {cache::ArtifactStore::kRecordsFamily, rocksdb::ColumnFamilyOptions()},
      {cache::ArtifactStore::kAccessFamily, rocksdb::ColumnFamilyOptions()}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::Open(rocksdb::DBOptions(), db_path, families, &handles, &db).ok()) return -1;
  std::vector<std::pair<std::string, std::string>> records;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[0]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      records.emplace_back(it->key().ToString(), it->value().ToString());
    }
  }
  for (auto& [key, value] : records) {
    edit(key, value);
    db->Put(rocksdb::WriteOptions(), handles[0], key, value);
  }
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
  db->Close();
  delete db;
  return static_cast<int>(records.size());
}

// Flips one bit of the byte at `fraction` of the file's length; returns the offset.
inline long FlipByte(const std::string& path, double fraction) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const long offset = static_cast<long>(static_cast<double>(f.tellg()) * fraction);
  char c = 0;
  f.seekg(offset);
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(offset);
  f.write(&c, 1);
  return offset;
}

// The largest file in `dir` whose name ends in `suffix` (".sst": the records' table file, the
// access family's are tiny; ".log": the write-ahead log), or "".
inline std::string LargestFile(const std::string& dir, const std::string& suffix) {
  std::string best;
  uintmax_t best_size = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    if (e.file_size() >= best_size) {
      best = e.path().string();
      best_size = e.file_size();
    }
  }
  return best;
}

// The bytes of every regular file under `dir`.
inline uintmax_t DirectoryBytes(const std::string& dir) {
  uintmax_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) total += e.file_size();
  }
  return total;
}

}  // namespace kiln::testing
