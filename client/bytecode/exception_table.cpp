// Reading co_exceptiontable: entries of four varints (start, length, target, depth << 1 | lasti)
// in code units, six bits a byte, bit 6 continuing a number and bit 7 marking an entry's start.
#include "bytecode/exception_table.h"

#include <cstdint>

namespace kiln::bytecode {
namespace {

bool ReadVarint(std::string_view table, size_t& i, int& out) {
  if (i >= table.size()) return false;
  uint8_t b = static_cast<uint8_t>(table[i++]);
  int value = b & 63;
  while (b & 64) {
    if (i >= table.size()) return false;
    b = static_cast<uint8_t>(table[i++]);
    value = (value << 6) | (b & 63);
  }
  out = value;
  return true;
}

}  // namespace

std::vector<ExceptionEntry> ParseExceptionTable(std::string_view table) {
  std::vector<ExceptionEntry> entries;
  size_t i = 0;
  while (i < table.size()) {
    int start, length, target, depth_lasti;
    if (!ReadVarint(table, i, start) || !ReadVarint(table, i, length) ||
        !ReadVarint(table, i, target) || !ReadVarint(table, i, depth_lasti)) {
      break;
    }
    entries.push_back(ExceptionEntry{2 * start, 2 * (start + length), 2 * target, depth_lasti >> 1,
                                     (depth_lasti & 1) != 0});
  }
  return entries;
}

const ExceptionEntry* HandlerAt(const std::vector<ExceptionEntry>& table, int offset) {
  for (const ExceptionEntry& entry : table) {
    if (offset < entry.start) return nullptr;  // ascending: no later entry starts before it
    if (offset < entry.end) return &entry;
  }
  return nullptr;
}

}  // namespace kiln::bytecode
