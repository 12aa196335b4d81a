#include "idem/status.h"

#include <cstdio>
#include <string>

namespace idem {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kAborted:
      return "ABORTED";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

namespace internal {
void CheckFailed(const char* file, int line, const char* expr, std::string_view msg) {
  std::fprintf(stderr, "%s:%d: IDEM_CHECK(%s) failed %.*s\n", file, line, expr,
               static_cast<int>(msg.size()), msg.data());
  std::abort();
}
}  // namespace internal

}  // namespace idem
