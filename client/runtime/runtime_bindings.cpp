// kiln._C.Plan: the Python face of the plan runtime. Building converts plain Python data (made by
// kiln.daemon.artifact from a verified ArtifactBody) into a PlanSpec; a call runs the plan
// without the GIL and, once a run has failed and a fallback is set, hands later calls to it.
#include <pybind11/pybind11.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/plan_runtime.h"

namespace py = pybind11;

namespace kiln::runtime {
namespace {

// Sets `type` with the exception's message and throws error_already_set: C++ exceptions leave
// this module as Python exceptions set here, never through pybind11's translation of C++
// exceptions, which crashed on the CPython 3.12 + torch 2.11 host when torch's translators ran.
[[noreturn]] void RaisePython(PyObject* type, const std::exception& e) {
  PyErr_SetString(type, e.what());
  throw py::error_already_set();
}

// Parsing helpers: each names what it was reading, so a malformed plan gives a ValueError that
// says where ("steps[3][2][1]: expected an int").
[[noreturn]] void Malformed(const std::string& where, const std::string& what) {
  throw py::value_error("kiln plan: " + where + ": " + what);
}

py::sequence Sequence(py::handle h, const std::string& where, size_t min_size = 0,
                      size_t max_size = SIZE_MAX) {
  if (!PyList_Check(h.ptr()) && !PyTuple_Check(h.ptr())) {
    Malformed(where, "expected a list or tuple, got " + std::string(Py_TYPE(h.ptr())->tp_name));
  }
  auto seq = py::reinterpret_borrow<py::sequence>(h);
  if (seq.size() < min_size || seq.size() > max_size) {
    Malformed(where, "has " + std::to_string(seq.size()) + " items");
  }
  return seq;
}

int64_t Int(py::handle h, const std::string& where) {
  if (!PyLong_Check(h.ptr())) {
    Malformed(where, "expected an int, got " + std::string(Py_TYPE(h.ptr())->tp_name));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow != 0) Malformed(where, "int out of range");
  return v;
}

uint32_t ValueId(py::handle h, const std::string& where) {
  const int64_t v = Int(h, where);
  if (v < 0 || v > UINT32_MAX) Malformed(where, "value id out of range");
  return static_cast<uint32_t>(v);
}

std::vector<int64_t> Ints(py::handle h, const std::string& where) {
  py::sequence seq = Sequence(h, where);
  std::vector<int64_t> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i)
    out.push_back(Int(seq[i], where + "[" + std::to_string(i) + "]"));
  return out;
}

std::vector<uint32_t> Ids(py::handle h, const std::string& where) {
  py::sequence seq = Sequence(h, where);
  std::vector<uint32_t> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) {
    out.push_back(ValueId(seq[i], where + "[" + std::to_string(i) + "]"));
  }
  return out;
}

std::string Str(py::handle h, const std::string& where) {
  if (!PyUnicode_Check(h.ptr())) Malformed(where, "expected a str");
  return h.cast<std::string>();
}

// Enum payloads: the c10 enum's int, or the torch object itself (torch.float32,
// torch.channels_last, torch.strided), so Python need not keep a numbering table.
int64_t ScalarTypeOf(py::handle h, const std::string& where) {
  if (THPDtype_Check(h.ptr())) {
    return static_cast<int64_t>(reinterpret_cast<THPDtype*>(h.ptr())->scalar_type);
  }
  return Int(h, where);
}

int64_t MemoryFormatOf(py::handle h, const std::string& where) {
  if (THPMemoryFormat_Check(h.ptr())) {
    return static_cast<int64_t>(reinterpret_cast<THPMemoryFormat*>(h.ptr())->memory_format);
  }
  return Int(h, where);
}

int64_t LayoutOf(py::handle h, const std::string& where) {
  if (THPLayout_Check(h.ptr())) {
    return static_cast<int64_t>(reinterpret_cast<THPLayout*>(h.ptr())->layout);
  }
  return Int(h, where);
}

const at::Tensor& TensorOf(py::handle h, const std::string& where) {
  if (!THPVariable_Check(h.ptr())) Malformed(where, "expected a torch.Tensor");
  return THPVariable_Unpack(h.ptr());
}

