// kiln._C.Plan: the Python face of the plan runtime. Building decodes the artifact's serialized
// ExecutionPlan (DecodePlan) and binds it (Plan::Create), the plan's one crossing from Python; a
// call runs the plan (or replays its CUDA graph) without the GIL and, once a run has failed and a
// fallback is set, hands later calls to it. kiln._C.CudaGraphPool: the pool CUDA graphs share.
#include <ATen/ThreadLocalState.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "python_status.h"
#include "runtime/plan_decoder.h"
#include "runtime/plan_runtime.h"
#ifdef KILN_WITH_CUDA
#include "runtime/cuda_graph_runner.h"
#include "runtime/cuda_graph_shapes.h"
#endif

namespace py = pybind11;

namespace kiln::runtime {
namespace {

// The bytes of a `bytes` object, without a copy: they stay alive while `h` does.
std::string_view BytesOf(py::handle h, const char* what) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (!PyBytes_Check(h.ptr()) || PyBytes_AsStringAndSize(h.ptr(), &data, &size) != 0) {
    PyErr_Clear();
    ThrowPython(Status::WrongType(std::string("kiln plan: ") + what + " must be bytes, not " +
                                  Py_TYPE(h.ptr())->tp_name));
  }
  return {data, static_cast<size_t>(size)};
}

// A list or tuple as a tuple (a call's arguments); TypeError for anything else.
py::tuple TupleOf(py::handle h, const char* what) {
  if (PyTuple_Check(h.ptr())) return py::reinterpret_borrow<py::tuple>(h);
  if (PyList_Check(h.ptr())) return py::reinterpret_steal<py::tuple>(PyList_AsTuple(h.ptr()));
  ThrowPython(Status::WrongType(std::string("kiln plan: ") + what +
                                " must be a list or tuple, not " + Py_TYPE(h.ptr())->tp_name));
}

std::vector<at::Tensor> TensorsOf(py::handle h, const char* what) {
  py::tuple items = TupleOf(h, what);
  std::vector<at::Tensor> tensors;
  tensors.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (!THPVariable_Check(items[i].ptr())) {
      ThrowPython(Status::WrongType(std::string("kiln plan: ") + what + "[" + std::to_string(i) +
                                    "] is a " + Py_TYPE(items[i].ptr())->tp_name +
                                    ", not a tensor"));
    }
    tensors.push_back(THPVariable_Unpack(items[i].ptr()));
  }
  return tensors;
}

c10::Device DeviceOf(py::handle h) {
  if (THPDevice_Check(h.ptr())) return reinterpret_cast<THPDevice*>(h.ptr())->device;
  if (!PyUnicode_Check(h.ptr())) {
    ThrowPython(Status::WrongType("kiln plan: device must be a str or torch.device"));
  }
  const std::string text = h.cast<std::string>();
  try {
    return c10::Device(text);
  } catch (const c10::Error& e) {
    ThrowPython(Status::InvalidArgument("kiln plan: bad device '" + text +
                                        "': " + e.what_without_backtrace()));
  }
}

#ifdef KILN_WITH_CUDA
using GraphRunner = CudaGraphRunner;
using ShapeGraphs = CudaGraphShapes;
#else
// Without CUDA no plan runs on a GPU, so none is ever captured: a type that is never made.
struct GraphRunner {
  Status Run(const std::vector<at::Tensor>&, std::vector<at::Tensor>*, std::string*) {
    return Status::RuntimeError("kiln._C was built without CUDA");
  }
  bool captured() const { return false; }
  int captures() const { return 0; }
  int moved_outputs() const { return 0; }
  bool disabled() const { return true; }
};
struct ShapeGraphs : GraphRunner {
  struct Stats {
    int graphs = 0, captures = 0, evictions = 0;
    int64_t bytes = 0;
    bool disabled = true;
    std::string gate = "plain";
  };
  Stats stats() const { return {}; }
};
#endif

