// CudaGraphRunner: a CUDA plan captured once into a CUDA graph and replayed on later calls,
// with the copies that keep replays correct (inputs in, outputs out, the prologue's values).
#ifndef KILN_RUNTIME_CUDA_GRAPH_RUNNER_H_
#define KILN_RUNTIME_CUDA_GRAPH_RUNNER_H_

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGraph.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/cuda_graph_memory.h"
#include "runtime/cuda_graph_pool.h"
#include "runtime/plan_runtime.h"
#include "status.h"

namespace kiln::runtime {

// Policy. The first call that can use a graph captures one: it copies the inputs into static
// buffers of the same sizes and strides, runs the plan once eagerly on a side stream (the
// warm-up torch requires: cuBLAS and cuDNN make their workspaces there, not during capture),
// captures a second run on that stream into a graph whose memory comes from `pool`, and then
// replays it as every later call does:
//  - Inputs are copied into the static buffers (skipped for one that is already its buffer), on
//    the caller's current stream, before the replay. A call whose inputs differ from the capture's
//    in dtype, sizes, strides or device, or are not dense with storage offset 0, runs the plan
//    without the graph.
//  - Outputs are copied out of the graph's static outputs into new tensors from the caching
//    allocator after the replay, so an output the caller still holds is never overwritten by a
//    later replay (one device copy per output; the graph's memory stays the graph's). An output
//    that is one of the call's inputs, or a bound tensor, is returned as Plan::Run returns it.
//  - Bound tensors (parameters, constants) are read by the graph at their addresses: an in-place
//    update is seen by the next replay. One whose storage moved (`param.data = ...`) would leave
//    the graph reading freed memory, so every replay compares their data pointers and captures
//    again when one moved.
//  - The prologue (values derived from parameters, Plan::PrologueValues) is never captured: the
//    graph reads a PrologueCopy of its values (its own, or one shared by the plan's graphs), and
//    a replay that finds the plan's values recomputed (a parameter it reads changed) copies the
//    new values into that copy first, or captures again when a layout changed.
//  - Inputs the plan updates in place (Plan::input_updates) are copied back from their static
//    buffers into the caller's tensors after the replay.
// With memory of its own (`own_memory`: a training step's forward and backward graphs, which
// pass hundreds of tensors between them every step), the copies that dominate such a step are
// left out where eager's answer does not need them:
//  - The graph captures into a private memory pool of its own (no other graph's intermediates
//    share its addresses) and lends its outputs instead of copying them (LentOutputs: an output
//    the caller still holds at the next replay is moved aside first, and copied from then on).
//  - Inputs that are at the same address on every call (the parameters, the activations a
//    forward graph lends its backward) are read there, in place; the others are copied
//    (InputPlacement: the first calls run the plan without a graph while it observes them). A
//    replay that finds an input read in place elsewhere drops the graph, and observing starts
//    again. An input the plan updates (a batch norm's running statistics) is updated where it
//    is by the replay itself; the warm-up before the capture updates a scratch copy.
// A plan that calls an op known to synchronise with the host (nonzero, masked_select, item,
// unique, ...: ops whose result's size or value the host must read) is never captured: a capture
// that fails part-way leaves torch's CUDA generator in its capturing state, so that every later
// random op of the process fails. Nor is one that draws random numbers (the warm-up run would
// move the generator, so the first call would not draw eager's numbers), updates a parameter
// (the warm-up would update it once more) or changes an input's layout in place. Any other capture
// that fails makes the runner run the plan without a graph from then on. Either way Run says so
// once through `note`. A replay never falls back silently to a different result: errors are
// returned as Plan::Run's are.
//
// Run may be called from several threads: calls of one runner are serialised, and the pool
// orders the replays of all runners sharing it.
// Whether a graph can take `t` as an input: copied into a static buffer of exactly its layout
// (defined, dense, storage offset 0).
bool GraphCopyable(const at::Tensor& t);

// The prologue's values (Plan::PrologueValues) as captured graphs read them: each value in its
// exact layout (a broadcast or sliced view is a view of the same sizes, strides and offset) over
// a copy of the storage span it reads. One copy serves every graph of a plan (the graphs
// CudaGraphShapes records per shape would otherwise each hold the prologue: a decoder's
// transposed weights, hundreds of MB).
class PrologueCopy {
 public:
  // Copies `values` on the current stream; an error for a value with a negative stride.
  static Status Make(const std::shared_ptr<const std::vector<at::Tensor>>& values,
                     std::shared_ptr<PrologueCopy>* made);
  // Whether `values` have the layouts of those copied.
  bool Fits(const std::vector<at::Tensor>& values) const;
  // Copies `values` in when they are not the ones copied last (recomputed: a parameter the
  // prologue reads changed). Under the pool's lock, ordered after the last replay.
  void Refresh(const std::shared_ptr<const std::vector<at::Tensor>>& values);
  const std::vector<at::Tensor>& views() const { return views_; }
  int64_t bytes() const;