CallArg ParseArg(py::handle h, const std::string& where) {
  py::sequence t = Sequence(h, where, 3, 3);
  CallArg a;
  a.name = Str(t[0], where + "[0]");
  const std::string kind = Str(t[1], where + "[1]");
  py::object p = t[2];
  const std::string pw = where + "[2]";
  using K = CallArg::Kind;
  if (kind == "value") {
    a.kind = K::kValue, a.i = ValueId(p, pw);
  } else if (kind == "int") {
    a.kind = K::kInt, a.i = Int(p, pw);
  } else if (kind == "float") {
    if (!PyFloat_Check(p.ptr()) && !PyLong_Check(p.ptr())) Malformed(pw, "expected a float");
    a.kind = K::kFloat, a.f = p.cast<double>();
  } else if (kind == "bool") {
    if (!PyBool_Check(p.ptr())) Malformed(pw, "expected a bool");
    a.kind = K::kBool, a.b = p.ptr() == Py_True;
  } else if (kind == "ints") {
    a.kind = K::kInts, a.list = Ints(p, pw);
  } else if (kind == "values") {
    a.kind = K::kValues;
    for (uint32_t id : Ids(p, pw)) a.list.push_back(id);
  } else if (kind == "dtype") {
    a.kind = K::kDtype, a.i = ScalarTypeOf(p, pw);
  } else if (kind == "none") {
    if (!p.is_none()) Malformed(pw, "expected None");
    a.kind = K::kNone;
  } else if (kind == "str") {
    a.kind = K::kStr, a.s = Str(p, pw);
  } else if (kind == "device") {
    a.kind = K::kDevice;
    a.s =
        THPDevice_Check(p.ptr()) ? reinterpret_cast<THPDevice*>(p.ptr())->device.str() : Str(p, pw);
  } else if (kind == "memory_format") {
    a.kind = K::kMemoryFormat, a.i = MemoryFormatOf(p, pw);
  } else if (kind == "layout") {
    a.kind = K::kLayout, a.i = LayoutOf(p, pw);
  } else {
    Malformed(where + "[1]", "unknown argument kind '" + kind + "'");
  }
  return a;
}

std::vector<std::variant<KernelStepSpec, LibraryStepSpec>> ParseSteps(py::handle steps,
                                                                      const std::string& name) {
  std::vector<std::variant<KernelStepSpec, LibraryStepSpec>> out;
  py::sequence ss = Sequence(steps, name);
  for (size_t i = 0; i < ss.size(); ++i) {
    const std::string w = name + "[" + std::to_string(i) + "]";
    py::sequence t = Sequence(ss[i], w, 5, 5);
    const std::string kind = Str(t[0], w + "[0]");
    if (kind == "kernel") {
      out.emplace_back(KernelStepSpec{Str(t[1], w + "[1]"), Ids(t[2], w + "[2]"),
                                      Ids(t[3], w + "[3]"), Ids(t[4], w + "[4]")});
    } else if (kind == "library") {
      LibraryStepSpec l{Str(t[1], w + "[1]"), {}, Ids(t[3], w + "[3]"), Ids(t[4], w + "[4]")};
      py::sequence args = Sequence(t[2], w + "[2]");
      for (size_t j = 0; j < args.size(); ++j) {
        l.args.push_back(ParseArg(args[j], w + "[2][" + std::to_string(j) + "]"));
      }
      out.emplace_back(std::move(l));
    } else {
      Malformed(w + "[0]", "unknown step kind '" + kind + "'");
    }
  }
  return out;
}

