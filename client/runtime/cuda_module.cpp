// Loading a cubin (or its PTX) into a GPU's primary context and launching its kernels with
// cuLaunchKernel on the caller's stream.
#include "runtime/cuda_module.h"

#include <string>
#include <vector>

#ifdef KILN_WITH_CUDA
#include <cuda.h>

static_assert(kiln::runtime::kCudaSuccess == CUDA_SUCCESS);
static_assert(kiln::runtime::kCudaFuncAttributeMaxDynamicSharedSizeBytes ==
              CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(sizeof(CUresult) == sizeof(int) && sizeof(CUdevice) == sizeof(int));
#endif

namespace kiln::runtime {
namespace {

// Makes `context` current on this thread for the scope, then puts back the one that was.
class ScopedContext {
 public:
  ScopedContext(const CudaDriverApi& api, CUctx_st* context) : api_(api) {
    if (api_.ctx_get_current(&prior_) != kCudaSuccess) prior_ = nullptr;
    switched_ = prior_ != context && api_.ctx_set_current(context) == kCudaSuccess;
  }
  ~ScopedContext() {
    if (switched_ && prior_ != nullptr) api_.ctx_set_current(prior_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const CudaDriverApi& api_;
  CUctx_st* prior_ = nullptr;
  bool switched_ = false;
};

// The driver's image loader: cubin bytes as they are; PTX is text, read up to a NUL.
int LoadImage(const CudaDriverApi& api, std::string_view bytes, bool text, CUmod_st** module) {
  if (!text) return api.module_load_data(module, bytes.data());
  const std::string terminated(bytes);
  return api.module_load_data(module, terminated.c_str());
}

}  // namespace

StatusOr<std::unique_ptr<CudaModule>> CudaModule::Load(const CudaDriver& driver, int device,
                                                       std::string_view cubin,
                                                       std::string_view ptx) {
  const CudaDriverApi& api = driver.api();
  if (cubin.empty() && ptx.empty()) {
    return Status::InvalidArgument("the plan launches CUDA kernels but has no cubin and no PTX");
  }
  int cu_device = 0;
  KILN_RETURN_IF_ERROR(driver.Check(api.device_get(&cu_device, device), "cuDeviceGet"));
  CUctx_st* context = nullptr;
  KILN_RETURN_IF_ERROR(
      driver.Check(api.primary_ctx_retain(&context, cu_device), "cuDevicePrimaryCtxRetain"));
  std::unique_ptr<CudaModule> module(new CudaModule(driver, cu_device, context));
  ScopedContext scope(api, context);
  Status cubin_status = Status::InvalidArgument("no cubin");
  if (!cubin.empty()) {
    cubin_status =
        driver.Check(LoadImage(api, cubin, false, &module->module_), "loading the cubin");
    if (cubin_status.ok()) return module;
  }
  if (ptx.empty()) return cubin_status.WithCode(StatusCode::kInvalidArgument);
  Status ptx_status = driver.Check(LoadImage(api, ptx, true, &module->module_), "loading the PTX");
  if (ptx_status.ok()) return module;
  return Status::InvalidArgument(cubin_status.message() + "; " + ptx_status.message());
}

CudaModule::~CudaModule() {
  const CudaDriverApi& api = driver_.api();
  {
    ScopedContext scope(api, context_);
    // Errors are ignored: at interpreter exit the driver may be shut down already.
    if (module_ != nullptr) api.module_unload(module_);
  }
  api.primary_ctx_release(device_);
}

StatusOr<CUfunc_st*> CudaModule::Resolve(const std::string& symbol,
                                         uint32_t shared_memory_bytes) const {
  const CudaDriverApi& api = driver_.api();
  CUfunc_st* function = nullptr;
  if (api.module_get_function(&function, module_, symbol.c_str()) != kCudaSuccess) {
    return Status::NotFound("the CUDA module has no kernel '" + symbol + "'");
  }
  constexpr uint32_t kDefaultSharedMemory = 48 * 1024;
  if (shared_memory_bytes > kDefaultSharedMemory) {
    KILN_RETURN_IF_ERROR(
        driver_.Check(api.func_set_attribute(function, kCudaFuncAttributeMaxDynamicSharedSizeBytes,
                                             static_cast<int>(shared_memory_bytes)),
                      ("cuFuncSetAttribute(" + symbol + ", max dynamic shared memory)").c_str()));
  }
  return function;
}

Status CudaModule::Launch(const CudaKernel& kernel, void* const* args, size_t n,
                          CUstream_st* stream) const {
  const CudaDriverApi& api = driver_.api();
  // cuLaunchKernel takes, per parameter, the address of its value: here the address of each
  // device pointer in `args`. It copies the values before it returns.
  constexpr size_t kInline = 16;
  void* inline_params[kInline];
  std::vector<void*> heap_params;
  void** params = inline_params;
  if (n > kInline) {
    heap_params.resize(n);
    params = heap_params.data();
  }
  for (size_t i = 0; i < n; ++i) params[i] = const_cast<void**>(&args[i]);
  CUctx_st* current = nullptr;
  if (api.ctx_get_current(&current) != kCudaSuccess || current != context_) {
    // A thread torch has not used CUDA on yet has no context; the plan's device guard made this
    // device torch's current one, whose context is this primary context.
    KILN_RETURN_IF_ERROR(driver_.Check(api.ctx_set_current(context_), "cuCtxSetCurrent"));
  }
  return driver_.Check(
      api.launch_kernel(kernel.function, kernel.grid[0], kernel.grid[1], kernel.grid[2],
                        kernel.block[0], kernel.block[1], kernel.block[2],
                        kernel.shared_memory_bytes, stream, params, nullptr),
      "cuLaunchKernel");
}

}  // namespace kiln::runtime
