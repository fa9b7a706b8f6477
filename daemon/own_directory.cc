// EnsureOwnDirectory and CheckSocketPath over stat/lstat/mkdir.
#include "daemon/own_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace kiln::daemon {
namespace {

std::string Kind(mode_t mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISLNK(mode)) return "symbolic link";
  if (S_ISFIFO(mode)) return "named pipe";
  return "special file";
}

absl::Status Check(const std::string& dir, std::string_view what, bool private_only,
                   const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("refusing ", std::string(what), " ", dir,
                                                      ": a ", Kind(st.st_mode),
                                                      " is there, not a directory"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing ", std::string(what), " ", dir, ": it belongs to uid ", st.st_uid,
        ", not to this user; kilnd keeps its files in a directory of its own (a missing one is "
        "created 0700)"));
  }
  if (private_only && (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing ", std::string(what), " ", dir,
        ": group or others may write it, and so replace the socket; use a directory only this "
        "user can write"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EnsureOwnDirectory(const std::string& dir, std::string_view what, bool private_only) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) return Check(dir, what, private_only, st);
  if (errno != ENOENT) {
    return absl::UnavailableError(
        absl::StrCat("cannot use ", std::string(what), " ", dir, ": ", std::strerror(errno)));
  }
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty() && parent != dir && ::stat(parent.c_str(), &st) != 0 && errno == ENOENT) {
    if (absl::Status s = EnsureOwnDirectory(parent.string(), what, false); !s.ok()) return s;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", std::string(what), " ", dir, ": ", std::strerror(errno)));
  }
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot use ", dir, ": ", std::strerror(errno)));
  }
  return Check(dir, what, private_only, st);  // another process may have made it meanwhile
}

absl::Status CheckSocketPath(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("cannot use --socket ", path, ": ", std::strerror(errno)));
  }
  if (S_ISSOCK(st.st_mode)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("refusing --socket ", path, ": a ", Kind(st.st_mode),
                   " is there; kilnd replaces only a socket a stopped daemon left behind"));
}

}  // namespace kiln::daemon
