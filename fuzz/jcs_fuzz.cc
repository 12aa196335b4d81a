// libFuzzer target for RFC 8785 canonicalisation (untrusted JSON bodies). On any input:
// a rejection is kInvalidArgument; an accepted document's canonical form is its own canonical
// form; FingerprintJson is SHA-256 of that form. A violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "idem/fingerprint.h"

namespace {

[[noreturn]] void Violation(const char* what, std::string_view detail) {
  std::fprintf(stderr, "jcs_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  idem::Result<std::string> canonical = idem::CanonicalizeJson(input);
  if (!canonical.has_value()) {
    if (canonical.error().code() != idem::StatusCode::kInvalidArgument) {
      Violation("rejection is not kInvalidArgument", canonical.error().ToString());
    }
    if (idem::FingerprintJson(input).has_value()) Violation("FingerprintJson accepted", input);
    return 0;
  }
  idem::Result<std::string> again = idem::CanonicalizeJson(*canonical);
  if (!again.has_value()) Violation("canonical form does not parse", again.error().ToString());
  if (*again != *canonical) Violation("canonical form is not a fixpoint", *canonical);
  idem::Result<idem::Fingerprint> fingerprint = idem::FingerprintJson(input);
  if (!fingerprint.has_value() || *fingerprint != idem::FingerprintBytes(*canonical)) {
    Violation("FingerprintJson differs from SHA-256 of the canonical form", *canonical);
  }
  // Pointer lookups on a valid document answer without crashing.
  for (std::string_view pointer : {"", "/0", "/a", "/0/0"}) {
    idem::Result<std::string> text = idem::JsonPointerText(input, pointer);
    if (!text.has_value() && text.error().code() != idem::StatusCode::kInvalidArgument &&
        text.error().code() != idem::StatusCode::kNotFound) {
      Violation("JsonPointerText failed unexpectedly", text.error().ToString());
    }
  }
  return 0;
}
