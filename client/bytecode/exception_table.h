// The exception table of a CPython 3.11/3.12 code object (co_exceptiontable): which handler an
// exception raised at each instruction goes to (CPython's Objects/exception_handling_notes.txt).
#ifndef KILN_BYTECODE_EXCEPTION_TABLE_H_
#define KILN_BYTECODE_EXCEPTION_TABLE_H_

#include <string_view>
#include <vector>

namespace kiln::bytecode {

// One entry: an exception raised by an instruction in [start, end) goes to `target`, which
// CPython enters with the value stack popped to `depth` entries, then the raising instruction's
// offset in code units pushed where `lasti` says so, then the exception. Offsets are in bytes.
struct ExceptionEntry {
  int start = 0;
  int end = 0;
  int target = 0;
  int depth = 0;
  bool lasti = false;
};

// The entries of a co_exceptiontable in table order (ascending, none overlapping). A table cut
// short inside an entry yields the entries before it.
std::vector<ExceptionEntry> ParseExceptionTable(std::string_view table);

// The entry that covers the instruction at byte `offset`, or null where none does (the exception
// leaves the frame): what CPython's get_exception_handler finds.
const ExceptionEntry* HandlerAt(const std::vector<ExceptionEntry>& table, int offset);

}  // namespace kiln::bytecode

#endif  // KILN_BYTECODE_EXCEPTION_TABLE_H_
