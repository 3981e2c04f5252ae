// Status and StatusOr<T>: errors travel as values, never as exceptions through layers.
//
// A default Status is success. An error carries a code and one human line that names
// the thing that is wrong and what was expected ("data/train.bin: bad magic 123, expected
// 20240520"). Callers in app/ print the line and exit non-zero; libraries only return it.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace shardgpt {

class Status {
 public:
  enum class Code { kOk = 0, kInvalidArgument, kNotFound, kCorruption, kIOError, kUnimplemented, kInternal };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status Unimplemented(std::string msg) { return Status(Code::kUnimplemented, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "error: <message>" or "ok".
  std::string ToString() const { return ok() ? "ok" : "error: " + message_; }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// s in double quotes for an error message, with quotes, backslashes and control bytes escaped
// (\n, \t, \r, \xNN): a name read from a file (JSON allows "\n" in a string) must not break
// the message's one line.
std::string Quoted(const std::string& s);

// A value or the error that prevented it.
template <typename T>
class StatusOr {
 public:
  StatusOr(Status s) : status_(std::move(s)) { assert(!status_.ok()); }  // NOLINT: implicit on purpose
  StatusOr(T value) : value_(std::move(value)) {}                         // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

#define SHARDGPT_RETURN_IF_ERROR(expr)              \
  do {                                              \
    ::shardgpt::Status _st = (expr);                \
    if (!_st.ok()) return _st;                      \
  } while (0)

}  // namespace shardgpt