 private:
  std::vector<at::Tensor> views_;  // What the graphs read, laid over
  std::vector<at::Tensor> spans_;  // these copies of the values' storage spans.
  std::shared_ptr<const std::vector<at::Tensor>> source_;  // What was copied last.
};

// The copy the graphs of one plan share: the one that fits the plan's prologue values now.
class PrologueCopies {
 public:
  // Under the pool's lock, ordered after the last replay: the current copy refreshed to
  // `values`, or a new copy when their layouts changed (graphs captured with the old one keep
  // it alive until they are captured again).
  Status For(const std::shared_ptr<const std::vector<at::Tensor>>& values,
             std::shared_ptr<PrologueCopy>* copy);
  // The bytes of the current copy (0 before the first).
  int64_t bytes() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<PrologueCopy> current_;
};

class CudaGraphRunner {
 public:
  // `prologue`: the copy of the prologue's values this graph shares with the plan's other
  // graphs; null: a copy of its own.
  // `own_memory`: see above (the pool still orders its replays).
  CudaGraphRunner(std::shared_ptr<const Plan> plan, std::shared_ptr<CudaGraphPool> pool,
                  std::shared_ptr<PrologueCopies> prologue = nullptr, bool own_memory = false);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // Plan::Run's contract. Sets *note (otherwise left alone) when this call found that the plan
  // cannot be captured: "why", for one warning.
  Status Run(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>* outputs,
             std::string* note);

  // Whether a graph is captured now; how many captures have been made (a re-capture after a
  // parameter moved counts again).
  bool captured() const;
  int captures() const;
  // Outputs moved aside because the caller held them at a replay (own memory only).
  int moved_outputs() const;
  // Whether the runner gave up on graphs (a capture failed, or the plan can never be captured).
  bool disabled() const;
  // Why `plan` can never be captured (the policy's refusals); empty when it can.
  static std::string Refusal(const Plan& plan);
  // The bytes the captured graph holds of its own: static inputs, outputs, and the prologue's
  // copy when it is not shared (its intermediates are the pool's). 0 before a capture.
  int64_t bytes() const;

 private:
  bool Matches(const std::vector<at::Tensor>& inputs) const;
  bool BoundMoved() const;
  Status Capture(const std::vector<at::Tensor>& inputs,
                 const std::shared_ptr<const std::vector<at::Tensor>>& prologue);
  // False (nothing run) when an input read in place is not where it was captured (moved_), or
  // the graph's outputs lost their memory: the caller drops the graph.
  StatusOr<bool> Replay(const std::vector<at::Tensor>& inputs,
                        const std::shared_ptr<const std::vector<at::Tensor>>& prologue,
                        std::vector<at::Tensor>* outputs);
  void Drop();  // Forgets the graph (after waiting for its replays): captured again next call.

  const std::shared_ptr<const Plan> plan_;
  const std::shared_ptr<CudaGraphPool> pool_;
  const std::vector<Plan::OutputSource> sources_;
  const std::vector<at::Tensor> bound_;  // The plan's bound tensors, watched for moves.
  const bool shared_prologue_;
  const std::shared_ptr<PrologueCopies> copies_;
  const bool own_memory_;

  mutable std::mutex mutex_;  // Guards everything below.
  bool disabled_ = false;
  std::string pending_note_;  // Why the plan is never captured, until Run has said it.
  int captures_ = 0;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  std::vector<at::Tensor> static_inputs_;  // Undefined for an input read in place.
  std::vector<at::Tensor> static_outputs_;
  // Per input, whether the graph copies it (else it reads it in place, where placement_ saw it
  // at capture); all copied without own memory.
  std::vector<bool> copied_;
  InputPlacement placement_;
  std::vector<bool> moved_;  // Inputs read in place that the last replay found elsewhere.
  LentOutputs lent_;
  std::shared_ptr<PrologueCopy> prologue_;  // What the graph reads for the prologue's values.
  // The prologue values whose layouts were last checked against prologue_'s.
  std::shared_ptr<const std::vector<at::Tensor>> prologue_checked_;
  std::vector<const void*> bound_addresses_;                        // At capture.
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CUDA_GRAPH_RUNNER_H_