// The Python object: the plan (replayed as a CUDA graph when `graphs_` is set) plus the eager
// fallback it switches to after a failed run.
class PyPlan {
 public:
  PyPlan(std::shared_ptr<const Plan> plan, std::unique_ptr<GraphRunner> graphs,
         std::unique_ptr<ShapeGraphs> shapes)
      : plan_(std::move(plan)), graphs_(std::move(graphs)), shapes_(std::move(shapes)) {}

  // `args[0..n)` are the call's tensors; `tuple` holds them for a fallback call.
  py::object Call(PyObject* const* args, size_t n, py::handle tuple) {
    if (failed_.load() && fallback_) return fallback_(*py::reinterpret_borrow<py::tuple>(tuple));
    std::vector<at::Tensor> inputs;
    inputs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (args[i] == Py_None) {
        // A tensor another plan left undefined (CUDA attention's unused sequence offsets, saved
        // for its backward): a Tensor? argument takes it.
        inputs.emplace_back();
        continue;
      }
      if (!THPVariable_Check(args[i])) {
        ThrowPython(Status::WrongType("kiln plan: argument " + std::to_string(i) + " is a " +
                                      Py_TYPE(args[i])->tp_name + ", not a tensor"));
      }
      inputs.push_back(THPVariable_Unpack(args[i]));
    }
    std::vector<at::Tensor> outputs;
    Status status = Run(inputs, &outputs);
    if (!status.ok()) {
      if (!fallback_) ThrowPython(status);
      failed_ = true;
      py::module_::import("logging").attr("getLogger")("kiln").attr("warning")(
          "kiln: a compiled plan failed (%s); running its graph eagerly from now on",
          status.message());
      return fallback_(*py::reinterpret_borrow<py::tuple>(tuple));
    }
    py::list out(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      out[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outputs[i])));
    }
    return out;
  }

  // The plan (or its CUDA graph) on `inputs`, without the GIL; a failed capture is said once.
  Status Run(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs) {
    Status status;
    std::string graph_note;
    {
      py::gil_scoped_release no_gil;
      status = graphs_   ? graphs_->Run(inputs, outputs, &graph_note)
               : shapes_ ? shapes_->Run(inputs, outputs, &graph_note)
                         : plan_->Run(inputs, outputs);
    }
    if (!graph_note.empty()) {
      py::module_::import("logging").attr("getLogger")("kiln").attr("warning")(
          "kiln: a compiled plan cannot be captured as a CUDA graph (%s); it runs without one",
          graph_note);
    }
    return status;
  }

  // One run over ExampleInputs, its outputs dropped: what a first call sets up is done here.
  // A failure only leaves that to the first call (failed_ stays as it was).
  void Warm() {
    // A run with effects beyond its outputs is left to the first call: its random draws would
    // shift the program's numbers, its updates would write the program's parameters.
    if (!plan_->first_random_step().empty()) return;
    for (const Plan::InputUpdate& u : plan_->input_updates()) {
      if (u.call_index < 0) return;
    }
    std::vector<at::Tensor> inputs;
    try {
      inputs = plan_->ExampleInputs();
    } catch (const std::exception& e) {
      ThrowPython(Status::RuntimeError(e.what()));
    }
    if (Status status = WarmRun(inputs); !status.ok()) ThrowPython(status);
  }

  // Warm's run. A CPU plan runs on a thread of its own, with the caller's thread-local state
  // (grad mode, autocast, dispatch keys): OpenMP (libgomp) keeps a team of threads for each
  // thread that starts parallel work, and a child forked later inherits the team of its forking
  // thread dead, so its first parallel region waits for it forever. kiln.compile, which warms
  // the plans it prepares, must leave the process as safe to fork as it found it; the team this
  // thread made goes with it. A CUDA plan stays on the caller's thread (its current stream).
  Status WarmRun(const std::vector<at::Tensor>& inputs) {
    std::vector<at::Tensor> outputs;
    if (shapes_) {
      // The example sizes are no call's: no graph is recorded (or budgeted) for them.
      py::gil_scoped_release no_gil;
      return plan_->Run(inputs, &outputs);
    }
    if (graphs_ || !plan_->device().is_cpu()) return Run(inputs, &outputs);
    const at::ThreadLocalState state;
    Status status;
    py::gil_scoped_release no_gil;
    std::thread worker([&] {
      at::ThreadLocalStateGuard guard(state);
      try {
        status = plan_->Run(inputs, &outputs);
      } catch (const std::exception& e) {
        status = Status::RuntimeError(std::string("kiln plan: warm-up failed: ") + e.what());
      }
      outputs.clear();
    });
    worker.join();
    return status;
  }

  py::object Call(const py::tuple& args) {
    return Call(PySequence_Fast_ITEMS(args.ptr()), args.size(), args);
  }

  std::shared_ptr<const Plan> plan_;
  std::unique_ptr<GraphRunner> graphs_;  // Null: no CUDA graph.
  std::unique_ptr<ShapeGraphs> shapes_;  // A symbolic plan's graphs per shape; null: none.
  py::object fallback_;
  std::atomic<bool> failed_{false};
};

