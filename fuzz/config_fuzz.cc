// Fuzz target for idemd's TOML configuration: the gateway's (`idemd --config`) when byte 0 is
// even, the consumers' (`idemd consume --config`) when it is odd; the rest is the file. Checks
// that every rejection is kInvalidArgument whose message starts with the file's name (the
// operator is told where), and that an accepted gateway config routes any path without
// failing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "consume/config.h"
#include "fuzz_checks.h"
#include "gateway/config.h"

namespace {

constexpr const char* kTarget = "config_fuzz";

[[noreturn]] void Violation(const char* what, std::string_view detail) {
  idem::fuzz::Violation(kTarget, what, detail);
}

constexpr std::string_view kFile = "fuzz.toml";

void CheckRejection(const idem::Status& s) {
  idem::fuzz::CheckRejection(kTarget, s, idem::StatusCode::kInvalidArgument);
  if (s.message().substr(0, kFile.size() + 1) != std::string(kFile) + ":") {
    Violation("a rejection that does not name the file", s.message());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view toml(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    idem::Result<idem::gateway::Config> config = idem::gateway::ParseConfig(toml, kFile);
    if (!config.has_value()) {
      CheckRejection(config.error());
      return 0;
    }
    for (std::string_view path : {"/", "/a", "/v1/charges", ""}) {
      static_cast<void>(config->RouteFor(path));
    }
  } else {
    idem::Result<idem::consume::ConsumeConfig> config =
        idem::consume::ParseConsumeConfig(toml, kFile);
    if (!config.has_value()) CheckRejection(config.error());
  }
  return 0;
}
