// kiln._C: the extension module. Wires the eval-frame hook (C) and the guard tree (C++) into one
// Python module; each part registers its own types and functions.
#include <pybind11/pybind11.h>

#include "guards/guard_tree.h"
#include "hook/eval_frame.h"

namespace kiln::runtime {
void RegisterRuntime(pybind11::module_& m);  // runtime/runtime_bindings.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "kiln's native core: the PEP 523 frame hook and the C++ guard tree";
  if (kiln_hook_init(m.ptr()) < 0) throw pybind11::error_already_set();
  kiln::guards::RegisterPython(m);
  kiln::runtime::RegisterRuntime(m);
}
