// CudaModule: an artifact's CUDA kernels (its cubin, or its PTX where the cubin does not load)
// loaded into the primary context of one GPU, the lookup of each kernel by symbol, and its launch.
#ifndef KILN_RUNTIME_CUDA_MODULE_H_
#define KILN_RUNTIME_CUDA_MODULE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/cuda_driver.h"
#include "status.h"

namespace kiln::runtime {

// One kernel of a module and its launch configuration (kiln.v1.KernelLaunch).
struct CudaKernel {
  CUfunc_st* function = nullptr;
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_memory_bytes = 0;  // Dynamic shared memory.
};

// The module lives in the device's primary context, the one torch's CUDA runtime uses, so its
// kernels run on torch's streams and read memory from torch's allocator. Loading it retains that
// context (torch may not have created it yet); the destructor unloads the module and releases it.
// Immutable once loaded: Launch may be called from any thread at once.
class CudaModule {
 public:
  // Loads `cubin` (a cubin for exactly the GPU's architecture) on GPU `device` (torch's index);
  // where the driver refuses it (another architecture) or it is empty, loads `ptx` instead, which
  // the driver compiles for this GPU. kInvalidArgument naming both errors when neither loads.
  static StatusOr<std::unique_ptr<CudaModule>> Load(const CudaDriver& driver, int device,
                                                    std::string_view cubin, std::string_view ptx);
  ~CudaModule();
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  // The kernel `symbol`, allowed `shared_memory_bytes` of dynamic shared memory (past the 48 KiB
  // every kernel may use, the driver must be told); kNotFound when the module lacks it, kRuntime
  // error when the GPU cannot give that much shared memory.
  StatusOr<CUfunc_st*> Resolve(const std::string& symbol, uint32_t shared_memory_bytes) const;

  // Launches `kernel` on `stream` with args[0..n) as its parameters, one pointer each (the kiln.v1
  // CUDA kernel ABI). Makes the module's context current on this thread when another (or none)
  // is. Asynchronous: only launch errors are reported, not the kernel's own.
  Status Launch(const CudaKernel& kernel, void* const* args, size_t n, CUstream_st* stream) const;

 private:
  CudaModule(const CudaDriver& driver, int device, CUctx_st* context)
      : driver_(driver), device_(device), context_(context) {}

  const CudaDriver& driver_;
  int device_;  // The driver's device (CUdevice) whose primary context is retained.
  CUctx_st* context_;
  CUmod_st* module_ = nullptr;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CUDA_MODULE_H_
