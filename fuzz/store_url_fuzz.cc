// Fuzz target for the text an operator types: store URLs (idemd's `store`, the CLI's --store),
// durations and sizes (config options and flags). Byte 0 picks the parser, the rest is the
// text. Checks that every rejection is kInvalidArgument with a message, and that no message
// carries a URL's password: modes 1-3 and 6 put the marker password kSecret into the URL's user
// info (mode 6 after a scheme of the fuzzer's), and neither the error nor the redacted URL may
// contain it.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cli/store_url.h"
#include "core/duration_text.h"
#include "core/machine.h"
#include "core/url_text.h"
#include "fuzz_checks.h"
#include "gateway/config_values.h"

namespace {

constexpr const char* kTarget = "store_url_fuzz";

[[noreturn]] void Violation(const char* what, std::string_view detail) {
  idem::fuzz::Violation(kTarget, what, detail);
}

constexpr std::string_view kSecret = "Qx7SeCrEtQx7";

void CheckRejection(const idem::Status& s) {
  idem::fuzz::CheckRejection(kTarget, s, idem::StatusCode::kInvalidArgument);
}

void CheckUrl(const std::string& url, bool has_secret) {
  idem::Result<idem::StoreConfig> config = idem::ParseStoreUrl(url);
  if (!config.has_value()) {
    CheckRejection(config.error());
    if (has_secret && config.error().message().find(kSecret) != std::string::npos) {
      Violation("an error message shows the password", config.error().message());
    }
  }
  // The config file's check of the same URL (idemd's `store` option).
  const std::optional<std::string> wrong = idem::gateway::config_detail::CheckStoreUrl(url);
  if (wrong.has_value() != !config.has_value()) {
    Violation("the config check and the parser disagree on a store URL", url);
  }
  if (has_secret && wrong && wrong->find(kSecret) != std::string::npos) {
    Violation("a config error shows the password", *wrong);
  }
  if (has_secret && idem::core::RedactUrlPassword(url).find(kSecret) != std::string::npos) {
    Violation("the redacted URL shows the password", url);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  // The marker must come from the mode alone, not from the fuzzer's text.
  const bool clean = text.find(kSecret) == std::string_view::npos;
  switch (data[0] % 7) {
    case 0:
      CheckUrl(std::string(text), false);
      break;
    case 1:
      if (clean) CheckUrl("redis://user:" + std::string(kSecret) + "@" + std::string(text), true);
      break;
    case 2:
      if (clean)
        CheckUrl("postgres://user:" + std::string(kSecret) + "@" + std::string(text), true);
      break;
    case 3:
      if (clean) {
        CheckUrl("redis+cluster://:" + std::string(kSecret) + "@" + std::string(text), true);
      }
      break;
    case 4: {
      idem::Result<std::chrono::milliseconds> d = idem::core::ParseDuration(text);
      if (!d.has_value()) {
        CheckRejection(d.error());
      } else if (d->count() < 0 || *d > idem::core::kMaxDuration) {
        Violation("a duration out of range was accepted", text);
      }
      break;
    }
    case 5: {
      idem::Result<std::uint64_t> bytes = idem::gateway::config_detail::ParseSize(text);
      if (!bytes.has_value()) CheckRejection(bytes.error());
      break;
    }
    case 6:  // any scheme, known or not
      if (clean) CheckUrl(std::string(text) + "://user:" + std::string(kSecret) + "@host", true);
      break;
  }
  return 0;
}
