// A CUDA graph's own memory: its outputs lent to the caller (moved aside when still held before a
// replay), and the inputs it reads in place.
#include "runtime/cuda_graph_memory.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <map>
#include <utility>

namespace kiln::runtime {
namespace {

// A tensor over `storage` with `like`'s dtype, sizes, strides and storage offset.
at::Tensor Over(const at::Tensor& like, c10::Storage storage) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), like.key_set(),
                                                          like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                 like.storage_offset());
  return t;
}

}  // namespace

at::Tensor LentOutputs::Alias(const at::Tensor& output) { return Over(output, output.storage()); }

void LentOutputs::Reset(const std::vector<at::Tensor>& outputs, const std::vector<bool>& computed,
                        const std::set<const void*>& foreign) {
  Clear();
  of_output_.assign(outputs.size(), -1);
  std::map<const c10::StorageImpl*, int> seen;
  for (size_t i = 0; i < outputs.size() && i < computed.size(); ++i) {
    const at::Tensor& t = outputs[i];
    if (!computed[i] || !t.defined() || !t.has_storage() || t.storage().nbytes() == 0) continue;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    if (foreign.count(impl) != 0) continue;
    auto it = seen.find(impl);
    if (it == seen.end()) {
      it = seen.emplace(impl, static_cast<int>(storages_.size())).first;
      storages_.push_back(Lent{i, impl->data_ptr().get(), 0});
    }
    of_output_[i] = it->second;
  }
  // Counted once here, not per replay: a move rebuilds the same tensors over the new storage.
  std::map<const c10::StorageImpl*, std::set<const c10::TensorImpl*>> own;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && t.has_storage()) {
      own[t.storage().unsafeGetStorageImpl()].insert(t.unsafeGetTensorImpl());
    }
  }
  for (auto& [impl, k] : seen) storages_[k].own = own[impl].size();
}

void LentOutputs::Clear() {
  storages_.clear();
  of_output_.clear();
}

bool LentOutputs::Reclaim(const c10::cuda::CUDAStream& stream, std::vector<at::Tensor>* outputs) {
  std::vector<size_t> held;
  for (size_t k = 0; k < storages_.size(); ++k) {
    const at::Tensor& one = (*outputs)[storages_[k].output];
    const c10::StorageImpl* impl = one.storage().unsafeGetStorageImpl();
    if (impl->data_ptr().get() != storages_[k].address) return false;
    if (storages_[k].lend && one.storage().use_count() > storages_[k].own) held.push_back(k);
  }
  if (held.empty()) return true;
  // Whatever any stream queued that reads the held tensors finishes before their memory is
  // copied and then written by the replay.
  c10::cuda::device_synchronize();
  const std::vector<at::Tensor> before = *outputs;  // Keeps every old tensor alive meanwhile.
  for (size_t k : held) {
    c10::StorageImpl* impl = before[storages_[k].output].storage().unsafeGetStorageImpl();
    const size_t nbytes = impl->nbytes();
    at::DataPtr fresh = c10::cuda::CUDACachingAllocator::get()->allocate(nbytes);
    C10_CUDA_CHECK(cudaMemcpyAsync(fresh.get(), impl->data_ptr().get(), nbytes,
                                   cudaMemcpyDeviceToDevice, stream.stream()));
    // The holders' storage now owns the copy; the graph's memory gets a storage of its own.
    at::DataPtr graphs = impl->set_data_ptr(std::move(fresh));
    c10::Storage mine(c10::Storage::use_byte_size_t(), nbytes, std::move(graphs),
                      impl->allocator(), /*resizable=*/false);
    std::map<const c10::TensorImpl*, at::Tensor> rebuilt;  // An output named twice stays one.
    for (size_t i = 0; i < before.size(); ++i) {
      const at::Tensor& t = before[i];
      if (!t.defined() || !t.has_storage() || t.storage().unsafeGetStorageImpl() != impl) continue;
      auto it = rebuilt.find(t.unsafeGetTensorImpl());
      if (it == rebuilt.end()) it = rebuilt.emplace(t.unsafeGetTensorImpl(), Over(t, mine)).first;
      (*outputs)[i] = it->second;
    }
    storages_[k].lend = false;
    ++moved_;
  }
  // The copies are complete before a holder can read them on any stream.
  stream.synchronize();
  return true;
}

InputPlacement::InputPlacement(size_t inputs)
    : sticky_(inputs, false), copied_(inputs, false), last_(inputs), moves_(inputs, 0) {}

InputPlacement::Address InputPlacement::Address::Of(const at::Tensor& t) {
  if (!t.defined()) return Address{};
  return Address{t.data_ptr(), t.scalar_type(), t.sizes().vec(), t.strides().vec()};
}

bool InputPlacement::Address::Is(const at::Tensor& t) const {
  return t.defined() && t.data_ptr() == address && t.scalar_type() == dtype &&
         t.sizes() == at::IntArrayRef(sizes) && t.strides() == at::IntArrayRef(strides);
}

bool InputPlacement::Observe(const std::vector<at::Tensor>& inputs, int64_t captures) {
  if (inputs.size() != last_.size()) return false;  // Not the plan's call: it fails on its own.
  std::vector<bool> moved_now(inputs.size(), false);
  if (observed_ > 0 && captures == captures_) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      moved_now[i] = !last_[i].Is(inputs[i]);
      if (moved_now[i]) ++moves_[i];
    }
  } else {  // A new baseline.
    observed_ = 0;
    captures_ = captures;
    std::fill(moves_.begin(), moves_.end(), 0);
  }
  for (size_t i = 0; i < inputs.size(); ++i) last_[i] = Address::Of(inputs[i]);
  ++observed_;
  // Decided: each input where it was this call, or elsewhere on every call after the baseline.
  bool decided = observed_ >= 3;
  for (size_t i = 0; decided && i < inputs.size(); ++i) {
    decided = !moved_now[i] || moves_[i] == observed_ - 1;
  }
  if (!decided && observed_ < kMaxObserved) return false;
  for (size_t i = 0; i < inputs.size(); ++i) copied_[i] = sticky_[i] || moved_now[i];
  observed_ = 0;  // The next observation (after a restart) starts from a new baseline.
  return true;
}

bool InputPlacement::InPlace(const std::vector<at::Tensor>& inputs,
                             std::vector<bool>* moved) const {
  moved->assign(inputs.size(), false);
  if (inputs.size() != last_.size()) return false;
  bool all = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    (*moved)[i] = !copied_[i] && !last_[i].Is(inputs[i]);
    all = all && !(*moved)[i];
  }
  return all;
}

void InputPlacement::Restart(const std::vector<bool>& moved) {
  if (++restarts_ > kMaxRestarts) {
    for (size_t i = 0; i < moved.size() && i < sticky_.size(); ++i) {
      if (moved[i]) sticky_[i] = true;
    }
  }
  observed_ = 0;
}

}  // namespace kiln::runtime
