// The HTTP rules of the Idempotency-Key gateway (SPEC §6) that need no network: parsing the
// key header, the request fingerprint, the principal's scope, the stored response and its
// encoding, and RFC 9457 problem documents. src/gateway/server.cc applies them to live traffic.
#ifndef IDEM_GATEWAY_RULES_H_
#define IDEM_GATEWAY_RULES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/fingerprint.h"
#include "idem/status.h"

namespace idem::gateway {

// The value of an Idempotency-Key header. The IETF draft makes it an RFC 8941 sf-string
// ("abc", with \" and \\ escapes, printable ASCII only); a bare token (abc) is accepted too,
// as Stripe's clients send it. Leading/trailing spaces and tabs are ignored (RFC 9110 OWS).
// A bare key is RFC 9110 tchar (ALPHA DIGIT !#$%&'*+-.^_`|~) plus ':' and '/', in any
// position (so UUIDs and numeric keys need no quotes); other keys must be sf-strings.
// Errors (all kInvalidArgument, with a message naming the problem): empty value or empty key,
// key longer than max_bytes, a non-printable or non-ASCII byte (invalid UTF-8 included), an
// unterminated or badly escaped sf-string, trailing bytes after the closing quote, parameters
// (";a=b"), a list ("a, b"), or a bare value with characters outside the token set.
Result<std::string> ParseIdempotencyKey(std::string_view value, std::size_t max_bytes);

// The request fingerprint: SHA-256 over the method, the target (path and query) and the body.
// When the content type is JSON (application/json or any +json), the body is canonicalised by
// RFC 8785 first, so re-serialised JSON is the same request; a JSON body that does not parse
// is an error (kInvalidArgument). Other bodies, and empty ones, are hashed as bytes; whether
// the body was JSON is part of the hash. Method and target are length-prefixed so no two
// (method, target, body) triples share an input. A body with a Content-Encoding other than
// identity (gzip, br, ...; `content_encoding` is the header's value, a comma list for several
// codings) is hashed as bytes whatever its content type: it is not JSON text until decoded,
// and idemd does not decode it.
Result<Fingerprint> RequestFingerprint(std::string_view method, std::string_view target,
                                       std::string_view content_type, std::string_view body,
                                       std::string_view content_encoding = {});

// The store scope for a request: the route's scope plus a hash of the principal's credential
// (e.g. the Authorization header value), so two principals that reuse one key never share a
// record. An empty credential is its own principal ("anonymous"). With a `secret` (the
// config's principal_secret_file) the hash is an HMAC under it, so that whoever reads the
// store cannot test guesses of a credential against it; without, a plain SHA-256. The result
// is printable ASCII and at most 96 bytes.
std::string PrincipalScope(std::string_view route_scope, std::string_view credential,
                           std::string_view secret = {});

// Hop-by-hop headers (RFC 9110 §7.6.1) are neither forwarded nor stored: Connection,
// Keep-Alive, Proxy-Authenticate, Proxy-Authorization, TE, Trailer, Transfer-Encoding,
// Upgrade. Case-insensitive.
bool IsHopByHop(std::string_view name);

// The origin-form ("/path?query", RFC 9112 §3.2.1) of a request target, which a server must
// also accept in absolute-form ("http://host/path?query", §3.2.2): the scheme and authority are
// dropped, and an empty path becomes "/". An origin-form target is returned as it is. Anything
// else is kInvalidArgument: a scheme other than http or https, an empty authority, userinfo
// ("user@host", RFC 9110 §4.2.4), authority-form ("host:443") and asterisk-form ("*").
Result<std::string> OriginForm(std::string_view target);

// Header text: spaces and tabs around a value (RFC 9110 OWS) removed; ASCII case-insensitive
// equality, as header names compare.
std::string_view TrimOws(std::string_view s);
bool EqualsIgnoreCase(std::string_view a, std::string_view b);

// Calls f(item) for each non-empty element of a comma-separated header list (RFC 9110 §5.6.1:
// "gzip, br", "keep-alive, X-Internal"), OWS trimmed; stops early when f returns true, and
// returns whether it did.
template <typename F>
bool AnyListItem(std::string_view list, F f) {
  while (!list.empty()) {
    const std::size_t comma = std::min(list.find(','), list.size());
    const std::string_view item = TrimOws(list.substr(0, comma));
    list.remove_prefix(std::min(comma + 1, list.size()));
    if (!item.empty() && f(item)) return true;
  }
  return false;
}

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// What the gateway stores for a completed key and replays to its retries.
struct StoredResponse {
  unsigned status = 200;
  HeaderList headers{};  // in upstream order, hop-by-hop and configured ones removed
  std::string body{};
  // The body was larger than the configured limit and was not stored: the key is completed,
  // and a replay answers with an error instead of a truncated body.
  bool body_omitted = false;
  std::uint64_t body_size = 0;  // the upstream body's size, also when omitted

