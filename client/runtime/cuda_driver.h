// CudaDriver: the CUDA driver API functions the runtime calls, found in libcuda.so.1 with dlopen
// at first use, so kiln._C loads, and CPU plans run, on machines without an NVIDIA driver.
#ifndef KILN_RUNTIME_CUDA_DRIVER_H_
#define KILN_RUNTIME_CUDA_DRIVER_H_

#include <memory>
#include <string>

#include "status.h"

// The driver's opaque handle types, with cuda.h's struct tags: a CUstream_st* is a cudaStream_t,
// and no CUDA header is needed to build this part (a torch without CUDA builds it too).
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;

namespace kiln::runtime {

// The driver entry points, with cuda.h's signatures (CUresult is an int, CUdevice an int), each
// named after its cuX entry point in snake case (cuda.h's macros rename the cuX names themselves,
// cuDevicePrimaryCtxRelease to cuDevicePrimaryCtxRelease_v2). Every pointer is non-null in a
// loaded driver.
struct CudaDriverApi {
  int (*init)(unsigned flags);
  int (*device_get)(int* device, int ordinal);
  int (*primary_ctx_retain)(CUctx_st** context, int device);
  int (*primary_ctx_release)(int device);
  int (*ctx_get_current)(CUctx_st** context);
  int (*ctx_set_current)(CUctx_st* context);
  int (*module_load_data)(CUmod_st** module, const void* image);
  int (*module_unload)(CUmod_st* module);
  int (*module_get_function)(CUfunc_st** function, CUmod_st* module, const char* name);
  int (*func_set_attribute)(CUfunc_st* function, int attribute, int value);
  int (*launch_kernel)(CUfunc_st* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                       unsigned block_x, unsigned block_y, unsigned block_z,
                       unsigned shared_memory_bytes, CUstream_st* stream, void** kernel_params,
                       void** extra);
  int (*get_error_name)(int result, const char** name);
  int (*get_error_string)(int result, const char** text);
};

// cuda.h's CUDA_SUCCESS (cuda_module.cpp checks these values against cuda.h where it is found).
inline constexpr int kCudaSuccess = 0;
// cuFuncSetAttribute's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
inline constexpr int kCudaFuncAttributeMaxDynamicSharedSizeBytes = 8;

// A loaded driver: its entry points, valid while the object lives (the library stays loaded).
// Immutable once loaded, so one object serves every thread.
class CudaDriver {
 public:
  // dlopen(`library`) with every entry point of CudaDriverApi resolved and cuInit(0) done:
  // kIOError naming the library when it does not load (no NVIDIA driver), or the entry point it
  // lacks, or cuInit's error (no device, a driver too old).
  static StatusOr<std::unique_ptr<CudaDriver>> Load(const std::string& library);

  // The process's driver, libcuda.so.1, loaded by the first call; every later call returns the
  // same object or the same error (a driver that is absent stays absent for the process).
  static StatusOr<const CudaDriver*> Process();

  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  const CudaDriverApi& api() const { return api_; }

  // OK for CUDA_SUCCESS; otherwise kRuntimeError "<call>: CUDA_ERROR_X (text)".
  Status Check(int result, const char* call) const;

 private:
  CudaDriver(void* handle, const CudaDriverApi& api) : handle_(handle), api_(api) {}

  void* handle_;  // From dlopen; never null.
  CudaDriverApi api_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CUDA_DRIVER_H_
