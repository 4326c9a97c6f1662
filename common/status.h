// Status and Result: the error style for what users, files and networks can get wrong.
//
// A Status is cheap when OK and carries one human-readable message otherwise. Each level
// that passes an error up adds what it was doing ("loading checkpoint 'x': ..."), so the
// message the user finally sees names the thing that was wrong and where. Programming
// errors do not use Status: they fail fast through DT_CHECK (common/check.h).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace difftrain {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !message_.has_value(); }
  const std::string& message() const {
    static const std::string kOk = "OK";
    return message_ ? *message_ : kOk;
  }
  // Returns this error with `context` in front: "context: original message".
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

template <typename... Args>
Status Errorf(fmt::format_string<Args...> format, Args&&... args) {
  return Status::Error(fmt::format(format, std::forward<Args>(args)...));
}

// A value or the Status that says why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace difftrain

// Returns the Status of `expr` from the current function when it is an error.
#define DT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::difftrain::Status dt_status_ = (expr); \
    if (!dt_status_.ok()) return dt_status_; \
  } while (0)

#define DT_CONCAT_INNER(a, b) a##b
#define DT_CONCAT(a, b) DT_CONCAT_INNER(a, b)
// `DT_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result or returns its error.
#define DT_ASSIGN_OR_RETURN(lhs, expr) \
  DT_ASSIGN_OR_RETURN_IMPL(DT_CONCAT(dt_result_, __LINE__), lhs, expr)
#define DT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
