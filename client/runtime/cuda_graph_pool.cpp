// The process's CUDA graph memory pool per device, and the ordering of the streams its graphs
// run on.
#include "runtime/cuda_graph_pool.h"

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <c10/core/Event.h>

namespace kiln::runtime {

c10::MempoolId_t CudaGraphPool::Id(c10::DeviceIndex device) {
  auto it = ids_.find(device);
  if (it == ids_.end()) {
    const c10::MempoolId_t id = at::cuda::graph_pool_handle();
    c10::cuda::CUDAGuard guard(device);
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
    c10::cuda::CUDAStreamGuard on_side(side);
    auto anchor = std::make_unique<at::cuda::CUDAGraph>();
    anchor->capture_begin(id, cudaStreamCaptureModeThreadLocal);
    try {
      // A memset node, not a fill kernel: nothing of ATen's to load on a process's first call.
      at::Tensor t =
          at::empty({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device));
      C10_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), side.stream()));
    } catch (...) {
      anchor->capture_end();
      throw;
    }
    anchor->capture_end();
    anchors_.emplace(device, std::move(anchor));
    it = ids_.emplace(device, id).first;
  }
  return it->second;
}

CudaGraphPool::~CudaGraphPool() {
  for (auto& [device, anchor] : anchors_) {
    try {
      anchor.reset();
    } catch (const c10::Error&) {  // the device is gone: nothing left to give back
    }
  }
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

void CudaGraphPool::SetShapeBudget(int64_t graphs, int64_t bytes) {
  std::lock_guard<std::mutex> lock(budget_mutex_);
  max_shape_graphs_ = graphs;
  max_shape_bytes_ = bytes;
}

bool CudaGraphPool::ShapeGraphFits(int64_t bytes) {
  std::lock_guard<std::mutex> lock(budget_mutex_);
  return (max_shape_graphs_ <= 0 || shape_graphs_ + 1 <= max_shape_graphs_) &&
         (max_shape_bytes_ <= 0 || shape_bytes_ + bytes <= max_shape_bytes_);
}

bool CudaGraphPool::ReserveShapeGraph(int64_t bytes) {
  std::lock_guard<std::mutex> lock(budget_mutex_);
  if (max_shape_graphs_ > 0 && shape_graphs_ + 1 > max_shape_graphs_) return false;
  if (max_shape_bytes_ > 0 && shape_bytes_ + bytes > max_shape_bytes_) return false;
  ++shape_graphs_;
  shape_bytes_ += bytes;
  return true;
}

void CudaGraphPool::ReleaseShapeGraph(int64_t bytes) {
  std::lock_guard<std::mutex> lock(budget_mutex_);
  --shape_graphs_;
  shape_bytes_ -= bytes;
}

void CudaGraphPool::AdjustShapeBytes(int64_t delta) {
  std::lock_guard<std::mutex> lock(budget_mutex_);
  shape_bytes_ += delta;
}

}  // namespace kiln::runtime
