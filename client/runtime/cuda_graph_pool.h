// CudaGraphPool: the one private memory pool that all of a process's CUDA graphs capture into
// (per device), and the order it imposes on their captures and replays.
#ifndef KILN_RUNTIME_CUDA_GRAPH_POOL_H_
#define KILN_RUNTIME_CUDA_GRAPH_POOL_H_

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

namespace at::cuda {
struct CUDAGraph;
}

namespace kiln::runtime {

// Graphs that share a pool share memory: a graph's intermediates live in blocks the pool took
// back at the end of its capture, which the next capture may hand out again. That is safe only
// while no two graphs of the pool run at once, so every capture and replay holds Lock(), and
// OrderAfterLast makes the stream it enqueues on wait for the last one's stream when they differ
// (on one stream, replays are ordered already and cost nothing more). Each graph keeps its own
// outputs allocated for its lifetime, so what it returns is never another graph's scratch.
//
// The pool keeps a graph of its own (an anchor: one 1-element memset) captured into it from its
// first use to its destruction. Torch's device and host allocators drop a pool's entry when its
// last graph is destroyed, and a capture into a handle whose entry is gone (a graph captured
// again after its parameters moved, when it was the pool's only graph) fails torch's check that
// a shared pool is live; a graph is what holds both allocators' references.
//
// One object per process (kiln's runtime state makes it, every CUDA plan shares it); a test may
// make its own.
class CudaGraphPool {
 public:
  CudaGraphPool() = default;
  ~CudaGraphPool();
  CudaGraphPool(const CudaGraphPool&) = delete;
  CudaGraphPool& operator=(const CudaGraphPool&) = delete;

  // Held by a graph while it captures or replays, its input and output copies included.
  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mutex_); }

  // Under Lock: the pool's id on `device` (made, and referenced by the pool, by the first
  // capture there).
  c10::MempoolId_t Id(c10::DeviceIndex device);

  // Under Lock, before a capture or replay enqueues work on `stream`: makes `stream` wait for
  // everything enqueued on the stream the previous capture or replay on that device used, when
  // that was another stream; then records `stream` as the last.
  void OrderAfterLast(const c10::cuda::CUDAStream& stream);

  // Under Lock: how many graphs with memory of their own were captured on any device
  // (InputPlacement observes again after one: what it lends is at new addresses); one more.
  int64_t OwnCaptures() const { return own_captures_; }
  void CountOwnCapture() { ++own_captures_; }

  // The budget of the graphs recorded per shape (CudaGraphShapes) of all plans: how many, and
  // the bytes they hold (static inputs, outputs, prologue copies). <= 0: no limit.
  void SetShapeBudget(int64_t graphs, int64_t bytes);
  // Whether one more graph of `bytes` fits the budget now.
  bool ShapeGraphFits(int64_t bytes);
  // Takes one graph of `bytes` from the budget; false (nothing taken) when it does not fit.
  bool ReserveShapeGraph(int64_t bytes);
  void ReleaseShapeGraph(int64_t bytes);
  // Memory the shape graphs hold apart from any one graph (a plan's prologue copy, shared by
  // its graphs): counted against the bytes, never refused (every graph of the plan needs it).
  void AdjustShapeBytes(int64_t delta);

 private:
  std::mutex budget_mutex_;  // The shape graphs' budget: apart from Lock(), held while replaying.
  int64_t max_shape_graphs_ = 0, max_shape_bytes_ = 0;
  int64_t shape_graphs_ = 0, shape_bytes_ = 0;
  std::mutex mutex_;
  int64_t own_captures_ = 0;
  std::map<c10::DeviceIndex, c10::MempoolId_t> ids_;
  std::map<c10::DeviceIndex, std::unique_ptr<at::cuda::CUDAGraph>> anchors_;
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> last_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CUDA_GRAPH_POOL_H_
