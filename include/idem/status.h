// Status and Result<T>: how idem says "could not decide".
//
// A duplicate is not an error: Begin answers Acquired/Busy/Replay/Conflict/Stale as values.
// A Status means the call could not be decided, and its code says who retries:
//   kUnavailable         the store could not be reached or answered in time: retry the call.
//   kAborted             a concurrent change got in the way: retry the whole operation.
//   kFailedPrecondition  fix the state first (e.g. re-register an expired session).
//   kInvalidArgument     the input is malformed; retrying the same input never helps.
//   kResourceExhausted   a configured bound was hit (session window, store capacity).
//   kNotFound            the named thing does not exist (operator calls).
//   kDataLoss            stored bytes are damaged; an operator must look.
//   kInternal            a bug or an unexpected library error.
//
// Result<T> uses std::expected's member names (has_value, value, error, operator*, ->,
// value_or) so it can become std::expected later.
#ifndef IDEM_STATUS_H_
#define IDEM_STATUS_H_

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace idem {

enum class StatusCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument,
  kUnavailable,
  kAborted,
  kFailedPrecondition,
  kResourceExhausted,
  kNotFound,
  kDataLoss,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: key is empty".
  std::string ToString() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status AbortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

namespace internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, std::string_view msg);
}  // namespace internal

// Programming errors stop the process.
#define IDEM_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) ::idem::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define IDEM_CHECK_MSG(cond, msg)                                                 \
  do {                                                                            \
    if (!(cond)) ::idem::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// A value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>);

 public:
  using value_type = T;

  Result(const T& v) : v_(std::in_place_index<0>, v) {}        // NOLINT
  Result(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}  // NOLINT
  // The value built in place from `args`: no move of a value that is costly to move.
  template <typename... A>
  explicit Result(std::in_place_t, A&&... args)
      : v_(std::in_place_index<0>, std::forward<A>(args)...) {}
  Result(Status s) : v_(std::in_place_index<1>, std::move(s)) {  // NOLINT
    IDEM_CHECK_MSG(!std::get<1>(v_).ok(), "Result built from an ok Status");
  }
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Status> && !std::is_same_v<std::decay_t<U>, Result<T>>)
      Result(U&& u)
      : v_(std::in_place_index<0>, T(std::forward<U>(u))) {}  // NOLINT

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & { return Get(); }
  const T& value() const& { return Get(); }
  T&& value() && { return std::move(Get()); }
  T& operator*() & { return Get(); }
  const T& operator*() const& { return Get(); }
  T&& operator*() && { return std::move(Get()); }
  T* operator->() { return &Get(); }
  const T* operator->() const { return &Get(); }
  template <typename U>
  T value_or(U&& other) const& {
    return has_value() ? std::get<0>(v_) : static_cast<T>(std::forward<U>(other));
  }

  // The error; only valid when !has_value().
  const Status& error() const& {
    IDEM_CHECK_MSG(!has_value(), "Result::error() on a value");
    return std::get<1>(v_);
  }
  Status&& error() && {
    IDEM_CHECK_MSG(!has_value(), "Result::error() on a value");
    return std::move(std::get<1>(v_));
  }
  // ok() for a value, else the error: handy to forward.
  Status status() const { return has_value() ? Status() : std::get<1>(v_); }

 private:
  T& Get() {
    IDEM_CHECK_MSG(has_value(), has_value() ? "" : std::get<1>(v_).ToString());
    return std::get<0>(v_);
  }
  const T& Get() const {
    IDEM_CHECK_MSG(has_value(), has_value() ? "" : std::get<1>(v_).ToString());
    return std::get<0>(v_);
  }
  std::variant<T, Status> v_;
};

// Early-return helpers for .cc files.
#define IDEM_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::idem::Status idem_status_ = (expr);        \
    if (!idem_status_.ok()) return idem_status_; \
  } while (0)

}  // namespace idem

#endif  // IDEM_STATUS_H_
