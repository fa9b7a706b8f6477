// Capturing a CUDA plan into a CUDA graph and replaying it, with the copies of inputs, outputs
// and prologue values that keep every replay's answer the plan's.
#include "runtime/cuda_graph_runner.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <set>
#include <utility>

namespace kiln::runtime {
namespace {

// A tensor the graph may read at a fixed address in place of `t`: same dtype, sizes and strides.
at::Tensor StaticCopy(const at::Tensor& t) {
  at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options());
  copy.copy_(t);
  return copy;
}

// The elements of t's storage that t reads, from the storage's start: [0, offset + the largest
// element's distance + 1). -1 when a stride is negative (no such view is laid over a span).
int64_t SpanElements(const at::Tensor& t) {
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return 0;
    if (t.stride(d) < 0) return -1;
    last += (t.size(d) - 1) * t.stride(d);
  }
  return last + 1;
}

// That span as a dense 1-D tensor over t's own storage.
at::Tensor SpanOf(const at::Tensor& t) { return t.as_strided({SpanElements(t)}, {1}, 0); }

// Whether `a` and `b` are views of one layout: sizes, strides and storage offset.
bool SameLayout(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.storage_offset() == b.storage_offset();
}

// Makes `waiter` wait for what is enqueued on `stream` so far.
void WaitFor(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& stream) {
  c10::Event done(c10::DeviceType::CUDA);
  done.record(stream);
  done.block(waiter);
}

}  // namespace

bool GraphCopyable(const at::Tensor& t) {
  return t.defined() && t.storage_offset() == 0 && t.is_non_overlapping_and_dense();
}

Status PrologueCopy::Make(const std::shared_ptr<const std::vector<at::Tensor>>& values,
                          std::shared_ptr<PrologueCopy>* made) {
  auto copy = std::make_shared<PrologueCopy>();
  for (const at::Tensor& t : *values) {
    // Copied with its exact layout (a broadcast or sliced view too: kernels were generated for
    // its strides): the storage span it reads, and the same view over the copy of that span.
    if (!t.defined() || SpanElements(t) < 0) {
      return Status::RuntimeError("a prologue value has a negative stride");
    }
    at::Tensor span = at::empty({SpanElements(t)}, t.options());
    span.copy_(SpanOf(t));
    copy->views_.push_back(span.as_strided(t.sizes(), t.strides(), t.storage_offset()));
    copy->spans_.push_back(std::move(span));
  }
  copy->source_ = values;
  *made = std::move(copy);
  return Status::OK();
}

bool PrologueCopy::Fits(const std::vector<at::Tensor>& values) const {
  if (values.size() != views_.size()) return false;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined() || !SameLayout(values[i], views_[i])) return false;
  }
  return true;
}

void PrologueCopy::Refresh(const std::shared_ptr<const std::vector<at::Tensor>>& values) {
  if (values == source_) return;
  for (size_t i = 0; i < spans_.size(); ++i) spans_[i].copy_(SpanOf((*values)[i]));
  source_ = values;
}

int64_t PrologueCopy::bytes() const {
  int64_t total = 0;
  for (const at::Tensor& t : spans_) total += static_cast<int64_t>(t.nbytes());
  return total;
}

Status PrologueCopies::For(const std::shared_ptr<const std::vector<at::Tensor>>& values,
                           std::shared_ptr<PrologueCopy>* copy) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_ == nullptr || !current_->Fits(*values)) {
    // The first copy, or the values' layouts changed: graphs captured with the old copy keep it
    // (and capture again when they next run).
    std::shared_ptr<PrologueCopy> made;
    KILN_RETURN_IF_ERROR(PrologueCopy::Make(values, &made));
    current_ = std::move(made);
  } else {
    current_->Refresh(values);
  }
  *copy = current_;
  return Status::OK();
}

int64_t PrologueCopies::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_ == nullptr ? 0 : current_->bytes();
}

