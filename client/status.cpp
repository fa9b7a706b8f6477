// Status's out-of-line members: messages, prefixes and printing.
#include "status.h"

namespace kiln {
namespace {

const char* CodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kWrongType:
      return "wrong type";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kIOError:
      return "I/O error";
    case StatusCode::kRuntimeError:
      return "runtime error";
  }
  return "unknown";
}

}  // namespace

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

Status Status::Prefixed(std::string_view prefix) const {
  if (ok()) return Status();
  return Status(state_->code, std::string(prefix) + state_->message);
}

Status Status::WithCode(StatusCode code) const {
  if (ok()) return Status();
  return Status(code, state_->message);
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(state_->code)) + ": " + state_->message;
}

}  // namespace kiln
