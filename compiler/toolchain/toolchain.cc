// Running g++ on generated code. The ISA is checked against a fixed list before it reaches the
// command line; the environment is passed through so the daemon's PATH finds the compiler.
#include "compiler/toolchain/toolchain.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace kiln::compiler {
namespace {

struct RunResult {
  int exit_code = -1;
  bool timed_out = false;
  std::string output;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs argv with stdout and stderr into `log_path`; kills it after `timeout`.
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv, const std::string& log_path,
                              std::chrono::seconds timeout) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // The daemon's sockets and database files are none of the compiler's business.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
  // Its own process group, so that a timeout kills cc1plus, as and ld along with the driver.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot run ", argv[0], ": ", std::strerror(rc)));
  }
  RunResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return absl::InternalError("waitpid failed");
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      result.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.output = ReadFile(log_path);
  return result;
}

std::string FirstLines(const std::string& text, int n) {
  std::istringstream in(text);
  std::string line, out;
  for (int i = 0; i < n && std::getline(in, line); ++i) absl::StrAppend(&out, line, "\n");
  return out;
}

constexpr char kBuildDirPrefix[] = "kilnd-cc-";
constexpr char kOwnerFile[] = "kilnd.pid";

std::string TempBase() {
  const char* base = std::getenv("TMPDIR");
  return base && *base ? base : "/tmp";
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = absl::StrCat(TempBase(), "/", kBuildDirPrefix, "XXXXXX");
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) return;  // mode 0700
    path_ = buf.data();
    // Whose it is, for RemoveOrphanedBuildDirs when this process dies before the destructor.
    std::ofstream(path_ + "/" + kOwnerFile) << ::getpid() << "\n";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

int Toolchain::RemoveOrphanedBuildDirs() {
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(TempBase(), ec)) {
    const std::string name = entry.path().filename().string();
    struct stat st;
    if (name.rfind(kBuildDirPrefix, 0) != 0 || ::lstat(entry.path().c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      continue;
    }
    std::ifstream owner(entry.path() / kOwnerFile);
    long pid = 0;
    if (!(owner >> pid) || pid <= 0) continue;  // being made, or not one of ours
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // it runs
    std::error_code rm;
    std::filesystem::remove_all(entry.path(), rm);
    if (!rm) ++removed;
  }
  return removed;
}

Toolchain::Toolchain(std::string cxx, std::chrono::seconds timeout)
    : cxx_(std::move(cxx)), timeout_(timeout) {
  RemoveOrphanedBuildDirs();
  // Queried once: a daemon whose compiler is upgraded under it keeps its version until restart.
  TempDir dir;
  auto query = [&](const std::string& flag) -> std::string {
    if (dir.path().empty()) return "unknown";
    auto r = Run({cxx_, flag}, dir.path() + "/version.txt", std::chrono::seconds(30));
    if (!r.ok() || r->exit_code != 0) return "unknown";
    std::string line = FirstLines(r->output, 1);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return line;
  };
  const std::string full = query("-dumpfullversion");
  const std::string banner = query("--version");
  version_ = absl::StrCat(full, "|", banner, "|", absl::StrJoin(Flags("<isa>"), " "), "|",
                          absl::StrJoin(Libraries(BaselineIsa()), " "));
}

std::string Toolchain::BaselineIsa() {
#if defined(__aarch64__)
  return "armv8-a";
#else
  return "x86-64";
#endif
}

bool Toolchain::HostBuildsFor(const std::string& isa) {
  const bool arm = isa.rfind("armv8", 0) == 0;
#if defined(__aarch64__)
  return arm;
#elif defined(__x86_64__)
  return !arm;
#else
  return false;
#endif
}

bool Toolchain::KnownIsa(const std::string& isa) {
  static const char* kKnown[] = {"x86-64",    "x86-64-v2", "x86-64-v3",
                                 "x86-64-v4", "armv8-a",   "armv8.2-a"};
  for (const char* k : kKnown) {
    if (isa == k) return true;
  }
  return false;
}

std::vector<std::string> Toolchain::Flags(const std::string& isa) {
  // -fopenmp-simd: the `omp simd` pragmas only. Kernels bring no OpenMP runtime of their own:
  // they run in parallel through the parallel_for the runtime passes them (torch's threads).
  return {"-O3",
          "-march=" + isa,
          "-mtune=generic",
          "-fopenmp-simd",
          "-fPIC",
          "-shared",
          "-fno-math-errno",
          "-fno-trapping-math",
          "-std=c++17",
          "-w"};
}

std::vector<std::string> Toolchain::Libraries(const std::string& isa) {
  // libmvec (the vector variants the generated prelude declares) exists on x86-64 glibc.
  if (isa.rfind("x86-64", 0) == 0) return {"-lmvec", "-lm"};
  return {"-lm"};
}

absl::StatusOr<std::string> Toolchain::BuildSharedObject(const std::string& source,
                                                         const std::string& isa) const {
  if (!KnownIsa(isa))
    return absl::InvalidArgumentError(absl::StrCat("unknown cpu_isa '", isa, "'"));
  TempDir dir;
  if (dir.path().empty()) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  const std::string src = dir.path() + "/kernels.cc", out = dir.path() + "/kernels.so";
  {
    std::ofstream f(src, std::ios::binary);
    f << source;
    if (!f) return absl::InternalError("cannot write generated source");
  }
  std::vector<std::string> argv{cxx_};
  for (std::string& flag : Flags(isa)) argv.push_back(std::move(flag));
  argv.insert(argv.end(), {"-o", out, src});
  for (std::string& lib : Libraries(isa)) argv.push_back(std::move(lib));
  auto r = Run(argv, dir.path() + "/cc.log", timeout_);
  if (!r.ok()) return r.status();
  if (r->timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(cxx_, " ran past ", timeout_.count(), " s"));
  }
  if (r->exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(cxx_, " failed (exit ", r->exit_code, "): ", FirstLines(r->output, 20)));
  }
  std::string so = ReadFile(out);
  if (so.empty()) return absl::InternalError(absl::StrCat(cxx_, " produced no shared object"));
  return so;
}

}  // namespace kiln::compiler
