// What the fuzz targets share: reporting a violated property, and what every rejection must be.
#ifndef IDEM_FUZZ_FUZZ_CHECKS_H_
#define IDEM_FUZZ_FUZZ_CHECKS_H_

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "idem/status.h"

namespace idem::fuzz {

// Prints "TARGET: WHAT" and the input or value at fault, then aborts (libFuzzer saves the input).
[[noreturn]] inline void Violation(const char* target, const char* what, std::string_view detail) {
  std::fprintf(stderr, "%s: %s\n%.*s\n", target, what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

// A rejection has the given code and a message.
inline void CheckRejection(const char* target, const Status& s, StatusCode code) {
  if (s.code() != code) Violation(target, "a rejection of the wrong code", s.ToString());
  if (s.message().empty()) Violation(target, "a rejection without a message", s.ToString());
}

}  // namespace idem::fuzz

#endif  // IDEM_FUZZ_FUZZ_CHECKS_H_