#ifdef KILN_WITH_CUDA
using GraphPool = std::shared_ptr<CudaGraphPool>;
#else
struct CudaGraphPool {};  // Never made: the Python class does not exist without CUDA.
using GraphPool = std::shared_ptr<CudaGraphPool>;
#endif

std::unique_ptr<PyPlan> MakePlan(py::handle plan, py::handle kernel_binary, py::handle params,
                                 py::handle device, py::handle kernel_ptx,
                                 std::optional<GraphPool> cuda_graphs, bool own_graph_memory) {
  const std::string_view plan_bytes = BytesOf(plan, "plan");
  PlanBinding binding;
  binding.kernel_binary = BytesOf(kernel_binary, "kernel_binary");
  binding.kernel_ptx = BytesOf(kernel_ptx, "kernel_ptx");
  binding.params = TensorsOf(params, "params");
  binding.device = DeviceOf(device);
  // Decoding, checking and loading the kernels (dlopen, cuModuleLoadData: milliseconds for a
  // large model) touch no Python object: without the GIL, so that the threads a background
  // compile shares the interpreter with are not held up meanwhile. `plan_bytes` and the
  // binding's byte views stay valid: the caller's arguments hold their objects.
  StatusOr<std::unique_ptr<Plan>> built = [&]() -> StatusOr<std::unique_ptr<Plan>> {
    py::gil_scoped_release no_gil;
    KILN_ASSIGN_OR_RETURN(const PlanSpec spec, DecodePlan(plan_bytes));
    return Plan::Create(spec, std::move(binding));
  }();
  std::shared_ptr<const Plan> made = ValueOrThrow(std::move(built));
  std::unique_ptr<GraphRunner> graphs;
  std::unique_ptr<ShapeGraphs> shapes;
#ifdef KILN_WITH_CUDA
  // A symbolic plan serves many shapes: a graph per shape.
  if (cuda_graphs && *cuda_graphs && made->device().is_cuda()) {
    if (made->symbolic()) {
      shapes = std::make_unique<CudaGraphShapes>(made, *cuda_graphs);
    } else {
      graphs = std::make_unique<CudaGraphRunner>(made, *cuda_graphs, nullptr, own_graph_memory);
    }
  }
#endif
  return std::make_unique<PyPlan>(std::move(made), std::move(graphs), std::move(shapes));
}

constexpr const char* kPlanDoc =
    R"doc(A compiled graph's ExecutionPlan (proto/kiln/v1/artifact.proto), run in C++.

Plan(plan: bytes,               # a serialized kiln.v1.ExecutionPlan, as the artifact holds it
     kernel_binary: bytes = b"",  # CPU: ELF shared object; CUDA: cubin; b"" without kernels
     params: [Tensor] = (),     # bound once to the plan's first inputs (parameters, buffers)
     device: str | torch.device = "cpu",  # "cpu" or "cuda:N"
     kernel_ptx: bytes = b"",   # CUDA: PTX loaded where the cubin does not load
     cuda_graphs: CudaGraphPool | None = None,  # CUDA: capture once, replay (runtime/cuda_graph_runner.h)
     own_graph_memory: bool = False)  # its graph in memory of its own: outputs lent, inputs read in place

