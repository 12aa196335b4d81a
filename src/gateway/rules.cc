#include "gateway/rules.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "fingerprint/sha256.h"
#include "idem/fingerprint.h"
#include "idem/status.h"

namespace idem::gateway {
namespace {

// ---- text helpers ----

bool IsOws(char c) { return c == ' ' || c == '\t'; }

char AsciiLower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

constexpr char kHexDigits[] = "0123456789ABCDEF";

// "0x0A".
std::string HexByte(unsigned char c) { return {'0', 'x', kHexDigits[c >> 4], kHexDigits[c & 0xF]}; }

// ---- Idempotency-Key ----

// What a bare (unquoted) key may contain: RFC 9110 §5.6.2 tchar
//   ALPHA DIGIT ! # $ % & ' * + - . ^ _ ` | ~
// plus ':' and '/', which keys in the wild use (URNs, paths, base64 without padding). Unlike an
// RFC 8941 token, any of these may come first, so bare UUIDs and numeric keys are accepted.
// Anything else ('=', '@', spaces, quotes, ...) needs the sf-string form.
bool IsBareKeyChar(char c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
  return std::string_view("!#$%&'*+-.^_`|~:/").find(c) != std::string_view::npos;
}

constexpr std::string_view kKeyPrefix = "Idempotency-Key ";

Status KeyError(std::string_view what) {
  std::string m(kKeyPrefix);
  m.append(what);
  return InvalidArgumentError(std::move(m));
}

// The error for a byte outside 0x20-0x7E at `offset` of the header value.
Status UnprintableKeyByte(unsigned char c, std::size_t offset) {
  std::string what = c >= 0x80 ? "has a non-ASCII byte " : "has a control character ";
  what += HexByte(c) + " at offset " + std::to_string(offset) + "; keys are printable ASCII";
  return KeyError(what);
}

// The error for what follows a complete key at `offset` (";params", a list, or other bytes).
Status TrailingKeyBytes(std::string_view value, std::size_t offset) {
  std::size_t next = offset;
  while (next < value.size() && IsOws(value[next])) ++next;
  if (next < value.size() && value[next] == ';') {
    return KeyError("has parameters (\";...\") at offset " + std::to_string(next) +
                    ", which are not supported");
  }
  if (next < value.size() && value[next] == ',') {
    return KeyError("has more than one key (a list) at offset " + std::to_string(next));
  }
  return KeyError("has bytes after the closing quote at offset " + std::to_string(offset));
}

}  // namespace

Result<std::string> ParseIdempotencyKey(std::string_view value, std::size_t max_bytes) {
  std::string_view trimmed = TrimOws(value);
  if (trimmed.empty()) return KeyError("is empty");
  // Offsets in messages are into `value`, as the client sent it.
  const std::size_t base = static_cast<std::size_t>(trimmed.data() - value.data());
  std::string key;
  if (trimmed.front() == '"') {
    // RFC 8941 §4.2.5 sf-string.
    std::size_t i = 1;
    bool closed = false;
    while (i < trimmed.size()) {
      const auto c = static_cast<unsigned char>(trimmed[i]);
      if (c < 0x20 || c > 0x7E) return UnprintableKeyByte(c, base + i);
      if (c == '"') {
        closed = true;
        ++i;
        break;
      }
      if (c == '\\') {
        if (i + 1 >= trimmed.size()) break;  // unterminated
        const auto e = static_cast<unsigned char>(trimmed[i + 1]);
        if (e != '"' && e != '\\') {
          if (e < 0x20 || e > 0x7E) return UnprintableKeyByte(e, base + i + 1);
          return KeyError(std::string("has a bad escape \\") + static_cast<char>(e) +
                          " at offset " + std::to_string(base + i) +
                          "; an sf-string allows only \\\" and \\\\");
        }
        key.push_back(static_cast<char>(e));
        i += 2;
        continue;
      }
      key.push_back(static_cast<char>(c));
      ++i;
    }
    if (!closed) return KeyError("has an unterminated sf-string (no closing quote)");
    if (i < trimmed.size()) return TrailingKeyBytes(value, base + i);
    if (key.empty()) return KeyError("is an empty sf-string (\"\")");
  } else {
    for (std::size_t i = 0; i < trimmed.size(); ++i) {
      const auto c = static_cast<unsigned char>(trimmed[i]);
      if (c < 0x20 || c > 0x7E) return UnprintableKeyByte(c, base + i);
      if (c == ';' || c == ',') return TrailingKeyBytes(value, base + i);
      if (!IsBareKeyChar(static_cast<char>(c))) {
        return KeyError(std::string("has '") + static_cast<char>(c) + "' at offset " +
                        std::to_string(base + i) +
                        ", which a bare key may not contain; send it as an sf-string (\"...\")");
      }
    }
    key.assign(trimmed);
  }
  if (key.size() > max_bytes) {
    return KeyError("is " + std::to_string(key.size()) + " bytes, more than the limit of " +
                    std::to_string(max_bytes));
  }
  return key;
}

// ---- fingerprint and scope ----

namespace {

// The media type (before any ';' parameters) is application/json or type/subtype+json.
bool IsJsonContentType(std::string_view content_type) {
  std::string_view media = TrimOws(content_type.substr(0, content_type.find(';')));
  if (EqualsIgnoreCase(media, "application/json")) return true;
  const std::size_t slash = media.find('/');
  if (slash == std::string_view::npos) return false;
  std::string_view subtype = media.substr(slash + 1);
  constexpr std::string_view kSuffix = "+json";
  return slash > 0 && subtype.size() > kSuffix.size() &&
         EqualsIgnoreCase(subtype.substr(subtype.size() - kSuffix.size()), kSuffix);
}

// Whether a Content-Encoding value names any coding other than identity ("gzip", "br, gzip").
bool IsEncoded(std::string_view content_encoding) {
  return AnyListItem(content_encoding,
                     [](std::string_view coding) { return !EqualsIgnoreCase(coding, "identity"); });
}

}  // namespace

Result<Fingerprint> RequestFingerprint(std::string_view method, std::string_view target,
                                       std::string_view content_type, std::string_view body,
                                       std::string_view content_encoding) {
  // The body's kind is hashed too: the same bytes sent as JSON and as something else are
  // different requests. An empty body is bytes whatever the content type says, since clients
  // send "Content-Type: application/json" on empty POSTs. A compressed body is bytes too: the
  // canonicaliser would only see gzip and refuse it.
  if (!body.empty() && IsJsonContentType(content_type) && !IsEncoded(content_encoding)) {
    Result<std::string> canonical = CanonicalizeJson(body);
    if (!canonical) {
      return InvalidArgumentError("the JSON body does not parse: " + canonical.error().message());
    }
    return FingerprintParts({method, target, "json", *canonical});
  }
  return FingerprintParts({method, target, "bytes", body});
}

namespace {

// 16 bytes of `fp` as 32 lowercase hex characters.
std::string ShortHex(const Fingerprint& fp) { return fp.Hex().substr(0, 32); }

constexpr std::size_t kMaxRouteScopeBytes = 63;  // + '|' + 32 hex = 96

}  // namespace

std::string PrincipalScope(std::string_view route_scope, std::string_view credential,
                           std::string_view secret) {
  std::string out;
  bool printable = true;
  for (char c : route_scope) printable = printable && c >= 0x20 && c <= 0x7E;
  if (printable && route_scope.size() <= kMaxRouteScopeBytes) {
    out.assign(route_scope);
  } else {
    // Too long or not printable: a readable prefix plus a hash of the whole, 30 + 1 + 32 bytes.
    for (char c : route_scope.substr(0, 30)) out.push_back(c >= 0x20 && c <= 0x7E ? c : '_');
    out += '#';
    out += ShortHex(FingerprintParts({"idem route scope v1", route_scope}));
  }
  out += '|';
  // Never 32 hex characters, so no credential's hash can be "anonymous".
  if (credential.empty()) {
    out += "anonymous";
  } else if (secret.empty()) {
    out += ShortHex(FingerprintParts({"idem principal v1", credential}));
  } else {
    out += ShortHex(Fingerprint{internal::HmacSha256(
        secret, std::string("idem principal v2") + '\0' + std::string(credential))});
  }
  return out;
}

bool IsHopByHop(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
      "TE",         "Trailer",    "Transfer-Encoding",  "Upgrade",
  };
  for (std::string_view hop : kNames) {
    if (EqualsIgnoreCase(name, hop)) return true;
  }
  return false;
}

