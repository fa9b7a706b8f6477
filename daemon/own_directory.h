// The directories kilnd keeps its cache, its log and its socket in. A missing one is created
// with mode 0700 (its missing parents too): kilnd owns it. An existing one is used as it is when
// it belongs to this user, and refused otherwise: kilnd never changes the mode of a directory
// it did not create (a /tmp-like folder shared by everyone must stay as its owner made it).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kiln::daemon {

// OK once `dir` exists, is a directory, and belongs to this user (created 0700 if it was
// missing). With `private_only`, a directory that group or others may write is refused too: a
// socket there could be replaced by another user. `what` names the setting, for messages.
absl::Status EnsureOwnDirectory(const std::string& dir, std::string_view what, bool private_only);

// OK when nothing is at `path` or a socket is (a dead daemon's, which the caller may replace);
// FailedPrecondition for anything else, which kilnd never deletes.
absl::Status CheckSocketPath(const std::string& path);

}  // namespace kiln::daemon
