// The interface kilnd compiles through. A Compiler turns a validated CompileRequest into an
// unsigned ArtifactBody; the daemon fills in key, version and target, signs and caches it.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/v1/service.pb.h"

namespace kiln::compiler {

class Compiler {
 public:
  virtual ~Compiler() = default;

  // Compiles a request that has passed ValidateRequest. Called from several worker threads at
  // once, never twice at once for the same key. A failure the client should see as a structured
  // CompileError is returned as CompileErrorStatus(...); any other status becomes CODE_INTERNAL.
  virtual absl::StatusOr<kiln::v1::ArtifactBody> Compile(
      const kiln::v1::CompileRequest& request) = 0;

  // The version string that goes into every cache key: it must change whenever the generated
  // code may change (compiler source, toolchain version, flags).
  virtual std::string Version() const = 0;

  // The version that goes into the keys and artifacts of requests for `kind`: a compiler that
  // serves several device kinds answers the one that builds that kind's code, so that a change
  // to one kind's compiler (or a missing toolkit) never changes another kind's keys.
  virtual std::string VersionFor(kiln::v1::DeviceKind kind) const {
    (void)kind;
    return Version();
  }
};

// A status that carries `error` as its payload (code kInvalidArgument for unsupported input,
// kUnimplemented for CODE_UNIMPLEMENTED, kInternal otherwise).
absl::Status CompileErrorStatus(const kiln::v1::CompileError& error);
// The same for an error made of `code` and `message` only.
absl::Status CompileErrorStatus(kiln::v1::CompileError::Code code, std::string message);

// The CompileError carried by `status`, or one of CODE_INTERNAL with its message.
kiln::v1::CompileError CompileErrorFromStatus(const absl::Status& status);

// The compiler kilnd runs until the code generator lands: every compile fails with
// CODE_UNIMPLEMENTED, so clients fall back to eager execution.
class UnimplementedCompiler : public Compiler {
 public:
  absl::StatusOr<kiln::v1::ArtifactBody> Compile(const kiln::v1::CompileRequest&) override;
  std::string Version() const override { return "kiln-unimplemented-0"; }
};

}  // namespace kiln::compiler