Result<std::string> OriginForm(std::string_view target) {
  if (target.starts_with('/')) return std::string(target);
  const std::size_t colon = target.find("://");
  const std::string_view scheme = target.substr(0, colon);
  if (colon == std::string_view::npos ||
      !(EqualsIgnoreCase(scheme, "http") || EqualsIgnoreCase(scheme, "https"))) {
    return InvalidArgumentError("is neither a path (\"/...\") nor an http:// or https:// URL");
  }
  const std::string_view rest = target.substr(colon + 3);
  const std::size_t path = std::min(rest.find_first_of("/?"), rest.size());
  const std::string_view authority = rest.substr(0, path);
  if (authority.empty()) return InvalidArgumentError("has no host");
  if (authority.find('@') != std::string_view::npos) {
    return InvalidArgumentError("has userinfo (user@host), which HTTP URLs must not carry");
  }
  std::string origin(rest.substr(path));
  if (!origin.starts_with('/')) origin.insert(0, 1, '/');
  return origin;
}

// ---- stored response ----
//
// Version 1:
//   u8 version (1) | u8 flags (bit 0: body omitted; other bits 0) | varint status
//   | varint header count | { varint name size, name, varint value size, value }*
//   | omitted ? varint body_size : (varint body size, body)
// Varints are unsigned LEB128 in their shortest form, so every value has exactly one encoding
// and Decode can insist on it.