PlanSpec ParseSpec(const py::bytes& kernel_binary, py::handle values, py::handle inputs,
                   py::handle constants, py::handle buffers, uint64_t arena_bytes, py::handle steps,
                   py::handle outputs, py::handle device, py::handle prologue,
                   py::handle prologue_outputs) {
  PlanSpec spec;
  spec.kernel_binary = std::string(kernel_binary);
  py::sequence vs = Sequence(values, "values");
  for (size_t i = 0; i < vs.size(); ++i) {
    const std::string w = "values[" + std::to_string(i) + "]";
    py::sequence t = Sequence(vs[i], w, 5, 5);
    ValueMeta meta;
    meta.dtype = static_cast<at::ScalarType>(ScalarTypeOf(t[1], w + "[1]"));
    meta.sizes = Ints(t[2], w + "[2]");
    meta.strides = Ints(t[3], w + "[3]");
    meta.storage_offset = Int(t[4], w + "[4]");
    spec.values.emplace_back(ValueId(t[0], w + "[0]"), std::move(meta));
  }
  spec.inputs = Ids(inputs, "inputs");
  py::sequence cs = Sequence(constants, "constants");
  for (size_t i = 0; i < cs.size(); ++i) {
    const std::string w = "constants[" + std::to_string(i) + "]";
    py::sequence t = Sequence(cs[i], w, 2, 2);
    spec.constants.emplace_back(ValueId(t[0], w + "[0]"), TensorOf(t[1], w + "[1]"));
  }
  py::sequence bs = Sequence(buffers, "buffers");
  for (size_t i = 0; i < bs.size(); ++i) {
    const std::string w = "buffers[" + std::to_string(i) + "]";
    py::sequence t = Sequence(bs[i], w, 3, 3);
    if (!PyBool_Check(t[1].ptr())) Malformed(w + "[1]", "expected a bool");
    const int64_t offset = Int(t[2], w + "[2]");
    if (offset < 0) Malformed(w + "[2]", "negative arena offset");
    spec.buffers.push_back(
        {ValueId(t[0], w + "[0]"), t[1].ptr() == Py_True, static_cast<uint64_t>(offset)});
  }
  spec.arena_bytes = arena_bytes;
  spec.steps = ParseSteps(steps, "steps");
  spec.prologue = ParseSteps(prologue, "prologue");
  spec.prologue_outputs = Ids(prologue_outputs, "prologue_outputs");
  spec.outputs = Ids(outputs, "outputs");
  const std::string device_text = THPDevice_Check(device.ptr())
                                      ? reinterpret_cast<THPDevice*>(device.ptr())->device.str()
                                      : Str(device, "device");
  try {
    spec.device = c10::Device(device_text);
  } catch (const c10::Error& e) {
    Malformed("device", e.what_without_backtrace());
  }
  return spec;
}

// The Python object: the plan plus the eager fallback it switches to after a failed run.
class PyPlan {
 public:
  explicit PyPlan(PlanSpec spec) : plan_(std::make_shared<const Plan>(std::move(spec))) {}

  // `args[0..n)` are the call's tensors; `tuple` holds them for a fallback call.
  py::object Call(PyObject* const* args, size_t n, py::handle tuple) {
    if (failed_.load() && fallback_) return fallback_(*py::reinterpret_borrow<py::tuple>(tuple));
    std::vector<at::Tensor> inputs;
    inputs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (!THPVariable_Check(args[i])) {
        throw py::type_error("kiln plan: argument " + std::to_string(i) + " is a " +
                             Py_TYPE(args[i])->tp_name + ", not a tensor");
      }
      inputs.push_back(THPVariable_Unpack(args[i]));
    }
    std::vector<at::Tensor> outputs;
    try {
      py::gil_scoped_release no_gil;
      outputs = plan_->Run(inputs);
    } catch (const std::exception& e) {
      // Raised here as a Python exception, not left to pybind11's translation of C++
      // exceptions: with some toolchains (the CPython 3.12 + torch 2.11 host) that path
      // crashes when torch's translators run first.
      if (!fallback_) RaisePython(PyExc_RuntimeError, e);
      failed_ = true;
      py::module_::import("logging").attr("getLogger")("kiln").attr("warning")(
          "kiln: a compiled plan failed (%s); running its graph eagerly from now on",
          std::string(e.what()));
      return fallback_(*py::reinterpret_borrow<py::tuple>(tuple));
    }
    py::list out(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      out[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outputs[i])));
    }
    return out;
  }

  py::object Call(const py::tuple& args) {
    return Call(PySequence_Fast_ITEMS(args.ptr()), args.size(), args);
  }

  std::shared_ptr<const Plan> plan_;
  py::object fallback_;
  std::atomic<bool> failed_{false};
};

constexpr const char* kPlanDoc =
    R"doc(A compiled graph's ExecutionPlan (proto/kiln/v1/artifact.proto), run in C++.

Plan(kernel_binary: bytes,      # ELF shared object; b"" when no step launches a kernel
     values: [(id, scalar_type, sizes: [int], strides: [int], storage_offset: int)],
     inputs: [id],              # bound to the call's tensors, in order
     constants: [(id, Tensor)], # bound once (constants, parameters)
     buffers: [(id, in_arena: bool, arena_offset: int)],
     arena_bytes: int,
     steps: [("kernel", symbol: str, arg_ids: [id], writes: [id], release: [id])
             | ("library", "aten::op.overload", args: [(name, kind, payload)],
                output_ids: [id], release: [id])],
     outputs: [id],
     device: str | torch.device = "cpu",
     prologue: [step] = (),     # steps as above over constants only, run when they change
     prologue_outputs: [id] = ())

