// KernelLibrary: an artifact's CPU kernels, loaded from the shared-object bytes held in memory,
// and the lookup of each kernel by its exported symbol. Owns the dlopen handle.
#ifndef KILN_RUNTIME_KERNEL_LIBRARY_H_
#define KILN_RUNTIME_KERNEL_LIBRARY_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::runtime {

// The CPU kernel ABI (artifact.proto, KernelLaunch): args[i] is the data_ptr() (storage offset
// applied) of the kernel's i-th argument value; parallel_for runs a range function on the
// caller's intra-op threads.
using KernelRangeFn = void (*)(int64_t begin, int64_t end, void* const* args);
using KernelParallelFor = void (*)(int64_t begin, int64_t end, int64_t grain, KernelRangeFn fn,
                                   void* const* args);
using KernelFn = void (*)(void* const* args, KernelParallelFor parallel_for);

// Loading never puts the bytes where another process could swap them before dlopen reads them:
// they go to an anonymous memfd opened as /proc/self/fd/N, and only where that fails (no
// memfd_create, no /proc, memfds sealed against exec) to a file in a fresh 0700 directory that
// is removed right after dlopen. RTLD_NOW makes an unresolved symbol fail the load rather than
// the first call; RTLD_LOCAL keeps two artifacts that export the same kernel names apart.
//
// Each library is a distinct object even when an earlier one is still loaded under the same
// /proc path (fd numbers are reused), see Load in kernel_library.cpp.
class KernelLibrary {
 public:
  // Loads `elf`; throws std::runtime_error saying why when it cannot.
  explicit KernelLibrary(std::string_view elf);
  // dlclose: no kernel of this library may be running or be called afterwards.
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  // The kernel exported as `symbol`; throws std::runtime_error when it is missing.
  KernelFn Resolve(const std::string& symbol) const;

 private:
  void* handle_ = nullptr;  // From dlopen; never null once constructed.
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_KERNEL_LIBRARY_H_