namespace {

constexpr std::uint8_t kStoredResponseV1 = 1;
constexpr std::uint8_t kFlagBodyOmitted = 1;

void PutVarint(std::uint64_t v, std::string& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void PutBytes(std::string_view bytes, std::string& out) {
  PutVarint(bytes.size(), out);
  out.append(bytes);
}

// Reads from the front of `in_`; the first failure sticks.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  std::string_view rest() const { return in_; }

  Result<std::uint8_t> Byte(std::string_view what) {
    if (in_.empty()) return Truncated(what);
    const auto b = static_cast<std::uint8_t>(in_.front());
    in_.remove_prefix(1);
    return b;
  }

  Result<std::uint64_t> Varint(std::string_view what) {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in_.empty()) return Truncated(what);
      const auto b = static_cast<std::uint8_t>(in_.front());
      in_.remove_prefix(1);
      const std::uint64_t bits = b & 0x7F;
      if (shift == 63 && bits > 1) return Bad(what, "overflows 64 bits");
      v |= bits << shift;
      if ((b & 0x80) == 0) {
        if (b == 0 && shift > 0) return Bad(what, "is not in its shortest form");
        return v;
      }
    }
    return Bad(what, "overflows 64 bits");
  }

  Result<std::string> Bytes(std::string_view what) {
    Result<std::uint64_t> size = Varint(what);
    if (!size) return size.error();
    if (*size > in_.size()) return Truncated(what);
    std::string out(in_.substr(0, static_cast<std::size_t>(*size)));
    in_.remove_prefix(static_cast<std::size_t>(*size));
    return out;
  }

 private:
  static Status Truncated(std::string_view what) {
    return DataLossError("stored response is truncated in the " + std::string(what));
  }
  static Status Bad(std::string_view what, std::string_view why) {
    return DataLossError("stored response's " + std::string(what) + " " + std::string(why));
  }

  std::string_view in_;
};

}  // namespace