scalar_type is a c10::ScalarType int or a torch.dtype. Argument name "" is positional. Kinds and
payloads: "value" id | "int" int | "float" float | "bool" bool | "ints" [int] | "values" [id] |
"dtype" int or torch.dtype | "none" None | "str" str | "device" str or torch.device |
"memory_format" int or torch.memory_format | "layout" int or torch.layout.

Building raises ValueError naming the step when the plan is malformed or cannot be bound (see
client/runtime/plan_runtime.h). plan(*tensors) and plan.run(tensors) return a list of tensors;
a failed run raises RuntimeError naming the step, or, when `fallback` is set, logs one warning
and calls fallback(*tensors) for this and every later call.)doc";

}  // namespace

// plan(*tensors), the call every run of a compiled graph makes: straight from CPython's call
// slot to the plan, without pybind11's dispatcher (a lookup of __call__, overload resolution and
// a type-registry search for `self`: about a tenth of a small graph's call).
PyObject* PlanCallSlot(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    PyErr_SetString(PyExc_TypeError, "kiln plan: takes tensors by position only");
    return nullptr;
  }
  try {
    auto* inst = reinterpret_cast<py::detail::instance*>(self);
    PyPlan& plan = *inst->get_value_and_holder().value_ptr<PyPlan>();
    return plan.Call(py::reinterpret_borrow<py::tuple>(args)).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

void RegisterRuntime(py::module_& m) {
  auto plan = py::class_<PyPlan>(m, "Plan", py::is_final(), kPlanDoc);
  plan
      .def(py::init([](const py::bytes& kernel_binary, py::handle values, py::handle inputs,
                       py::handle constants, py::handle buffers, uint64_t arena_bytes,
                       py::handle steps, py::handle outputs, py::handle device, py::handle prologue,
                       py::handle prologue_outputs) {
             // Plan's constructor throws std::invalid_argument, raised as ValueError.
             try {
               return std::make_unique<PyPlan>(ParseSpec(kernel_binary, values, inputs, constants,
                                                         buffers, arena_bytes, steps, outputs,
                                                         device, prologue, prologue_outputs));
             } catch (const py::error_already_set&) {
               throw;
             } catch (const py::builtin_exception& e) {
               e.set_error();
               throw py::error_already_set();
             } catch (const std::invalid_argument& e) {
               RaisePython(PyExc_ValueError, e);
             } catch (const std::exception& e) {
               RaisePython(PyExc_RuntimeError, e);
             }
           }),
           py::arg("kernel_binary"), py::arg("values"), py::arg("inputs"), py::arg("constants"),
           py::arg("buffers"), py::arg("arena_bytes"), py::arg("steps"), py::arg("outputs"),
           py::arg("device") = "cpu", py::arg("prologue") = py::tuple(),
           py::arg("prologue_outputs") = py::tuple())
      .def(
          "__call__", [](PyPlan& self, const py::args& args) { return self.Call(args); },
          "Runs the plan on the tensors, one per input; returns the list of outputs.")
      .def(
          "run",
          [](PyPlan& self, py::handle tensors) {
            return self.Call(py::tuple(Sequence(tensors, "run")));
          },
          py::arg("tensors"), "Like plan(*tensors).")
      .def_property(
          "fallback", [](const PyPlan& p) { return p.fallback_; },
          [](PyPlan& p, py::object f) { p.fallback_ = std::move(f); },
          "Called with the same arguments instead of the plan once a run has failed (None: a "
          "failed run raises RuntimeError).")
      .def_property_readonly(
          "failed", [](const PyPlan& p) { return p.failed_.load(); },
          "Whether a run has failed and later calls go to the fallback.")
      .def_property_readonly("num_kernels", [](const PyPlan& p) { return p.plan_->num_kernels(); })
      .def_property_readonly("num_library_calls",
                             [](const PyPlan& p) { return p.plan_->num_library_calls(); })
      .def_property_readonly("num_inputs", [](const PyPlan& p) { return p.plan_->num_inputs(); })
      .def_property_readonly("num_outputs", [](const PyPlan& p) { return p.plan_->num_outputs(); })
      .def_property_readonly("arena_bytes", [](const PyPlan& p) { return p.plan_->arena_bytes(); });
  // Plan is final (py::is_final): every instance is a PyPlan, which the slot relies on.
  // plan.__call__ read as an attribute stays the pybind11 method.
  reinterpret_cast<PyTypeObject*>(plan.ptr())->tp_call = PlanCallSlot;
}

}  // namespace kiln::runtime
