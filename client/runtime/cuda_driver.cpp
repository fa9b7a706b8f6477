// Loading the CUDA driver library and resolving the entry points the runtime calls; the
// process's one driver, loaded on first use.
#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <utility>

namespace kiln::runtime {
namespace {

// The symbol of one entry point: the first of `names` the library exports. Newer drivers keep
// the unversioned name of an entry point whose behaviour changed for old binaries and export the
// current one as "_v2" (cuDevicePrimaryCtxRelease): the current one is tried first.
template <typename Fn>
bool Resolve(void* handle, std::initializer_list<const char*> names, Fn* out,
             std::string* missing) {
  for (const char* name : names) {
    if (void* sym = ::dlsym(handle, name)) {
      *out = reinterpret_cast<Fn>(sym);
      return true;
    }
  }
  *missing = *names.begin();
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Load(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = ::dlerror();
    return Status::IOError("cannot load the CUDA driver " + library + ": " +
                           (e != nullptr ? e : "unknown dlopen error"));
  }
  CudaDriverApi api{};
  std::string missing;
  const bool resolved =
      Resolve(handle, {"cuInit"}, &api.init, &missing) &&
      Resolve(handle, {"cuDeviceGet"}, &api.device_get, &missing) &&
      Resolve(handle, {"cuDevicePrimaryCtxRetain"}, &api.primary_ctx_retain, &missing) &&
      Resolve(handle, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
              &api.primary_ctx_release, &missing) &&
      Resolve(handle, {"cuCtxGetCurrent"}, &api.ctx_get_current, &missing) &&
      Resolve(handle, {"cuCtxSetCurrent"}, &api.ctx_set_current, &missing) &&
      Resolve(handle, {"cuModuleLoadData"}, &api.module_load_data, &missing) &&
      Resolve(handle, {"cuModuleUnload"}, &api.module_unload, &missing) &&
      Resolve(handle, {"cuModuleGetFunction"}, &api.module_get_function, &missing) &&
      Resolve(handle, {"cuFuncSetAttribute"}, &api.func_set_attribute, &missing) &&
      Resolve(handle, {"cuLaunchKernel"}, &api.launch_kernel, &missing) &&
      Resolve(handle, {"cuGetErrorName"}, &api.get_error_name, &missing) &&
      Resolve(handle, {"cuGetErrorString"}, &api.get_error_string, &missing);
  if (!resolved) {
    ::dlclose(handle);
    return Status::IOError("the CUDA driver " + library + " does not export " + missing);
  }
  std::unique_ptr<CudaDriver> driver(new CudaDriver(handle, api));
  // Idempotent, and needed before any other call in a process where torch has not used CUDA yet.
  Status init = driver->Check(api.init(0), "cuInit");
  if (!init.ok()) return init.WithCode(StatusCode::kIOError);
  return driver;
}

StatusOr<const CudaDriver*> CudaDriver::Process() {
  // Loaded once, never unloaded: modules of plans that outlive any owner (a plan freed at
  // interpreter exit) are unloaded through it.
  static const auto* const loaded = new StatusOr<std::unique_ptr<CudaDriver>>(Load("libcuda.so.1"));
  if (!loaded->ok()) return loaded->status();
  return static_cast<const CudaDriver*>(loaded->value().get());
}

CudaDriver::~CudaDriver() { ::dlclose(handle_); }

Status CudaDriver::Check(int result, const char* call) const {
  if (result == kCudaSuccess) return Status::OK();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.get_error_name(result, &name) != kCudaSuccess || name == nullptr) name = "CUDA error";
  if (api_.get_error_string(result, &text) != kCudaSuccess || text == nullptr) text = "";
  return Status::RuntimeError(std::string(call) + ": " + name + " " + std::to_string(result) +
                              " (" + text + ")");
}

}  // namespace kiln::runtime
