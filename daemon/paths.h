// Where kiln keeps its files when nothing names them: the cache directory, kilnd's socket, the
// artifact MAC key and kilnd's log. One rule for kilnd (its defaults, `kilnd --print-paths`) and
// for the client (kiln._C.default_paths), so that neither looks for the other in another place.
//
// Standard C++ and POSIX only: kiln._C compiles this file too (client/CMakeLists.txt), and the
// client must build where there is no gRPC, RocksDB or absl.
#pragma once

#include <functional>
#include <string>

namespace kiln::paths {

struct KilnPaths {
  std::string cache_dir;     // artifact database, MAC key, the client's graph index, kilnd's log
  std::string socket;        // the local kilnd's Unix socket
  std::string mac_key_file;  // HMAC key of artifacts
  std::string log_file;      // where a detached kilnd logs
};

// The value of one environment variable; "" when it is unset (an empty value counts as unset).
using Environment = std::function<std::string(const std::string& name)>;

// The process's own environment (getenv).
Environment ProcessEnvironment();

// Fills in every empty field of `given`, then makes every field absolute (against the working
// directory) and lexically normal. The rules, in order:
//   cache_dir     $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln (HOME unset:
//                 /tmp/.cache/kiln)
//   socket        $XDG_RUNTIME_DIR/kiln/kilnd.sock when XDG_RUNTIME_DIR is set and KILN_CACHE_DIR
//                 is not; otherwise kilnd.sock in the cache directory the environment names (a
//                 private cache directory has a private daemon; a cache directory given as a flag
//                 does not move the socket)
//   mac_key_file  $KILN_MAC_KEY_FILE, else <cache_dir>/mac.key
//   log_file      <cache_dir>/kilnd.log
KilnPaths ResolvePaths(KilnPaths given, const Environment& env);

// `path` made absolute against the working directory and lexically normal; `path` itself when
// it is empty or the working directory cannot be read.
std::string AbsolutePath(const std::string& path);

}  // namespace kiln::paths
