// Structured compile errors carried through absl::Status payloads, and the placeholder compiler.
#include "compiler/compiler.h"

#include "absl/strings/cord.h"

namespace kiln::compiler {
namespace {
constexpr char kCompileErrorUrl[] = "type.googleapis.com/kiln.v1.CompileError";
}  // namespace

absl::Status CompileErrorStatus(const kiln::v1::CompileError& error) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error.code()) {
    case kiln::v1::CompileError::CODE_UNSUPPORTED_OP:
    case kiln::v1::CompileError::CODE_UNSUPPORTED_SHAPE:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case kiln::v1::CompileError::CODE_UNIMPLEMENTED:
      code = absl::StatusCode::kUnimplemented;
      break;
    default:
      break;
  }
  absl::Status status(code, error.message());
  status.SetPayload(kCompileErrorUrl, absl::Cord(error.SerializeAsString()));
  return status;
}

absl::Status CompileErrorStatus(kiln::v1::CompileError::Code code, std::string message) {
  kiln::v1::CompileError error;
  error.set_code(code);
  error.set_message(std::move(message));
  return CompileErrorStatus(error);
}

kiln::v1::CompileError CompileErrorFromStatus(const absl::Status& status) {
  kiln::v1::CompileError error;
  if (auto payload = status.GetPayload(kCompileErrorUrl);
      payload.has_value() && error.ParseFromString(std::string(*payload))) {
    return error;
  }
  error.Clear();
  error.set_code(kiln::v1::CompileError::CODE_INTERNAL);
  error.set_message(std::string(status.message()));
  return error;
}

absl::StatusOr<kiln::v1::ArtifactBody> UnimplementedCompiler::Compile(
    const kiln::v1::CompileRequest&) {
  kiln::v1::CompileError error;
  error.set_code(kiln::v1::CompileError::CODE_UNIMPLEMENTED);
  error.set_message("this kilnd has no code generator yet; run the graph eagerly");
  return CompileErrorStatus(error);
}

}  // namespace kiln::compiler
