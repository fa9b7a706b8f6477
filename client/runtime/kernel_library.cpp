// Loading an artifact's kernels: memfd_create + dlopen of /proc/self/fd/N, so the bytes never
// touch a shared file system; a private 0700 temporary directory where memfd cannot be used.
#include "runtime/kernel_library.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kiln::runtime {
namespace {

constexpr int kOpenFlags = RTLD_NOW | RTLD_LOCAL;

// Writes all of `bytes`; false (errno set) on failure.
bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string DlError() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

// glibc finds an already loaded object by the exact path string before it looks at the file, so
// dlopen("/proc/self/fd/5") returns the library an earlier plan loaded through fd 5 (closed and
// reused since, but the object is still loaded, or kept by RTLD_NODELETE / unique symbols), and
// the new plan would silently run the old kernels. Each "./" spells the same file under a name
// no loaded object has; RTLD_NOLOAD finds the first such name without loading anything.
void* OpenFromMemfd(std::string_view elf, std::string* error) {
#ifdef MFD_EXEC
  // Where vm.memfd_noexec is set, a memfd made without MFD_EXEC cannot be mapped executable.
  int fd = ::memfd_create("kiln-kernels", MFD_CLOEXEC | MFD_EXEC);
  if (fd < 0 && errno == EINVAL) fd = ::memfd_create("kiln-kernels", MFD_CLOEXEC);
#else
  int fd = ::memfd_create("kiln-kernels", MFD_CLOEXEC);
#endif
  if (fd < 0) {
    *error = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  void* handle = nullptr;
  if (!WriteAll(fd, elf)) {
    *error = std::string("writing the memfd: ") + std::strerror(errno);
  } else {
    const std::string fd_name = std::to_string(fd);
    std::string dir = "/proc/self/fd/";
    for (int attempt = 0; attempt < 64 && handle == nullptr; ++attempt, dir += "./") {
      const std::string path = dir + fd_name;
      if (void* stale = ::dlopen(path.c_str(), kOpenFlags | RTLD_NOLOAD)) {
        ::dlclose(stale);  // Drops the reference the probe took.
        continue;
      }
      handle = ::dlopen(path.c_str(), kOpenFlags);
      if (handle == nullptr) {
        *error = DlError();
        break;
      }
    }
    if (handle == nullptr && error->empty()) *error = "every /proc/self/fd name is taken";
  }
  ::close(fd);  // The mappings keep the pages.
  return handle;
}

void* OpenFromTempFile(std::string_view elf, std::string* error) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln-kernels-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {  // mkdtemp makes it 0700: no one else can swap files.
    *error = "mkdtemp in " + dir + ": " + std::strerror(errno);
    return nullptr;
  }
  const std::string path = dir + "/kernels.so";
  void* handle = nullptr;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700);
  if (fd < 0) {
    *error = "open " + path + ": " + std::strerror(errno);
  } else {
    const bool written = WriteAll(fd, elf);
    const int write_errno = errno;
    ::close(fd);
    if (!written) {
      *error = "write " + path + ": " + std::strerror(write_errno);
    } else {
      handle = ::dlopen(path.c_str(), kOpenFlags);  // A unique path: no stale name to match.
      if (handle == nullptr) *error = DlError();
    }
    ::unlink(path.c_str());
  }
  ::rmdir(dir.c_str());
  return handle;
}

}  // namespace

StatusOr<std::unique_ptr<KernelLibrary>> KernelLibrary::Load(std::string_view elf) {
  if (elf.size() < 4 || elf.substr(0, 4) != std::string_view("\x7f"
                                                             "ELF",
                                                             4)) {
    return Status::InvalidArgument("the kernel binary is not an ELF shared object");
  }
  std::string memfd_error;
  void* handle = OpenFromMemfd(elf, &memfd_error);
  std::string file_error;
  if (handle == nullptr) handle = OpenFromTempFile(elf, &file_error);
  if (handle == nullptr) {
    return Status::IOError("cannot load the kernel binary: through a memfd: " + memfd_error +
                           "; through a temporary file: " + file_error);
  }
  return std::unique_ptr<KernelLibrary>(new KernelLibrary(handle));
}

KernelLibrary::~KernelLibrary() { ::dlclose(handle_); }

StatusOr<kiln_kernel_fn> KernelLibrary::Resolve(const std::string& symbol) const {
  ::dlerror();
  void* fn = ::dlsym(handle_, symbol.c_str());
  if (fn == nullptr) return Status::NotFound("the kernel binary does not export '" + symbol + "'");
  return reinterpret_cast<kiln_kernel_fn>(fn);
}

}  // namespace kiln::runtime
