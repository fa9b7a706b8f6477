// kiln._C: the extension module. Wires the eval-frame hook (C), the bytecode decoder and the
// symbolic executor, the guard tree, the plan runtime (C++) and kiln's default paths into one
// Python module; each part registers its own types and functions.
#include <pybind11/pybind11.h>

#include "bytecode/instructions.h"
#include "capture/executor.h"
#include "guards/guard_tree.h"
#include "hook/eval_frame.h"

namespace kiln::runtime {
void RegisterRuntime(pybind11::module_& m);  // runtime/runtime_bindings.cpp
}
namespace kiln::paths {
void RegisterPython(pybind11::module_& m);  // paths_bindings.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "kiln's native core: the PEP 523 frame hook, the symbolic executor, the guard tree "
            "and the plan runtime";
  if (kiln_hook_init(m.ptr()) < 0) throw pybind11::error_already_set();
  kiln::bytecode::RegisterPython(m);
  kiln::capture::RegisterPython(m);
  kiln::guards::RegisterPython(m);
  kiln::runtime::RegisterRuntime(m);
  kiln::paths::RegisterPython(m);
}