std::string CudaGraphRunner::Refusal(const Plan& plan) {
  // Ops whose CUDA implementations read a device value on the host (their output's size, or the
  // value itself), so that capturing them fails.
  static const std::vector<std::string> kHostSynchronising = {"aten::nonzero",
                                                              "aten::masked_select",
                                                              "aten::_local_scalar_dense",
                                                              "aten::item",
                                                              "aten::unique_consecutive",
                                                              "aten::_unique",
                                                              "aten::_unique2",
                                                              "aten::unique_dim",
                                                              "aten::repeat_interleave",
                                                              "aten::masked_scatter",
                                                              "aten::argwhere",
                                                              "aten::nonzero_numpy",
                                                              "aten::bincount",
                                                              "aten::histc",
                                                              "aten::is_nonzero",
                                                              "aten::equal",
                                                              "aten::allclose",
                                                              "aten::_assert_async",
                                                              "aten::multinomial"};
  const std::string step = plan.FirstCallOf(kHostSynchronising);
  if (!step.empty()) return step + " synchronises with the host";
  if (!plan.first_random_step().empty()) {
    // The warm-up before the capture would draw from the generator: the first call's numbers
    // would not be eager's.
    return plan.first_random_step() + " draws random numbers";
  }
  for (const Plan::InputUpdate& u : plan.input_updates()) {
    if (u.call_index < 0 || u.restride) {
      // The warm-up would write the parameter once more; a new layout would change the static
      // input the graph reads.
      return "the plan updates a parameter or an input's layout in place";
    }
  }
  return "";
}

CudaGraphRunner::CudaGraphRunner(std::shared_ptr<const Plan> plan,
                                 std::shared_ptr<CudaGraphPool> pool,
                                 std::shared_ptr<PrologueCopies> prologue, bool own_memory)
    : plan_(std::move(plan)),
      pool_(std::move(pool)),
      sources_(plan_->OutputSources()),
      bound_(plan_->BoundTensors()),
      shared_prologue_(prologue != nullptr),
      copies_(prologue != nullptr ? std::move(prologue) : std::make_shared<PrologueCopies>()),
      own_memory_(own_memory),
      // Own memory: nothing copied while the inputs are observed (InputPlacement decides).
      copied_(plan_->num_inputs(), !own_memory),
      placement_(plan_->num_inputs()) {
  pending_note_ = Refusal(*plan_);
  disabled_ = !pending_note_.empty();
}

CudaGraphRunner::~CudaGraphRunner() {
  // A replay may still read the static inputs, which the caching allocator would hand out again
  // on the stream they were made on, whatever stream replayed last.
  if (graph_ == nullptr) return;
  try {
    c10::cuda::device_synchronize();
  } catch (const c10::Error&) {  // At exit CUDA may be gone already; nothing runs then.
  }
}

bool CudaGraphRunner::captured() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return graph_ != nullptr;
}

int CudaGraphRunner::captures() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return captures_;
}

int CudaGraphRunner::moved_outputs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lent_.moved();
}

bool CudaGraphRunner::disabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return disabled_;
}

int64_t CudaGraphRunner::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (graph_ == nullptr) return 0;
  // Each storage once; an output that is an input or a bound tensor is not the graph's.
  std::set<const void*> counted;
  int64_t total = 0;
  auto count = [&](const at::Tensor& t) {
    if (t.defined() && t.has_storage() && counted.insert(t.storage().data()).second) {
      total += static_cast<int64_t>(t.storage().nbytes());
    }
  };
  for (const at::Tensor& t : static_inputs_) count(t);  // Inputs read in place are the caller's.
  if (!shared_prologue_ && prologue_ != nullptr) total += prologue_->bytes();
  for (size_t i = 0; i < static_outputs_.size() && i < sources_.size(); ++i) {
    if (sources_[i].kind == Plan::OutputSource::kComputed) count(static_outputs_[i]);
  }
  return total;
}

bool CudaGraphRunner::Matches(const std::vector<at::Tensor>& inputs) const {
  if (inputs.size() != plan_->num_inputs()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined() || t.device() != plan_->device()) return false;
    // Read in place, an input may have any layout (the capture's, checked before a replay).
    if (copied_[i] && !GraphCopyable(t)) return false;
    if (graph_ == nullptr || !copied_[i]) continue;
    const at::Tensor& s = static_inputs_[i];
    if (t.scalar_type() != s.scalar_type() || t.sizes() != s.sizes() ||
        t.strides() != s.strides()) {
      return false;
    }
  }
  return true;
}

bool CudaGraphRunner::BoundMoved() const {
  for (size_t i = 0; i < bound_.size(); ++i) {
    if (bound_[i].data_ptr() != bound_addresses_[i]) return true;
  }
  return false;
}