  friend bool operator==(const StoredResponse&, const StoredResponse&) = default;
};

// A compact, versioned binary encoding for Record::response. Decode rejects anything it did
// not produce (wrong version, unknown flags, truncated, trailing bytes, non-canonical
// lengths) with kDataLoss. Decode(Encode(r)) == r when r is consistent: body_size is
// body.size() when the body is kept, and body is empty when it is omitted (Encode stores only
// body_size then, and Decode rebuilds the other from it).
std::string EncodeStoredResponse(const StoredResponse& r);
Result<StoredResponse> DecodeStoredResponse(std::string_view bytes);

// An RFC 9457 problem document, served as application/problem+json.
struct Problem {
  unsigned status = 500;
  std::string_view type{};   // a URI; "about:blank" when empty
  std::string_view title{};  // short, fixed per kind of problem
  std::string detail{};      // this occurrence, may name the key
};
// {"type":...,"title":...,"status":N,"detail":...}; "detail" is left out when empty. Always
// valid JSON: UTF-8 is kept, control characters become \u00XX, and a byte that is not part of
// well-formed UTF-8 becomes U+FFFD.
std::string ProblemJson(const Problem& p);

// The problem types the gateway answers with. Each type URI is
// https://idem.dev/problems/<name>, where <name> is the function's name in kebab-case
// (missing-key, invalid-key, key-reuse, in-flight, ...); type and title never change.
namespace problems {
Problem MissingKey();                    // 400
Problem InvalidKey(std::string detail);  // 400
Problem MissingPrincipal(
    std::string_view header);                  // 400: a key but no principal (anonymous = "refuse")
Problem InvalidPrincipal(std::string detail);  // 400: e.g. two principal headers
Problem KeyReuse(std::string_view key);        // 422: same key, different request
Problem InFlight(std::string_view key);        // 409: first request still upstream
Problem StoreUnavailable(std::string detail);  // 503 (+ Retry-After from the server)
Problem BodyTooLarge(std::uint64_t limit);     // 413
Problem HeadersTooLarge();                     // 431
Problem TargetTooLong();                       // 414: the request line alone is over the limit
Problem InvalidBody(std::string detail);       // 400: e.g. a JSON body that does not parse
Problem MalformedRequest(std::string detail);  // 400: not HTTP/1.1 (request line, fields, framing)
Problem InvalidTarget(std::string detail);     // 400: a request target idemd cannot route
Problem UpstreamFailed(std::string detail);    // 502
Problem UpstreamTimeout();                     // 504
Problem ReplayTooLarge(std::uint64_t size);    // 502: the stored body was omitted (too large)
// 501: a transfer coding idemd does not decode (gzip in "gzip, chunked")
Problem UnsupportedTransferCoding(std::string detail);
}  // namespace problems

}  // namespace idem::gateway

#endif  // IDEM_GATEWAY_RULES_H_
