// Loading NVRTC with dlopen and building with it. The few entry points kilnd calls are declared
// here (their C signatures are stable across CUDA 11..13), so the build needs no CUDA header.
#include "compiler/toolchain/nvrtc.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::compiler {

struct Nvrtc::Api {
  using Program = void*;  // nvrtcProgram
  using Result = int;     // nvrtcResult; 0 is NVRTC_SUCCESS
  Result (*create)(Program*, const char* src, const char* name, int num_headers,
                   const char* const* headers, const char* const* include_names);
  Result (*compile)(Program, int num_options, const char* const* options);
  Result (*log_size)(Program, size_t*);
  Result (*log)(Program, char*);
  Result (*cubin_size)(Program, size_t*);
  Result (*cubin)(Program, char*);
  Result (*ptx_size)(Program, size_t*);
  Result (*ptx)(Program, char*);
  Result (*destroy)(Program*);
  Result (*version)(int* major, int* minor);
  const char* (*error_string)(Result);
};

namespace {

// The part of NVRTC's log an error carries: its first errors say what went wrong.
constexpr size_t kLogBytes = 4096;

// Resolves every entry point of Api from `handle`; false (with the missing name) when one lacks.
bool Resolve(void* handle, Nvrtc::Api* api, std::string* missing);

}  // namespace

