// Decoding of 3.11/3.12 bytecode, as `dis._get_instructions_bytes` reads it: co_code is the
// unspecialized bytecode, every instruction is two bytes followed by its inline CACHE entries.
#include "bytecode/instructions.h"

#include <array>
#include <mutex>

namespace py = pybind11;

namespace kiln::bytecode {
namespace {

// The running interpreter's opcode tables, read once from `dis` and `opcode`.
struct OpcodeTables {
  std::array<py::str, 256> names;
  std::array<int, 256> caches{};
  std::array<uint8_t, 256> kind{};  // one of the Kind values below
  std::array<bool, 256> backward{};
  py::tuple cmp_op;
  int have_argument = 90;
  int extended_arg = 144;
  int load_global = -1, load_attr = -1, load_super_attr = -1;
  bool py312 = false;
};

enum Kind : uint8_t { kPlain, kConst, kName, kJumpRelative, kJumpAbsolute, kLocal, kCompare };

// Built under the GIL without a function-local static (see client/capture/executor.cpp's
// OpTable: a static's guard must not be waited on while holding the GIL).
const OpcodeTables& Tables() {
  static OpcodeTables* built = nullptr;
  if (built != nullptr) return *built;
  OpcodeTables* tables = [] {
    auto* t = new OpcodeTables();
    py::module_ dis = py::module_::import("dis");
    py::module_ opcode = py::module_::import("opcode");
    py::list names = dis.attr("opname");
    py::object caches = opcode.attr("_inline_cache_entries");
    for (int op = 0; op < 256; ++op) {
      t->names[op] = py::reinterpret_steal<py::str>(
          PyUnicode_InternFromString(py::str(names[op]).cast<std::string>().c_str()));
      t->caches[op] = caches[py::int_(op)].cast<int>();
      t->backward[op] = t->names[op].cast<std::string>().find("JUMP_BACKWARD") != std::string::npos;
    }
    auto mark = [&](const char* table, Kind kind) {
      for (py::handle op : dis.attr(table)) {
        int code = op.cast<int>();
        if (code >= 0 && code < 256) t->kind[code] = kind;
      }
    };
    mark("hasconst", kConst);
    mark("hasname", kName);
    mark("hasjrel", kJumpRelative);
    mark("hasjabs", kJumpAbsolute);
    mark("haslocal", kLocal);
    mark("hasfree", kLocal);
    mark("hascompare", kCompare);
    t->cmp_op = py::tuple(dis.attr("cmp_op"));
    t->have_argument = opcode.attr("HAVE_ARGUMENT").cast<int>();
    t->extended_arg = opcode.attr("EXTENDED_ARG").cast<int>();
    py::dict opmap = opcode.attr("opmap");
    auto op_of = [&](const char* name) {
      return opmap.contains(name) ? opmap[name].cast<int>() : -1;
    };
    t->load_global = op_of("LOAD_GLOBAL");
    t->load_attr = op_of("LOAD_ATTR");
    t->load_super_attr = op_of("LOAD_SUPER_ATTR");
    t->py312 = PY_VERSION_HEX >= 0x030C0000;
    return t;
  }();
  if (built == nullptr) built = tables;
  return *built;
}

std::shared_ptr<Decoded> DecodeUncached(py::handle code) {
  const OpcodeTables& t = Tables();
  auto d = std::make_shared<Decoded>();
  d->code = py::reinterpret_borrow<py::object>(code);
  py::bytes raw = code.attr("co_code");
  const std::string bytes = raw;
  py::tuple consts = code.attr("co_consts");
  py::tuple names = code.attr("co_names");
  py::object varname_from_oparg = code.attr("_varname_from_oparg");

  // Line starts, as dis.findlinestarts: the first offset of each new line.
  std::unordered_map<int, int> line_starts;
  {
    py::object last = py::none();
    for (py::handle entry : code.attr("co_lines")()) {
      py::tuple e = py::reinterpret_borrow<py::tuple>(entry);
      py::object line = e[2];
      if (!line.is_none() && !line.equal(last)) {
        last = line;
        line_starts.emplace(e[0].cast<int>(), line.cast<int>());
      }
    }
  }

  int extended = 0;
  int caches = 0;
  const int n = static_cast<int>(bytes.size());
  for (int i = 0; i + 1 < n; i += 2) {
    if (caches > 0) {
      --caches;
      continue;
    }
    Instruction inst;
    inst.offset = i;
    inst.opcode = static_cast<uint8_t>(bytes[i]);
    const int op = inst.opcode;
    caches = t.caches[op];
    if (op >= t.have_argument) {
      int arg = static_cast<uint8_t>(bytes[i + 1]) | extended;
      extended = op == t.extended_arg ? (arg << 8) : 0;
      inst.arg = arg;
    } else {
      extended = 0;
    }
    auto line = line_starts.find(i);
    if (line != line_starts.end()) inst.starts_line = line->second;

    py::object argval;
    const int arg = inst.arg;
    if (arg >= 0) {
      switch (t.kind[op]) {
        case kConst:
          argval = consts[arg];
          break;
        case kName: {
          int index = arg;
          if (op == t.load_global || (t.py312 && op == t.load_attr)) index = arg >> 1;
          if (op == t.load_super_attr) index = arg >> 2;
          argval = names[index];
          break;
        }
        case kJumpRelative: {
          const int signed_arg = t.backward[op] ? -arg : arg;
          int to = i + 2 + signed_arg * 2;
          if (t.py312) to += 2 * t.caches[op];
          argval = py::int_(to);
          break;
        }
        case kJumpAbsolute:
          argval = py::int_(arg * 2);
          break;
        case kLocal:
          argval = varname_from_oparg(arg);
          break;
        case kCompare:
          argval = t.cmp_op[t.py312 ? (arg >> 4) : arg];
          break;
        default:
          argval = py::int_(arg);
      }
    } else {
      argval = py::none();
    }
    inst.argval = argval.ptr();
    d->values.push_back(std::move(argval));
    d->index_of_offset.emplace(i, static_cast<int>(d->instructions.size()));
    d->instructions.push_back(inst);
  }
  d->exception_table = ParseExceptionTable(code.attr("co_exceptiontable").cast<std::string>());
  for (size_t k = 0; k < d->instructions.size(); ++k) {
    Instruction& inst = d->instructions[k];
    inst.next_offset = k + 1 < d->instructions.size() ? d->instructions[k + 1].offset : n;
    const Kind kind = static_cast<Kind>(t.kind[inst.opcode]);
    if (inst.arg >= 0 && (kind == kJumpRelative || kind == kJumpAbsolute)) {
      inst.target = d->IndexOf(static_cast<int>(PyLong_AsLong(inst.argval)));
    }
  }
  return d;
}

// A code object's instructions, for Python: what a graph break reports and tests inspect.
struct PyInstruction {
  int opcode;
  int arg;
  int offset;
  int starts_line;
  int next_offset;
  py::object argval;
};

}  // namespace

int Decoded::IndexOf(int offset) const {
  auto it = index_of_offset.find(offset);
  return it == index_of_offset.end() ? -1 : it->second;
}

const ExceptionEntry* Decoded::HandlerAt(int offset) const {
  return bytecode::HandlerAt(exception_table, offset);
}

// From the innermost, each `with` handler (PUSH_EXC_INFO, WITH_EXCEPT_START) is covered by a
// cleanup entry (COPY 3, POP_EXCEPT, RERAISE 1), and that cleanup by the enclosing block's entry;
// a block's entry unwinds the stack to the depth that has its __exit__ on top.
std::optional<std::vector<int>> Decoded::WithBlockExits(int offset) const {
  auto is = [this](int index, const char* name) {
    return OpName(instructions[index].opcode).cast<std::string>() == name;
  };
  std::vector<int> exits;
  for (const ExceptionEntry* entry = HandlerAt(offset); entry != nullptr;) {
    const int handler = IndexOf(entry->target);
    if (exits.size() > 32 || handler < 0 ||
        static_cast<size_t>(handler) + 1 >= instructions.size() ||
        !is(handler, "PUSH_EXC_INFO") || !is(handler + 1, "WITH_EXCEPT_START")) {
      return std::nullopt;
    }
    exits.push_back(entry->depth - 1);
    const ExceptionEntry* cleanup = HandlerAt(entry->target);
    if (cleanup == nullptr) return std::nullopt;
    entry = HandlerAt(cleanup->target);
  }
  return exits;
}

const py::str& OpName(int opcode) { return Tables().names[opcode & 0xFF]; }

const Decoded& Decode(py::handle code) {
  if (!PyCode_Check(code.ptr())) throw py::type_error("expected a code object");
  // Code objects live as long as their entries: both are kept for the process, as CPython keeps
  // the code of every function that was ever compiled by kiln alive in its cache entries.
  static std::mutex mu;
  static auto* cache = new std::unordered_map<PyObject*, std::shared_ptr<Decoded>>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache->find(code.ptr());
    if (it != cache->end()) return *it->second;
  }
  std::shared_ptr<Decoded> d = DecodeUncached(code);
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = cache->emplace(code.ptr(), std::move(d));
  return *it->second;
}