Status CudaGraphRunner::Run(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs,
                            std::string* note) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (disabled_) {
    if (!pending_note_.empty()) *note = std::move(pending_note_);
    pending_note_.clear();
    return plan_->Run(inputs, outputs);
  }
  try {
    const c10::DeviceIndex device = plan_->device().index();
    c10::cuda::CUDAGuard guard(device);
    if (graph_ != nullptr && BoundMoved()) Drop();  // Captured again below.
    if (!Matches(inputs)) return plan_->Run(inputs, outputs);
    std::shared_ptr<const std::vector<at::Tensor>> prologue;
    if (plan_->num_prologue_outputs() > 0) {
      // Run (again) here when a parameter it reads changed: outside the graph, on this stream.
      KILN_ASSIGN_OR_RETURN(prologue, plan_->PrologueValues());
    }
    if (graph_ != nullptr && prologue != prologue_checked_) {
      // Recomputed since this graph last ran: captured again if its layouts changed.
      if (!prologue_->Fits(*prologue)) Drop();
      prologue_checked_ = prologue;
    }
    if (graph_ == nullptr) {
      if (own_memory_) {
        // Observed while no graph runs; then the inputs that stay where they are are read there.
        std::unique_lock<std::mutex> pool_lock = pool_->Lock();
        if (!placement_.Observe(inputs, pool_->OwnCaptures())) {
          pool_lock.unlock();
          return plan_->Run(inputs, outputs);
        }
        copied_ = placement_.copied();
      }
      if (!Matches(inputs)) return plan_->Run(inputs, outputs);
      Status captured;
      try {
        captured = Capture(inputs, prologue);
      } catch (const c10::Error& e) {
        captured = Status::RuntimeError(e.what_without_backtrace());
      } catch (const std::exception& e) {
        captured = Status::RuntimeError(e.what());
      }
      if (!captured.ok()) {
        disabled_ = true;
        graph_.reset();
        static_inputs_.clear();
        static_outputs_.clear();
        lent_.Clear();
        prologue_.reset();
        *note = captured.message();
        return plan_->Run(inputs, outputs);
      }
    }
    KILN_ASSIGN_OR_RETURN(const bool replayed, Replay(inputs, prologue, outputs));
    if (replayed) return Status::OK();
    // An input read in place is elsewhere, or the outputs lost their memory: observed again.
    Drop();
    placement_.Restart(moved_);
    return plan_->Run(inputs, outputs);
  } catch (const c10::Error& e) {
    return Status::RuntimeError(std::string("kiln plan: CUDA graph: ") +
                                e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Status::RuntimeError(std::string("kiln plan: CUDA graph: ") + e.what());
  }
}

void CudaGraphRunner::Drop() {
  // The old graph may still be replaying: wait for it first.
  c10::cuda::device_synchronize();
  graph_.reset();
  lent_.Clear();
}

