// Instruction decoding for CPython 3.11 and 3.12 code objects: opcodes, full arguments
// (EXTENDED_ARG folded in), resolved argument values (names, constants, jump targets), and the
// line each instruction starts, and the exception table. The opcode tables are the running
// interpreter's own (`dis` and `opcode`), so one build serves either version.
#ifndef KILN_BYTECODE_INSTRUCTIONS_H_
#define KILN_BYTECODE_INSTRUCTIONS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "bytecode/exception_table.h"

namespace kiln::bytecode {

struct Instruction {
  int opcode = 0;
  int arg = -1;         // -1: the opcode takes no argument
  int offset = 0;       // in bytes
  int starts_line = 0;  // the source line that starts here, 0 when none does
  int target = -1;      // index of the jump target in Decoded::instructions, -1 if not a jump
  int next_offset = 0;  // offset of the next instruction (CACHE entries skipped)
  // The resolved argument as `dis` gives it: a name, a constant, a comparison, a jump target's
  // offset; the argument itself for the rest. Borrowed from Decoded::values.
  PyObject* argval = nullptr;
};

// One code object's instructions (CACHE entries dropped), kept for the process's lifetime.
struct Decoded {
  pybind11::object code;
  std::vector<Instruction> instructions;
  std::unordered_map<int, int> index_of_offset;
  std::vector<pybind11::object> values;  // owns every argval
  std::vector<ExceptionEntry> exception_table;

  int IndexOf(int offset) const;  // -1 when no instruction starts at `offset`
  // The exception table's entry covering the instruction at byte `offset`, or null.
  const ExceptionEntry* HandlerAt(int offset) const;
  // Where every handler covering byte `offset` is a `with` block's cleanup: the value-stack
  // positions of those blocks' __exit__, innermost first (empty outside every handler); nullopt
  // where some handler is another kind (a try's except or finally).
  std::optional<std::vector<int>> WithBlockExits(int offset) const;
};

// The decoded instructions of `code` (cached per code object). Raises TypeError for a non-code
// object.
const Decoded& Decode(pybind11::handle code);

// The interpreter's name of `opcode` ("LOAD_FAST", ...), interned.
const pybind11::str& OpName(int opcode);

// A kiln._C.Instruction for Python (what a graph break reports).
pybind11::object InstructionObject(const Instruction& instruction);

// Registers kiln._C.Instruction, kiln._C.instructions(code) and
// kiln._C.exception_table(co_exceptiontable).
void RegisterPython(pybind11::module_& m);

}  // namespace kiln::bytecode

#endif  // KILN_BYTECODE_INSTRUCTIONS_H_
