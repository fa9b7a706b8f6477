// The process's CUDA graph memory pool per device, and the ordering of the streams its graphs
// run on.
#include "runtime/cuda_graph_pool.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>

namespace kiln::runtime {

c10::MempoolId_t CudaGraphPool::Id(c10::DeviceIndex device) {
  auto it = ids_.find(device);
  if (it == ids_.end()) it = ids_.emplace(device, at::cuda::graph_pool_handle()).first;
  return it->second;
}

void CudaGraphPool::OrderAfterLast(const c10::cuda::CUDAStream& stream) {
  const c10::DeviceIndex device = stream.device_index();
  auto it = last_.find(device);
  if (it == last_.end()) {
    last_.emplace(device, stream);
    return;
  }
  if (it->second == stream) return;
  // An event recorded now on the old stream covers the last graph's work (and whatever followed
  // it there: more waiting than needed, never less).
  c10::Event done(c10::DeviceType::CUDA);
  done.record(it->second);
  done.block(stream);
  it->second = stream;
}

}  // namespace kiln::runtime
