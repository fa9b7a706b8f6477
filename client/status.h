// Status and StatusOr: the one error type of the client's C++ parts. Every fallible call returns
// one; client/python_status.h turns it into a Python exception at the pybind11 boundary only.
#ifndef KILN_STATUS_H_
#define KILN_STATUS_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kiln {

// What kind of failure a Status reports. Each maps to one Python exception (python_status.cpp).
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // The caller's data cannot be accepted (a malformed plan or guard):
                     // ValueError.
  kWrongType,        // An argument of the wrong Python type: TypeError.
  kNotFound,         // A symbol, schema or name that does not exist: LookupError.
  kIOError,          // The operating system refused (memfd, dlopen, files): OSError.
  kRuntimeError,     // A failure while running something valid (an ATen op raised): RuntimeError.
};

// OK costs a null pointer, so returning one on a hot path is free; an error carries its code and
// message on the heap. Copyable; moving leaves the source OK.
class [[nodiscard]] Status {
 public:
  Status() noexcept = default;
  Status(const Status& other)
      : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status WrongType(std::string message) {
    return Status(StatusCode::kWrongType, std::move(message));
  }
  static Status NotFound(std::string message) {
    return Status(StatusCode::kNotFound, std::move(message));
  }
  static Status IOError(std::string message) {
    return Status(StatusCode::kIOError, std::move(message));
  }
  static Status RuntimeError(std::string message) {
    return Status(StatusCode::kRuntimeError, std::move(message));
  }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;

  bool IsInvalidArgument() const { return code() == StatusCode::kInvalidArgument; }
  bool IsNotFound() const { return code() == StatusCode::kNotFound; }

  // The same code with `prefix` put before the message ("step 3 (kernel k0): " + message); OK
  // stays OK.
  Status Prefixed(std::string_view prefix) const;
  // The same message under another code; OK stays OK.
  Status WithCode(StatusCode code) const;

  // "ok", or "<code name>: <message>" for logs and tests.
  std::string ToString() const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  Status(StatusCode code, std::string message)
      : state_(std::make_unique<State>(State{code, std::move(message)})) {}

  std::unique_ptr<State> state_;  // Null when OK.
};

// A value or the Status saying why there is none. Holding an OK status without a value is a
// programming error (the constructor turns it into a kRuntimeError).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // Implicit, as absl::StatusOr's: `return value;` and `return Status::NotFound(...);` both work,
  // and so does a value convertible to T (a unique_ptr of a derived class).
  template <typename U = T, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                                        !std::is_same_v<std::decay_t<U>, StatusOr>>>
  StatusOr(U&& value) : value_(std::in_place, std::forward<U>(value)) {}  // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {                  // NOLINT
    if (status_.ok()) status_ = Status::RuntimeError("StatusOr made from an OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // The value; only when ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kiln

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define KILN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::kiln::Status kiln_status_ = (expr);        \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (0)

// Declares `lhs` from `expr` (a StatusOr) or returns its status from the enclosing function.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_STATUS_CONCAT_(kiln_status_or_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()
#define KILN_STATUS_CONCAT_(a, b) KILN_STATUS_CONCAT_INNER_(a, b)
#define KILN_STATUS_CONCAT_INNER_(a, b) a##b

#endif  // KILN_STATUS_H_
