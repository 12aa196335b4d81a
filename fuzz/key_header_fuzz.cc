// Fuzz target for the Idempotency-Key header parser: the header value comes from any client.
// Byte 0 is max_bytes (0-255), the rest is the header value. Checks that an accepted key is
// non-empty, within max_bytes and printable ASCII; that a bare value is its own key; that the
// key, written as an sf-string, parses back to itself; and that rejections are
// kInvalidArgument with a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gateway/rules.h"
#include "idem/status.h"

namespace {

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string AsSfString(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t max_bytes = data[0];
  const std::string_view value(reinterpret_cast<const char*>(data) + 1, size - 1);
  idem::Result<std::string> key = idem::gateway::ParseIdempotencyKey(value, max_bytes);
  if (!key) {
    if (key.error().code() != idem::StatusCode::kInvalidArgument) std::abort();
    if (key.error().message().empty()) std::abort();
    return 0;
  }
  if (key->empty() || key->size() > max_bytes) std::abort();
  for (char c : *key) {
    if (c < 0x20 || c > 0x7E) std::abort();
  }
  const std::string_view trimmed = TrimOws(value);
  if (trimmed.front() != '"' && *key != trimmed) std::abort();
  idem::Result<std::string> again = idem::gateway::ParseIdempotencyKey(AsSfString(*key), max_bytes);
  if (!again || *again != *key) std::abort();
  return 0;
}