std::string EncodeStoredResponse(const StoredResponse& r) {
  std::string out;
  std::size_t size = 16 + r.body.size();
  for (const auto& [name, value] : r.headers) size += name.size() + value.size() + 4;
  out.reserve(size);
  out.push_back(static_cast<char>(kStoredResponseV1));
  out.push_back(static_cast<char>(r.body_omitted ? kFlagBodyOmitted : 0));
  PutVarint(r.status, out);
  PutVarint(r.headers.size(), out);
  for (const auto& [name, value] : r.headers) {
    PutBytes(name, out);
    PutBytes(value, out);
  }
  if (r.body_omitted) {
    PutVarint(r.body_size, out);
  } else {
    PutBytes(r.body, out);
  }
  return out;
}

Result<StoredResponse> DecodeStoredResponse(std::string_view bytes) {
  Reader in(bytes);
  Result<std::uint8_t> version = in.Byte("version");
  if (!version) return version.error();
  if (*version != kStoredResponseV1) {
    return DataLossError("stored response has unknown version " + std::to_string(*version));
  }
  Result<std::uint8_t> flags = in.Byte("flags");
  if (!flags) return flags.error();
  if ((*flags & ~kFlagBodyOmitted) != 0) {
    return DataLossError("stored response has unknown flags " + HexByte(*flags));
  }
  StoredResponse r;
  r.body_omitted = (*flags & kFlagBodyOmitted) != 0;
  Result<std::uint64_t> status = in.Varint("status");
  if (!status) return status.error();
  if (*status > std::numeric_limits<unsigned>::max()) {
    return DataLossError("stored response has status " + std::to_string(*status));
  }
  r.status = static_cast<unsigned>(*status);
  Result<std::uint64_t> count = in.Varint("header count");
  if (!count) return count.error();
  // Each header takes at least two bytes, so a damaged count cannot make us reserve much.
  if (*count > in.rest().size() / 2) return DataLossError("stored response is truncated");
  r.headers.reserve(static_cast<std::size_t>(*count));
  for (std::uint64_t i = 0; i < *count; ++i) {
    Result<std::string> name = in.Bytes("header name");
    if (!name) return name.error();
    Result<std::string> value = in.Bytes("header value");
    if (!value) return value.error();
    r.headers.emplace_back(std::move(*name), std::move(*value));
  }
  if (r.body_omitted) {
    Result<std::uint64_t> body_size = in.Varint("body size");
    if (!body_size) return body_size.error();
    r.body_size = *body_size;
  } else {
    Result<std::string> body = in.Bytes("body");
    if (!body) return body.error();
    r.body = std::move(*body);
    r.body_size = r.body.size();
  }
  if (!in.rest().empty()) {
    return DataLossError("stored response has " + std::to_string(in.rest().size()) +
                         " bytes after its end");
  }
  return r;
}

// ---- problem documents ----

namespace {

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// at most U+10FFFF) that starts at s[i], a byte >= 0x80; 0 if there is none.
std::size_t Utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c == 0xE0) {
    n = 3;
    lo = 0xA0;
  } else if (c == 0xED) {
    n = 3;
    hi = 0x9F;
  } else if (c >= 0xE1 && c <= 0xEF) {
    n = 3;
  } else if (c == 0xF0) {
    n = 4;
    lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    n = 4;
  } else if (c == 0xF4) {
    n = 4;
    hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  const auto c1 = static_cast<unsigned char>(s[i + 1]);
  if (c1 < lo || c1 > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// `text` as a JSON string literal. UTF-8 is copied as is; a byte that is not part of
// well-formed UTF-8 becomes U+FFFD, so the document is valid JSON whatever `text` holds.
void AppendJsonString(std::string_view text, std::string& out) {
  out.push_back('"');
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20) {
      out += "\\u00";
      out.push_back(kHexDigits[c >> 4]);
      out.push_back(kHexDigits[c & 0xF]);
      ++i;
    } else if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (std::size_t n = Utf8SequenceLength(text, i); n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out.push_back('"');
}

// Type and title are string literals: Problem holds views of them.
Problem Make(unsigned status, std::string_view type, std::string_view title, std::string detail) {
  return Problem{status, type, title, std::move(detail)};
}

// `key` quoted for a message. Keys are printable ASCII once parsed; JSON escaping happens later.
std::string Quote(std::string_view key) { return "\"" + std::string(key) + "\""; }

}  // namespace

std::string ProblemJson(const Problem& p) {
  std::string out = "{\"type\":";
  AppendJsonString(p.type.empty() ? std::string_view("about:blank") : p.type, out);
  out += ",\"title\":";
  AppendJsonString(p.title, out);
  out += ",\"status\":";
  out += std::to_string(p.status);
  if (!p.detail.empty()) {
    out += ",\"detail\":";
    AppendJsonString(p.detail, out);
  }
  out += '}';
  return out;
}

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && IsOws(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsOws(s.back())) s.remove_suffix(1);
  return s;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (AsciiLower(a[i]) != AsciiLower(b[i])) return false;
  }
  return true;
}

