// KernelLibrary: an artifact's CPU kernels, loaded from the shared-object bytes held in memory,
// and the lookup of each kernel by its exported symbol. Owns the dlopen handle.
#ifndef KILN_RUNTIME_KERNEL_LIBRARY_H_
#define KILN_RUNTIME_KERNEL_LIBRARY_H_

#include <memory>
#include <string>
#include <string_view>

#include "kiln/v1/kernel_abi.h"
#include "status.h"

namespace kiln::runtime {

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
  // Loads `elf`: kInvalidArgument when it is not an ELF object, kIOError saying why when the
  // system cannot load it.
  static StatusOr<std::unique_ptr<KernelLibrary>> Load(std::string_view elf);
  // dlclose: no kernel of this library may be running or be called afterwards.
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  // The kernel exported as `symbol` (the ABI of kiln/v1/kernel_abi.h); kNotFound when missing.
  StatusOr<kiln_kernel_fn> Resolve(const std::string& symbol) const;

 private:
  explicit KernelLibrary(void* handle) : handle_(handle) {}

  void* handle_;  // From dlopen; never null.
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_KERNEL_LIBRARY_H_