std::vector<std::string> Nvrtc::Candidates(const std::string& explicit_path) {
  std::vector<std::string> c;
  if (!explicit_path.empty()) c.push_back(explicit_path);
  c.insert(c.end(), {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"});
  return c;
}

absl::StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::Load(const std::vector<std::string>& candidates) {
  std::vector<std::string> failures;
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      failures.push_back(e != nullptr ? e : name);
      continue;
    }
    auto api = std::make_unique<Api>();
    std::string missing;
    if (!Resolve(handle, api.get(), &missing)) {
      failures.push_back(absl::StrCat(name, ": no ", missing));
      dlclose(handle);
      continue;
    }
    int major = 0, minor = 0;
    api->version(&major, &minor);
    // NVRTC opens libnvrtc-builtins.so.<major>.<minor> by name when it compiles; loaded here
    // from libnvrtc's own directory, the loader then finds it by its soname.
    char origin[PATH_MAX] = {};
    if (dlinfo(handle, RTLD_DI_ORIGIN, origin) == 0) {
      const std::string path = absl::StrCat(origin, "/libnvrtc-builtins.so.", major, ".", minor);
      if (std::filesystem::exists(path)) dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
    return std::unique_ptr<Nvrtc>(new Nvrtc(std::move(api), name));
  }
  return absl::UnimplementedError(absl::StrCat("no NVRTC (set KILN_NVRTC to a libnvrtc.so.*): ",
                                               absl::StrJoin(failures, "; ")));
}

Nvrtc::Nvrtc(std::unique_ptr<Api> api, std::string library)
    : api_(std::move(api)), library_(std::move(library)) {
  int major = 0, minor = 0;
  api_->version(&major, &minor);
  version_ = absl::StrCat("nvrtc-", major, ".", minor);
}

// libnvrtc stays loaded for the rest of the process (no dlclose): the threads a split compile
// starts outlive the compile, and unmapping the library's code under them crashes the process.
Nvrtc::~Nvrtc() = default;

std::vector<std::string> Nvrtc::Flags() {
  // Exact IEEE division and square root, denormals kept, contraction into FMA allowed (what
  // ATen's own CUDA kernels are built with): results match eager within float tolerance.
  return {"-std=c++17",       "--fmad=true", "--prec-div=true",
          "--prec-sqrt=true", "--ftz=false", "-default-device"};
}

int Nvrtc::SplitThreads() const {
  // NVRTC 12.4 and later optimize a program's functions on several threads (--split-compile):
  // a graph's kernels are independent functions, so its build takes a fraction of the time. The
  // output is the same kernels (deterministic for a given thread count, which is fixed here so
  // that every kilnd builds the same bytes).
  int major = 0, minor = 0;
  api_->version(&major, &minor);
  if (major < 12 || (major == 12 && minor < 4)) return 1;
  return kSplitThreads;
}

absl::StatusOr<CudaBinary> Nvrtc::Build(const std::string& source, const std::string& arch) const {
  if (arch.rfind("sm_", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a real architecture: ", arch));
  }
  Api::Program program = nullptr;
  if (Api::Result r =
          api_->create(&program, source.c_str(), "kiln_kernels.cu", 0, nullptr, nullptr);
      r != 0) {
    return absl::InternalError(absl::StrCat("nvrtcCreateProgram: ", api_->error_string(r)));
  }
  struct Destroy {
    const Api* api;
    Api::Program* program;
    ~Destroy() { api->destroy(program); }
  } destroy{api_.get(), &program};
  // One compile for the real architecture yields both: its cubin, and the PTX it was made from,
  // which is the compute_XY PTX (".target sm_XY", what a compute_XY build gives, byte for byte).
  std::vector<std::string> flags = Flags();
  flags.push_back("--gpu-architecture=" + arch);
  if (const int threads = SplitThreads(); threads > 1) {
    flags.push_back(absl::StrCat("--split-compile=", threads));
  }
  std::vector<const char*> options;
  for (const std::string& f : flags) options.push_back(f.c_str());
  const Api::Result compiled =
      api_->compile(program, static_cast<int>(options.size()), options.data());
  if (compiled != 0) {
    size_t size = 0;
    std::string log;
    if (api_->log_size(program, &size) == 0 && size > 1) {
      log.resize(size);
      if (api_->log(program, log.data()) != 0) log.clear();
      log.resize(log.find('\0') == std::string::npos ? log.size() : log.find('\0'));
    }
    return absl::InternalError(absl::StrCat("NVRTC (", arch, ") failed: ",
                                            api_->error_string(compiled), "\n",
                                            log.substr(0, kLogBytes)));
  }
  CudaBinary binary;
  absl::StatusOr<std::string> cubin = Output(program, true);
  if (!cubin.ok()) return cubin.status();
  binary.cubin = std::move(*cubin);
  absl::StatusOr<std::string> ptx = Output(program, false);
  if (!ptx.ok()) return ptx.status();
  binary.ptx = std::move(*ptx);
  return binary;
}

absl::StatusOr<std::string> Nvrtc::Output(Api::Program program, bool cubin) const {
  size_t size = 0;
  std::string out;
  const Api::Result sized =
      cubin ? api_->cubin_size(program, &size) : api_->ptx_size(program, &size);
  if (sized != 0) {
    return absl::InternalError(absl::StrCat("NVRTC output size: ", api_->error_string(sized)));
  }
  out.resize(size);
  const Api::Result got = cubin ? api_->cubin(program, out.data()) : api_->ptx(program, out.data());
  if (got != 0) return absl::InternalError(absl::StrCat("NVRTC output: ", api_->error_string(got)));
  if (!cubin && !out.empty() && out.back() == '\0') out.pop_back();  // PTX text ends in a NUL
  if (out.empty()) return absl::InternalError("NVRTC produced nothing");
  return out;
}

namespace {

template <typename Fn>
bool Bind(void* handle, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr && missing->empty()) *missing = name;
  return *fn != nullptr;
}

bool Resolve(void* handle, Nvrtc::Api* api, std::string* missing) {
  bool ok = true;
  ok &= Bind(handle, "nvrtcCreateProgram", &api->create, missing);
  ok &= Bind(handle, "nvrtcCompileProgram", &api->compile, missing);
  ok &= Bind(handle, "nvrtcGetProgramLogSize", &api->log_size, missing);
  ok &= Bind(handle, "nvrtcGetProgramLog", &api->log, missing);
  ok &= Bind(handle, "nvrtcGetCUBINSize", &api->cubin_size, missing);
  ok &= Bind(handle, "nvrtcGetCUBIN", &api->cubin, missing);
  ok &= Bind(handle, "nvrtcGetPTXSize", &api->ptx_size, missing);
  ok &= Bind(handle, "nvrtcGetPTX", &api->ptx, missing);
  ok &= Bind(handle, "nvrtcDestroyProgram", &api->destroy, missing);
  ok &= Bind(handle, "nvrtcVersion", &api->version, missing);
  ok &= Bind(handle, "nvrtcGetErrorString", &api->error_string, missing);
  return ok;
}

}  // namespace

}  // namespace kiln::compiler