namespace problems {

Problem MissingKey() {
  return Make(400, "https://idem.dev/problems/missing-key", "Idempotency-Key missing",
              "This route requires an Idempotency-Key header.");
}

Problem InvalidKey(std::string detail) {
  return Make(400, "https://idem.dev/problems/invalid-key", "Invalid Idempotency-Key",
              std::move(detail));
}

Problem MissingPrincipal(std::string_view header) {
  return Make(400, "https://idem.dev/problems/missing-principal", "Principal missing",
              "This route keeps each client's keys apart and needs a " + std::string(header) +
                  " header to know whose key this is.");
}

Problem InvalidPrincipal(std::string detail) {
  return Make(400, "https://idem.dev/problems/invalid-principal", "Invalid principal",
              std::move(detail));
}

Problem KeyReuse(std::string_view key) {
  return Make(422, "https://idem.dev/problems/key-reuse", "Idempotency-Key reused",
              "The key " + Quote(key) +
                  " was first used for a different request (method, target or body).");
}

Problem InFlight(std::string_view key) {
  return Make(409, "https://idem.dev/problems/in-flight", "Request in progress",
              "The first request with key " + Quote(key) + " has not finished; retry later.");
}

Problem StoreUnavailable(std::string detail) {
  return Make(503, "https://idem.dev/problems/store-unavailable", "Idempotency store unavailable",
              std::move(detail));
}

Problem BodyTooLarge(std::uint64_t limit) {
  return Make(413, "https://idem.dev/problems/body-too-large", "Request body too large",
              "The body is larger than the limit of " + std::to_string(limit) + " bytes.");
}

Problem HeadersTooLarge() {
  return Make(431, "https://idem.dev/problems/headers-too-large", "Request headers too large",
              "The request's header section is larger than the configured limit.");
}

Problem TargetTooLong() {
  return Make(414, "https://idem.dev/problems/target-too-long", "Request target too long",
              "The request line alone is longer than the configured header limit.");
}

Problem InvalidBody(std::string detail) {
  return Make(400, "https://idem.dev/problems/invalid-body", "Invalid request body",
              std::move(detail));
}

Problem MalformedRequest(std::string detail) {
  return Make(400, "https://idem.dev/problems/malformed-request", "Malformed request",
              std::move(detail));
}

Problem UnsupportedTransferCoding(std::string detail) {
  return Make(501, "https://idem.dev/problems/unsupported-transfer-coding",
              "Transfer coding not implemented", std::move(detail));
}

Problem InvalidTarget(std::string detail) {
  return Make(400, "https://idem.dev/problems/invalid-target", "Invalid request target",
              std::move(detail));
}

Problem UpstreamFailed(std::string detail) {
  return Make(502, "https://idem.dev/problems/upstream-failed", "Upstream failed",
              std::move(detail));
}

Problem UpstreamTimeout() {
  return Make(504, "https://idem.dev/problems/upstream-timeout", "Upstream timed out",
              "The upstream did not answer in time.");
}

Problem ReplayTooLarge(std::uint64_t size) {
  return Make(502, "https://idem.dev/problems/replay-too-large", "Stored response unavailable",
              "The first response (" + std::to_string(size) +
                  " bytes) was too large to store, so it cannot be replayed.");
}

}  // namespace problems

}  // namespace idem::gateway
