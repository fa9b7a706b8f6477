// The memory of a CUDA graph of its own (CudaGraphRunner's own_memory): LentOutputs hands its
// outputs to the caller without a copy and moves one the caller still holds aside before a replay
// would overwrite it; InputPlacement decides which inputs it reads where the caller has them.
#ifndef KILN_RUNTIME_CUDA_GRAPH_MEMORY_H_
#define KILN_RUNTIME_CUDA_GRAPH_MEMORY_H_

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <set>
#include <vector>

namespace kiln::runtime {

// A graph writes its outputs at the addresses of its capture on every replay. Copying each one
// out after the replay (a device copy and an allocation per output) keeps what the caller holds
// apart from what the next replay writes; for a training step's forward graph, whose outputs
// are the activations its backward reads, those copies cost more than the kernels. Lending
// instead returns each output as a new tensor over the graph's own storage, and keeps eager's
// answer by these rules:
//  - Only storage the capture allocated is lent (an output that is an input, a view of one, a
//    prologue value or a bound tensor is the runner's to copy), and only by a graph that
//    captured into a private memory pool of its own: no other graph's intermediates share its
//    addresses, so nothing but its own replay writes them.
//  - Before a replay writes, every lent storage that something besides the runner still
//    references (a tensor, a view, a saved tensor of autograd: counted by the storage's
//    reference count, never guessed) is moved: after a device-wide synchronisation (work any
//    stream queued on it is done), its bytes are copied to new memory from torch's caching
//    allocator, which the storage then owns (every tensor and view over it sees the same
//    values at the new address; the copy is complete before the replay returns), and the graph
//    keeps its memory under a storage of its own. That output is copied out after each replay
//    from then on (one that a program keeps, as a training loop keeps its loss, is moved once).
//  - A storage whose memory is no longer the capture's (the caller resized it) means the graph's
//    outputs are gone: the caller captures again.
// Not thread-safe: the runner calls it under its own lock and the pool's.
class LentOutputs {
 public:
  // After a capture: lends the outputs `computed` marks whose storage is none of `foreign`
  // (the storages of the capture's inputs, prologue values and bound tensors).
  void Reset(const std::vector<at::Tensor>& outputs, const std::vector<bool>& computed,
             const std::set<const void*>& foreign);
  void Clear();

  // Before a replay, on `stream`: moves the lent storages something else holds (rebuilding the
  // runner's `outputs` over the graph's memory). False when a storage's memory is no longer the
  // capture's (nothing was moved then).
  bool Reclaim(const c10::cuda::CUDAStream& stream, std::vector<at::Tensor>* outputs);

  // Whether output `i` is lent (else it is copied out).
  bool lent(size_t i) const { return i < of_output_.size() && of_output_[i] >= 0 &&
                                     storages_[of_output_[i]].lend; }
  // How many storages were moved so far.
  int moved() const { return moved_; }

  // A new tensor over `output`'s storage, with its sizes, strides and offset.
  static at::Tensor Alias(const at::Tensor& output);

 private:
  struct Lent {
    size_t output;         // One output over it (the runner's static output).
    const void* address;   // Its memory at capture.
    size_t own;            // The runner's references to it: its distinct outputs over it.
    bool lend = true;      // False once moved: copied out from then on.
  };
  std::vector<Lent> storages_;
  std::vector<int> of_output_;  // Per output: its storage in storages_, or -1.
  int moved_ = 0;
};

// Which inputs the graph reads in place (at the caller's addresses of the capture) and which it
// copies into static buffers. An input is read in place when it is at the same address with the
// same layout on every call: a parameter, or the activations a forward graph lends its backward
// once the forward replays. One that is somewhere else on every call (a batch made for each
// step, the gradient autograd starts a backward with) is copied. The plan runs without a graph
// while the calls are observed:
//  - from a first call (the baseline), until two more calls show each input either where it
//    was on the last of them or somewhere new on each; one that stayed and then moved is
//    observed on (the producer of its tensor, another graph, may just have been captured);
//  - and again from the start whenever a graph with memory of its own was captured meanwhile
//    (`captures`: the pool's count, CudaGraphPool::OwnCaptures): the addresses of what it lends
//    have just changed;
//  - but never more than kMaxObserved calls from a baseline: then what is where it was on the
//    last call is read in place.
// When a replay finds an input read in place elsewhere, observing starts again; after
// kMaxRestarts such restarts, an input that moved is copied for good.
class InputPlacement {
 public:
  static constexpr int kMaxObserved = 8;
  static constexpr int kMaxRestarts = 3;

  explicit InputPlacement(size_t inputs);

  // A call that runs without the graph, observed; true when the capture is to be made now
  // (copied() then says where each input goes).
  bool Observe(const std::vector<at::Tensor>& inputs, int64_t captures);
  // Before a replay of the graph captured on the call Observe decided: whether every input read
  // in place is where (and as) it was then; else false, with `moved` marking those that are not.
  bool InPlace(const std::vector<at::Tensor>& inputs, std::vector<bool>* moved) const;
  // A replay found input(s) read in place elsewhere (`moved`): observing starts again.
  void Restart(const std::vector<bool>& moved);

  const std::vector<bool>& copied() const { return copied_; }

 private:
  // Where a tensor is: its address and layout (never the tensor: the caller's memory is not
  // held).
  struct Address {
    const void* address = nullptr;
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> sizes, strides;
    static Address Of(const at::Tensor& t);
    bool Is(const at::Tensor& t) const;
  };
  std::vector<bool> sticky_;   // Copied for good (moved after kMaxRestarts restarts).
  std::vector<bool> copied_;   // The last decision.
  std::vector<Address> last_;  // The last call observed: the capture's, once decided.
  std::vector<int> moves_;     // Per input: calls, of those observed after the baseline, where it moved.
  int observed_ = 0;           // Calls observed since the baseline (0: no baseline).
  int64_t captures_ = -1;      // The pool's count at the baseline.
  int restarts_ = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CUDA_GRAPH_MEMORY_H_