void RegisterPython(py::module_& m) {
  py::class_<PyInstruction>(m, "Instruction",
                            "One decoded instruction (CACHE entries are not instructions).")
      .def_property_readonly("opname", [](const PyInstruction& i) { return OpName(i.opcode); })
      .def_readonly("opcode", &PyInstruction::opcode)
      .def_property_readonly("arg",
                             [](const PyInstruction& i) -> py::object {
                               return i.arg < 0 ? py::object(py::none())
                                                : py::object(py::int_(i.arg));
                             })
      .def_readonly("argval", &PyInstruction::argval)
      .def_readonly("offset", &PyInstruction::offset)
      .def_readonly("starts_line", &PyInstruction::starts_line)
      .def_readonly("next_offset", &PyInstruction::next_offset)
      .def("__repr__", [](const PyInstruction& i) {
        return "<Instruction " + OpName(i.opcode).cast<std::string>() + " " +
               std::to_string(i.arg) + " at " + std::to_string(i.offset) + ">";
      });
  m.def(
      "instructions",
      [](py::handle code) {
        const Decoded& d = Decode(code);
        py::list out;
        for (const Instruction& i : d.instructions) {
          out.append(PyInstruction{i.opcode, i.arg, i.offset, i.starts_line, i.next_offset,
                                   py::reinterpret_borrow<py::object>(i.argval)});
        }
        return out;
      },
      py::arg("code"), "The instructions of a code object as kiln's executor decodes them.");
  m.def(
      "with_exits",
      [](py::handle code, int offset) -> py::object {
        std::optional<std::vector<int>> exits = Decode(code).WithBlockExits(offset);
        if (!exits) return py::none();
        py::list out;
        for (int position : *exits) out.append(position);
        return std::move(out);
      },
      py::arg("code"), py::arg("offset"),
      "The value-stack positions of the __exit__ of the `with` blocks open at byte `offset`, "
      "innermost first; None where a handler there is not a `with` block's.");
  m.def(
      "exception_table",
      [](py::bytes table) {
        py::list out;
        for (const ExceptionEntry& e : ParseExceptionTable(std::string(table))) {
          out.append(py::make_tuple(e.start / 2, e.end / 2, e.target / 2,
                                    e.depth * 2 + (e.lasti ? 1 : 0)));
        }
        return out;
      },
      py::arg("table"),
      "The entries (start, end, target, depth << 1 | lasti) of a co_exceptiontable, in code "
      "units, end exclusive.");
}

py::object InstructionObject(const Instruction& i) {
  return py::cast(PyInstruction{i.opcode, i.arg, i.offset, i.starts_line, i.next_offset,
                                py::reinterpret_borrow<py::object>(i.argval)});
}

}  // namespace kiln::bytecode