A call passes the rest of the plan's inputs: plan(*tensors) and plan.run(tensors) return a list
of tensors. The prologue runs on the first call and again when a parameter changed in place. A
CUDA plan enqueues its work on the current stream of its device. With cuda_graphs, the first call
captures the plan into a CUDA graph in that pool and later calls replay it; a plan that cannot be
captured logs one warning and runs without a graph.

Building raises ValueError when the bytes do not decode ("... does not decode: steps[2].library
.args[0]: at byte 123: ...") or the plan is malformed or cannot be bound ("step 3 (aten::mm):
..."; see client/runtime/plan_runtime.h), TypeError for arguments of the wrong type. A failed
run raises RuntimeError naming the step, or, when `fallback` is set, logs one warning and calls
fallback(*tensors) for this and every later call.)doc";

}  // namespace

// plan(*tensors), the call every run of a compiled graph makes: straight from CPython's call
// slot to the plan, without pybind11's dispatcher (a lookup of __call__, overload resolution and
// a type-registry search for `self`: about a tenth of a small graph's call).
PyObject* PlanCallSlot(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) {
    return SetPythonError(Status::WrongType("kiln plan: takes tensors by position only"));
  }
  try {
    auto* inst = reinterpret_cast<py::detail::instance*>(self);
    PyPlan& plan = *inst->get_value_and_holder().value_ptr<PyPlan>();
    return plan.Call(py::reinterpret_borrow<py::tuple>(args)).release().ptr();
  } catch (py::error_already_set& e) {  // Set by ThrowPython, or raised by the fallback.
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    SetPythonError(Status::RuntimeError(e.what()));
  }
  return nullptr;
}

