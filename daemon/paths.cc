// kiln's default paths from the environment (see paths.h); shared by kilnd and kiln._C.
#include "daemon/paths.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace kiln::paths {
namespace {

std::string EnvironmentCacheDir(const Environment& env) {
  if (std::string dir = env("KILN_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/kiln";
  std::string home = env("HOME");
  return (home.empty() ? std::string("/tmp") : home) + "/.cache/kiln";
}

}  // namespace

Environment ProcessEnvironment() {
  return [](const std::string& name) {
    const char* value = std::getenv(name.c_str());
    return std::string(value != nullptr ? value : "");
  };
}

std::string AbsolutePath(const std::string& path) {
  if (path.empty()) return path;
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

KilnPaths ResolvePaths(KilnPaths given, const Environment& env) {
  KilnPaths p = std::move(given);
  if (p.cache_dir.empty()) p.cache_dir = EnvironmentCacheDir(env);
  if (p.socket.empty()) {
    std::string runtime = env("XDG_RUNTIME_DIR");
    p.socket = (!runtime.empty() && env("KILN_CACHE_DIR").empty())
                   ? runtime + "/kiln/kilnd.sock"
                   : EnvironmentCacheDir(env) + "/kilnd.sock";
  }
  if (p.mac_key_file.empty()) {
    std::string key = env("KILN_MAC_KEY_FILE");
    p.mac_key_file = key.empty() ? p.cache_dir + "/mac.key" : key;
  }
  if (p.log_file.empty()) p.log_file = p.cache_dir + "/kilnd.log";
  for (std::string* path : {&p.cache_dir, &p.socket, &p.mac_key_file, &p.log_file}) {
    *path = AbsolutePath(*path);
  }
  return p;
}

}  // namespace kiln::paths