Status CudaGraphRunner::Capture(const std::vector<at::Tensor>& inputs,
                                const std::shared_ptr<const std::vector<at::Tensor>>& prologue) {
  const c10::DeviceIndex device = plan_->device().index();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  // Outside the pool: the static inputs and the prologue's copy live as long as the graph.
  // What the capture reads: those copies, and the caller's own tensors read in place.
  static_inputs_.clear();
  std::vector<at::Tensor> read;
  for (size_t i = 0; i < inputs.size(); ++i) {
    static_inputs_.push_back(copied_[i] ? StaticCopy(inputs[i]) : at::Tensor());
    read.push_back(copied_[i] ? static_inputs_[i] : inputs[i]);
  }
  prologue_.reset();
  static const std::vector<at::Tensor> kNoPrologue;
  if (prologue != nullptr) {
    // The copy may be shared: refreshed under the pool's lock, after the last replay.
    std::unique_lock<std::mutex> pool_lock = pool_->Lock();
    pool_->OrderAfterLast(current);
    KILN_RETURN_IF_ERROR(copies_->For(prologue, &prologue_));
  }
  const std::vector<at::Tensor>& prologue_values =
      prologue_ != nullptr ? prologue_->views() : kNoPrologue;
  // The warm-up updates a scratch copy of an input read in place that the plan updates, not the
  // caller's tensor (which the replay that follows the capture updates, once, as eager would).
  std::vector<at::Tensor> warm_read = read;
  for (const Plan::InputUpdate& u : plan_->input_updates()) {
    const auto i = static_cast<size_t>(u.call_index);
    if (u.call_index >= 0 && i < read.size() && !copied_[i]) warm_read[i] = StaticCopy(read[i]);
  }
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
  WaitFor(side, current);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    std::vector<at::Tensor> warm;
    KILN_RETURN_IF_ERROR(plan_->RunWithPrologue(prologue_values, warm_read, &warm)
                             .Prefixed("the warm-up before capture failed: "));
    warm.clear();
    std::unique_lock<std::mutex> pool_lock = pool_->Lock();
    pool_->OrderAfterLast(side);
    if (own_memory_) pool_->CountOwnCapture();
    // Thread-local: other threads' CUDA calls during the capture are not disturbed; this
    // thread's unsafe ones (a host synchronisation) fail the capture. Own memory: a private pool
    // of the graph's own ({0, 0}: torch makes one).
    graph->capture_begin(own_memory_ ? c10::MempoolId_t{0, 0} : pool_->Id(device),
                         cudaStreamCaptureModeThreadLocal);
    Status run = plan_->RunWithPrologue(prologue_values, read, &static_outputs_);
    try {
      graph->capture_end();
    } catch (const c10::Error& e) {
      if (run.ok()) run = Status::RuntimeError(e.what_without_backtrace());
    }
    if (!run.ok()) {
      static_outputs_.clear();
      try {
        graph.reset();
      } catch (const c10::Error&) {  // The capture's own error says more.
      }
      return run.Prefixed("the capture failed: ");
    }
  }
  WaitFor(current, side);
  bound_addresses_.clear();
  for (const at::Tensor& t : bound_) bound_addresses_.push_back(t.data_ptr());
  prologue_checked_ = prologue;
  graph_ = std::move(graph);
  ++captures_;
  if (own_memory_) {
    // Lent: what the capture allocated, not the inputs', prologue's or bound tensors' storage.
    std::set<const void*> foreign;
    auto add = [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) foreign.insert(t.storage().unsafeGetStorageImpl());
    };
    for (const at::Tensor& t : read) add(t);
    for (const at::Tensor& t : prologue_values) add(t);
    for (const at::Tensor& t : bound_) add(t);
    std::vector<bool> computed;
    for (const Plan::OutputSource& source : sources_) {
      computed.push_back(source.kind == Plan::OutputSource::kComputed);
    }
    lent_.Reset(static_outputs_, computed, foreign);
  }
  return Status::OK();
}

StatusOr<bool> CudaGraphRunner::Replay(
    const std::vector<at::Tensor>& inputs,
    const std::shared_ptr<const std::vector<at::Tensor>>& prologue,
    std::vector<at::Tensor>* outputs) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(plan_->device().index());
  std::unique_lock<std::mutex> pool_lock = pool_->Lock();
  pool_->OrderAfterLast(current);
  if (own_memory_) {
    // First the held outputs move (an input may be one: its address is checked after).
    if (!lent_.Reclaim(current, &static_outputs_)) {
      moved_.assign(inputs.size(), false);
      return false;
    }
    if (!placement_.InPlace(inputs, &moved_)) return false;
  }
  // Recomputed since a graph last read it: its new values into the buffers the graph reads.
  if (prologue != nullptr) prologue_->Refresh(prologue);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (copied_[i] && inputs[i].data_ptr() != static_inputs_[i].data_ptr()) {
      static_inputs_[i].copy_(inputs[i]);
    }
  }
  graph_->replay();
  for (const Plan::InputUpdate& u : plan_->input_updates()) {
    // The graph wrote the static input; the caller's own tensor is the one eager updates.
    const auto i = static_cast<size_t>(u.call_index);
    if (copied_[i] && inputs[i].data_ptr() != static_inputs_[i].data_ptr()) {
      inputs[i].copy_(static_inputs_[i]);
    }
  }
  outputs->clear();
  outputs->reserve(sources_.size());
  for (size_t i = 0; i < sources_.size(); ++i) {
    switch (sources_[i].kind) {
      case Plan::OutputSource::kInput:
        outputs->push_back(inputs[sources_[i].index]);
        break;
      case Plan::OutputSource::kBound:
        outputs->push_back(static_outputs_[i]);
        break;
      case Plan::OutputSource::kComputed: {
        // The same value named twice is one tensor, as Plan::Run returns it.
        size_t same = 0;
        while (same < i && !static_outputs_[same].is_same(static_outputs_[i])) ++same;
        outputs->push_back(same < i            ? (*outputs)[same]
                           : lent_.lent(i) ? LentOutputs::Alias(static_outputs_[i])
                                           : static_outputs_[i].clone());
        break;
      }
    }
  }
  return true;
}

}  // namespace kiln::runtime
