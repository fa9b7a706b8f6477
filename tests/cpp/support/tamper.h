// Damaging an artifact database behind the store's back, as a disk or a bad actor would. The
// database must not be open in this process when these run.
#pragma once

#include <rocksdb/db.h>

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

}  // namespace kiln::testing