void RegisterRuntime(py::module_& m) {
#ifdef KILN_WITH_CUDA
  py::class_<CudaGraphPool, std::shared_ptr<CudaGraphPool>>(
      m, "CudaGraphPool",
      "The private memory pool the CUDA graphs of plans share (one per process: kiln's state "
      "makes it); it orders their replays.")
      .def(py::init<>())
      .def("set_shape_budget", &CudaGraphPool::SetShapeBudget, py::arg("graphs"),
           py::arg("bytes"),
           "The budget of the graphs that plans with size symbols record per shape, all plans "
           "together: how many, and the bytes they hold (<= 0: no limit).");
#endif
  m.attr("HAS_CUDA") = py::bool_(
#ifdef KILN_WITH_CUDA
      true
#else
      false
#endif
  );
  auto plan = py::class_<PyPlan>(m, "Plan", py::is_final(), kPlanDoc);
  plan.def(py::init(&MakePlan), py::arg("plan"), py::arg("kernel_binary") = py::bytes(),
           py::arg("params") = py::tuple(), py::arg("device") = "cpu",
           py::arg("kernel_ptx") = py::bytes(), py::arg("cuda_graphs") = py::none(),
           py::arg("own_graph_memory") = false)
      .def(
          "__call__", [](PyPlan& self, const py::args& args) { return self.Call(args); },
          "Runs the plan on the tensors, one per input; returns the list of outputs.")
      .def(
          "run",
          [](PyPlan& self, py::handle tensors) { return self.Call(TupleOf(tensors, "run")); },
          py::arg("tensors"), "Like plan(*tensors).")
      .def("warm", &PyPlan::Warm,
           "Runs the plan once over zeroed inputs of its inputs' metadata, without the GIL, and "
           "drops the results: the prologue, oneDNN's primitives and a CUDA graph are then ready "
           "for the first call. Raises RuntimeError when that run fails (the plan is not marked "
           "failed: the first call tries again). Does nothing for a plan whose run has effects "
           "beyond its outputs (it draws random numbers or updates a parameter in place).")
      .def_property(
          "fallback", [](const PyPlan& p) { return p.fallback_; },
          [](PyPlan& p, py::object f) { p.fallback_ = std::move(f); },
          "Called with the same arguments instead of the plan once a run has failed (None: a "
          "failed run raises RuntimeError).")
      .def_property_readonly(
          "failed", [](const PyPlan& p) { return p.failed_.load(); },
          "Whether a run has failed and later calls go to the fallback.")
      .def_property_readonly(
          "symbolic", [](const PyPlan& p) { return p.plan_->symbolic(); },
          "Whether the plan has size symbols: one plan for every size in their ranges.")
      .def_property_readonly("num_kernels", [](const PyPlan& p) { return p.plan_->num_kernels(); })
      .def_property_readonly("num_library_calls",
                             [](const PyPlan& p) { return p.plan_->num_library_calls(); })
      .def_property_readonly(
          "num_inputs", [](const PyPlan& p) { return p.plan_->num_inputs(); },
          "The tensors a call passes (the plan's inputs after its parameters).")
      .def_property_readonly("num_outputs", [](const PyPlan& p) { return p.plan_->num_outputs(); })
      .def_property_readonly(
          "prologue_runs", [](const PyPlan& p) { return p.plan_->prologue_runs(); },
          "How many times the prologue has run (the first call's or warm()'s, and again after "
          "a parameter it reads changed in place).")
      .def_property_readonly(
          "host_prologue_steps", [](const PyPlan& p) { return p.plan_->host_prologue_steps(); },
          "Prologue steps a CUDA plan ran on the host (small ones: a batch norm's per-channel "
          "scale and shift), over all its prologue runs.")
      .def_property_readonly("arena_bytes", [](const PyPlan& p) { return p.plan_->arena_bytes(); })
      .def_property_readonly(
          "cuda_graph",
          [](const PyPlan& p) -> py::object {
            if (p.shapes_) {
              const auto stats = p.shapes_->stats();
              return py::str(stats.disabled || stats.gate == "plain" ? "off"
                             : stats.graphs > 0                        ? "captured"
                                                                       : "pending");
            }
            if (!p.graphs_) return py::none();
            return py::str(p.graphs_->disabled()   ? "off"
                           : p.graphs_->captured() ? "captured"
                                                   : "pending");
          },
          "None without CUDA graphs; else 'pending' (not captured yet), 'captured' (a plan with "
          "size symbols: at least one shape's graph held), or 'off' (a capture failed: the "
          "plan runs without a graph).")
      .def_property_readonly(
          "cuda_graph_captures",
          [](const PyPlan& p) {
            return p.shapes_ ? p.shapes_->stats().captures
                   : p.graphs_ ? p.graphs_->captures()
                               : 0;
          },
          "How many times the plan was captured (again after a parameter's storage moved; a "
          "plan with size symbols: once per shape recorded, evicted ones included).")
      .def_property_readonly(
          "cuda_graph_moved_outputs",
          [](const PyPlan& p) { return p.graphs_ ? p.graphs_->moved_outputs() : 0; },
          "A plan whose graph has memory of its own (own_graph_memory): how many of its lent "
          "outputs were moved aside because the caller still held them at a replay.")
      .def_property_readonly(
          "cuda_graph_shapes",
          [](const PyPlan& p) -> py::object {
            if (!p.shapes_) return py::none();
            py::dict d;
            const auto stats = p.shapes_->stats();
            d["graphs"] = stats.graphs;
            d["captures"] = stats.captures;
            d["evictions"] = stats.evictions;
            d["bytes"] = stats.bytes;
            d["gate"] = stats.gate;
            d["disabled"] = stats.disabled;
            return d;
          },
          "A plan with size symbols replayed per shape (runtime/cuda_graph_shapes.h): the "
          "graphs it holds, has recorded and has evicted, the bytes they hold, whether "
          "graphs pay for it ('measuring', 'record', 'plain') and whether recording stopped "
          "(captures failed); else None.");
  // Plan is final (py::is_final): every instance is a PyPlan, which the slot relies on.
  // plan.__call__ read as an attribute stays the pybind11 method.
  reinterpret_cast<PyTypeObject*>(plan.ptr())->tp_call = PlanCallSlot;
}

}  // namespace kiln::runtime
