// The gateway's HTTP rules: key header parsing, request fingerprints, principal scopes,
// hop-by-hop headers, the stored response's encoding and problem documents.
#include "gateway/rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fingerprint/sha256.h"
#include "idem/fingerprint.h"
#include "idem/status.h"

namespace idem::gateway {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMax = 255;

// ---- ParseIdempotencyKey ----

std::string Key(std::string_view value, std::size_t max_bytes = kMax) {
  Result<std::string> key = ParseIdempotencyKey(value, max_bytes);
  EXPECT_TRUE(key.has_value()) << key.status().ToString();
  return key.value_or("<error>");
}

// The error message for `value`, which must be rejected with kInvalidArgument.
std::string KeyError(std::string_view value, std::size_t max_bytes = kMax) {
  Result<std::string> key = ParseIdempotencyKey(value, max_bytes);
  if (key.has_value()) {
    ADD_FAILURE() << "accepted as " << *key;
    return "";
  }
  EXPECT_EQ(key.error().code(), StatusCode::kInvalidArgument);
  return key.error().message();
}

TEST(ParseIdempotencyKeyTest, BareTokens) {
  EXPECT_EQ(Key("abc"), "abc");
  EXPECT_EQ(Key("8e03978e-40d5-43e8-bc93-6894a57f9324"), "8e03978e-40d5-43e8-bc93-6894a57f9324");
  EXPECT_EQ(Key("12345"), "12345");  // may start with a digit, unlike an RFC 8941 token
  EXPECT_EQ(Key("urn:order:42/charge"), "urn:order:42/charge");
  EXPECT_EQ(Key("!#$%&'*+-.^_`|~"), "!#$%&'*+-.^_`|~");
  EXPECT_EQ(Key("a"), "a");
}

TEST(ParseIdempotencyKeyTest, SfStrings) {
  EXPECT_EQ(Key("\"abc\""), "abc");
  EXPECT_EQ(Key("\"with space, comma; and=equals\""), "with space, comma; and=equals");
  EXPECT_EQ(Key(R"("a\"b")"), "a\"b");
  EXPECT_EQ(Key(R"("a\\b")"), "a\\b");
  EXPECT_EQ(Key(R"("\\\"")"), "\\\"");
  EXPECT_EQ(Key("\"~ !\""), "~ !");
}

TEST(ParseIdempotencyKeyTest, TrimsOws) {
  EXPECT_EQ(Key("  abc\t "), "abc");
  EXPECT_EQ(Key("\t\"a b\"  "), "a b");
  EXPECT_EQ(Key("\" a \""), " a ");  // spaces inside quotes are the key's
}

TEST(ParseIdempotencyKeyTest, Empty) {
  EXPECT_THAT(KeyError(""), HasSubstr("is empty"));
  EXPECT_THAT(KeyError(" \t "), HasSubstr("is empty"));
  EXPECT_THAT(KeyError("\"\""), HasSubstr("empty sf-string"));
  EXPECT_THAT(KeyError("  \"\" "), HasSubstr("empty sf-string"));
}

TEST(ParseIdempotencyKeyTest, LengthLimitCountsKeyBytes) {
  const std::string at(kMax, 'k');
  const std::string over(kMax + 1, 'k');
  EXPECT_EQ(Key(at), at);
  EXPECT_EQ(Key("\"" + at + "\""), at);
  EXPECT_THAT(KeyError(over), HasSubstr("is 256 bytes, more than the limit of 255"));
  EXPECT_THAT(KeyError("\"" + over + "\""), HasSubstr("more than the limit of 255"));
  // Escapes count once: 255 escaped quotes are 510 bytes of header but a 255-byte key.
  std::string escaped = "\"";
  for (std::size_t i = 0; i < kMax; ++i) escaped += "\\\"";
  escaped += "\"";
  EXPECT_EQ(Key(escaped), std::string(kMax, '"'));
  EXPECT_THAT(KeyError("ab", 1), HasSubstr("more than the limit of 1"));
  EXPECT_EQ(Key("a", 1), "a");
  EXPECT_THAT(KeyError("a", 0), HasSubstr("more than the limit of 0"));
}

TEST(ParseIdempotencyKeyTest, ControlCharacters) {
  EXPECT_THAT(KeyError("ab\ncd"), HasSubstr("control character 0x0A at offset 2"));
  EXPECT_THAT(KeyError("\"ab\rcd\""), HasSubstr("control character 0x0D at offset 3"));
  EXPECT_THAT(KeyError(std::string_view("a\0b", 3)), HasSubstr("control character 0x00"));
  EXPECT_THAT(KeyError("a\x7f"), HasSubstr("control character 0x7F at offset 1"));
  EXPECT_THAT(KeyError("\"a\x7f\""), HasSubstr("control character 0x7F"));
  // A tab inside is not OWS.
  EXPECT_THAT(KeyError("a\tb"), HasSubstr("control character 0x09 at offset 1"));
  EXPECT_THAT(KeyError("\"a\tb\""), HasSubstr("control character 0x09 at offset 2"));
  // An escaped control character is still one.
  EXPECT_THAT(KeyError("\"a\\\x01\""), HasSubstr("control character 0x01 at offset 3"));
}

TEST(ParseIdempotencyKeyTest, NonAscii) {
  EXPECT_THAT(KeyError("caf\xc3\xa9"), HasSubstr("non-ASCII byte 0xC3 at offset 3"));
  EXPECT_THAT(KeyError("\"caf\xc3\xa9\""), HasSubstr("non-ASCII byte 0xC3 at offset 4"));
  // Invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong '/'.
  EXPECT_THAT(KeyError("a\x80"), HasSubstr("non-ASCII byte 0x80 at offset 1"));
  EXPECT_THAT(KeyError("\"\xe2\x82\""), HasSubstr("non-ASCII byte 0xE2 at offset 1"));
  EXPECT_THAT(KeyError("\xc0\xaf"), HasSubstr("non-ASCII byte 0xC0 at offset 0"));
  EXPECT_THAT(KeyError("\xff"), HasSubstr("non-ASCII byte 0xFF"));
  EXPECT_THAT(KeyError("\"\\\xff\""), HasSubstr("non-ASCII byte 0xFF at offset 2"));
}

TEST(ParseIdempotencyKeyTest, OffsetsCountLeadingOws) {
  EXPECT_THAT(KeyError("  a\x01"), HasSubstr("offset 3"));
}

TEST(ParseIdempotencyKeyTest, Parameters) {
  EXPECT_THAT(KeyError("abc;a=b"), HasSubstr("parameters (\";...\") at offset 3"));
  EXPECT_THAT(KeyError("\"abc\";a=b"), HasSubstr("parameters"));
  EXPECT_THAT(KeyError("\"abc\" ;a"), HasSubstr("parameters (\";...\") at offset 6"));
  EXPECT_THAT(KeyError("abc;"), HasSubstr("parameters"));
}

TEST(ParseIdempotencyKeyTest, Lists) {
  EXPECT_THAT(KeyError("a, b"), HasSubstr("more than one key"));
  EXPECT_THAT(KeyError("\"a\", \"b\""), HasSubstr("more than one key (a list) at offset 3"));
  EXPECT_THAT(KeyError("\"a\" ,\"b\""), HasSubstr("more than one key"));
}

TEST(ParseIdempotencyKeyTest, UnterminatedSfString) {
  EXPECT_THAT(KeyError("\""), HasSubstr("unterminated sf-string"));
  EXPECT_THAT(KeyError("\"abc"), HasSubstr("unterminated sf-string"));
  EXPECT_THAT(KeyError("\"abc\\\""), HasSubstr("unterminated sf-string"));  // "abc\"
  EXPECT_THAT(KeyError("\"abc\\"), HasSubstr("unterminated sf-string"));    // "abc\ at the end
  // Trailing OWS is trimmed before parsing, so it cannot close the string.
  EXPECT_THAT(KeyError("\"abc  "), HasSubstr("unterminated sf-string"));
}

TEST(ParseIdempotencyKeyTest, BadEscape) {
  EXPECT_THAT(KeyError(R"("a\nb")"), HasSubstr("bad escape \\n at offset 2"));
  EXPECT_THAT(KeyError(R"("\u0041")"), HasSubstr("bad escape \\u"));
  EXPECT_THAT(KeyError(R"("a\ b")"), HasSubstr("only \\\" and \\\\"));
}

TEST(ParseIdempotencyKeyTest, BytesAfterClosingQuote) {
  EXPECT_THAT(KeyError("\"abc\"def"), HasSubstr("bytes after the closing quote at offset 5"));
  EXPECT_THAT(KeyError("\"abc\" x"), HasSubstr("bytes after the closing quote at offset 5"));
  EXPECT_THAT(KeyError("\"a\"\"b\""), HasSubstr("bytes after the closing quote"));
}

TEST(ParseIdempotencyKeyTest, BareCharactersOutsideTheTokenSet) {
  EXPECT_THAT(KeyError("a b"), HasSubstr("has ' ' at offset 1, which a bare key may not contain"));
  EXPECT_THAT(KeyError("abc="), HasSubstr("'=' at offset 3"));
  EXPECT_THAT(KeyError("a\"b"), HasSubstr("'\"' at offset 1"));
  EXPECT_THAT(KeyError("user@example"), HasSubstr("'@'"));
  for (char c : std::string_view("()<>[]{}?=@\\")) {
    EXPECT_THAT(KeyError(std::string("a") + c), HasSubstr("send it as an sf-string")) << c;
  }
}

TEST(ParseIdempotencyKeyTest, EverySfStringOfPrintableAsciiRoundTrips) {
  std::string all;
  for (char c = 0x20; c <= 0x7E; ++c) all.push_back(c);
  std::string quoted = "\"";
  for (char c : all) {
    if (c == '"' || c == '\\') quoted.push_back('\\');
    quoted.push_back(c);
  }
  quoted.push_back('"');
  EXPECT_EQ(Key(quoted), all);
}

// ---- RequestFingerprint ----

Fingerprint Fp(std::string_view method, std::string_view target, std::string_view content_type,
               std::string_view body) {
  Result<Fingerprint> fp = RequestFingerprint(method, target, content_type, body);
  EXPECT_TRUE(fp.has_value()) << fp.status().ToString();
  return fp.value_or(Fingerprint{});
}

TEST(RequestFingerprintTest, JsonIsCanonicalised) {
  const Fingerprint a = Fp("POST", "/v1/charges", "application/json", R"({"a":1,"b":[1,2]})");
  EXPECT_EQ(a, Fp("POST", "/v1/charges", "application/json", " {\n \"b\" : [1, 2.0],\"a\":1e0 } "));
  EXPECT_EQ(a,
            Fp("POST", "/v1/charges", "Application/JSON; charset=utf-8", R"({"b":[1,2],"a":1})"));
  EXPECT_EQ(a,
            Fp("POST", "/v1/charges", " application/json ;charset=UTF-8", R"({"b":[1,2],"a":1})"));
  EXPECT_EQ(a, Fp("POST", "/v1/charges", "application/vnd.api+json", R"({"b":[1,2],"a":1})"));
  EXPECT_EQ(a, Fp("POST", "/v1/charges", "application/merge-patch+JSON", R"({"b":[1,2],"a":1})"));
}

TEST(RequestFingerprintTest, DifferentRequestsDiffer) {
  const std::string_view json = "application/json";
  const Fingerprint a = Fp("POST", "/v1/charges", json, R"({"a":1})");
  EXPECT_NE(a, Fp("PUT", "/v1/charges", json, R"({"a":1})"));
  EXPECT_NE(a, Fp("post", "/v1/charges", json, R"({"a":1})"));  // methods are case-sensitive
  EXPECT_NE(a, Fp("POST", "/v1/refunds", json, R"({"a":1})"));
  EXPECT_NE(a, Fp("POST", "/v1/charges?x=1", json, R"({"a":1})"));
  EXPECT_NE(a, Fp("POST", "/v1/charges", json, R"({"a":2})"));
  EXPECT_NE(a, Fp("POST", "/v1/charges", json, R"({"a":"1"})"));
  // Same bytes, but not sent as JSON.
  EXPECT_NE(a, Fp("POST", "/v1/charges", "text/plain", R"({"a":1})"));
}

TEST(RequestFingerprintTest, PartsAreLengthPrefixed) {
  EXPECT_NE(Fp("POST", "/ab", "", "c"), Fp("POST", "/a", "", "bc"));
  EXPECT_NE(Fp("POS", "T/a", "", ""), Fp("POST", "/a", "", ""));
}

TEST(RequestFingerprintTest, InvalidJsonIsAnError) {
  for (std::string_view body : {"{", "{\"a\":1,}", "{\"a\":1}x", "nope", "{\"a\":1,\"a\":2}"}) {
    Result<Fingerprint> fp = RequestFingerprint("POST", "/", "application/json", body);
    ASSERT_FALSE(fp.has_value()) << body;
    EXPECT_EQ(fp.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(fp.error().message(), HasSubstr("JSON body does not parse"));
  }
  EXPECT_FALSE(RequestFingerprint("POST", "/", "application/problem+json", "{").has_value());
}

// A compressed JSON body is not JSON text until decoded: it is hashed as its bytes, not
// refused as invalid JSON.
TEST(RequestFingerprintTest, EncodedBodiesAreHashedAsBytes) {
  const std::string_view gzip("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xab\xae\x05\x00", 14);
  for (std::string_view coding : {"gzip", "GZIP", "br", " deflate ", "identity, gzip", "x-gzip"}) {
    Result<Fingerprint> fp = RequestFingerprint("POST", "/", "application/json", gzip, coding);
    ASSERT_TRUE(fp.has_value()) << coding << ": " << fp.error().ToString();
    EXPECT_EQ(*fp, FingerprintParts({"POST", "/", "bytes", gzip})) << coding;
  }
  // identity (or nothing) is no encoding: the JSON is still canonicalised, and checked.
  for (std::string_view coding : {"", "identity", " Identity ", "identity, identity"}) {
    EXPECT_EQ(*RequestFingerprint("POST", "/", "application/json", R"({ "a":1})", coding),
              FingerprintParts({"POST", "/", "json", R"({"a":1})"}))
        << coding;
    EXPECT_FALSE(RequestFingerprint("POST", "/", "application/json", gzip, coding).has_value())
        << coding;
  }
}

TEST(RequestFingerprintTest, OtherBodiesAreHashedAsBytes) {
  // Not JSON by content type: no parse, so anything goes, and whitespace matters.
  EXPECT_EQ(Fp("POST", "/", "text/plain", "{"), Fp("POST", "/", "text/plain", "{"));
  EXPECT_NE(Fp("POST", "/", "text/plain", R"({"a":1})"),
            Fp("POST", "/", "text/plain", R"({ "a":1})"));
  EXPECT_EQ(Fp("POST", "/", "application/octet-stream", "\xff\x00\x01"),
            Fp("POST", "/", "image/png", "\xff\x00\x01"));
  for (std::string_view type : {"", "application/jsonx", "application/json-seq", "text/json+xml",
                                "+json", "application/+json", "json"}) {
    EXPECT_TRUE(RequestFingerprint("POST", "/", type, "{").has_value()) << type;
  }
  EXPECT_EQ(Fp("POST", "/", "", "abc"), FingerprintParts({"POST", "/", "bytes", "abc"}));
}

TEST(RequestFingerprintTest, EmptyBodyIsBytesWhateverTheContentType) {
  EXPECT_EQ(Fp("POST", "/", "application/json", ""), Fp("POST", "/", "", ""));
}

// ---- PrincipalScope ----

bool IsPrintable(std::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7E) return false;
  }
  return true;
}

TEST(PrincipalScopeTest, RouteScopeThenCredentialHash) {
  const std::string s = PrincipalScope("/v1/charges", "Bearer sk_test_123");
  EXPECT_EQ(s.rfind("/v1/charges|", 0), 0u) << s;
  EXPECT_EQ(s.size(), std::string("/v1/charges|").size() + 32);
  EXPECT_TRUE(IsPrintable(s));
  EXPECT_EQ(s, PrincipalScope("/v1/charges", "Bearer sk_test_123"));
  EXPECT_EQ(s.find("sk_test"), std::string::npos);  // the credential itself is not stored
}

TEST(PrincipalScopeTest, DifferentCredentialsOrRoutesDiffer) {
  const std::string a = PrincipalScope("r", "Bearer a");
  EXPECT_NE(a, PrincipalScope("r", "Bearer b"));
  EXPECT_NE(a, PrincipalScope("r", "bearer a"));
  EXPECT_NE(a, PrincipalScope("q", "Bearer a"));
  EXPECT_NE(a, PrincipalScope("r", ""));
}

// With a secret the credential's hash is an HMAC under it: the same shape, another value for
// each secret, and nothing a reader of the store could recompute without the secret.
TEST(PrincipalScopeTest, WithASecretTheHashIsAnHmacUnderIt) {
  const std::string plain = PrincipalScope("r", "Bearer a");
  const std::string keyed = PrincipalScope("r", "Bearer a", "0123456789abcdef");
  EXPECT_NE(keyed, plain);
  EXPECT_EQ(keyed.size(), plain.size());
  EXPECT_TRUE(IsPrintable(keyed));
  EXPECT_EQ(keyed, PrincipalScope("r", "Bearer a", "0123456789abcdef"));
  EXPECT_NE(keyed, PrincipalScope("r", "Bearer a", "0123456789abcdeF"));
  EXPECT_NE(keyed, PrincipalScope("r", "Bearer b", "0123456789abcdef"));
  // HMAC-SHA-256(secret, "idem principal v2" NUL credential), its first 16 bytes in hex.
  const Fingerprint mac{internal::HmacSha256("0123456789abcdef",
                                             std::string("idem principal v2") + '\0' + "Bearer a")};
  EXPECT_EQ(keyed, "r|" + mac.Hex().substr(0, 32));
  EXPECT_EQ(PrincipalScope("r", "", "0123456789abcdef"), "r|anonymous");
}

TEST(PrincipalScopeTest, EmptyCredentialIsAnonymous) {
  EXPECT_EQ(PrincipalScope("r", ""), "r|anonymous");
  EXPECT_EQ(PrincipalScope("", ""), "|anonymous");
}

TEST(PrincipalScopeTest, BoundedAndPrintableWhateverTheInput) {
  const std::string long_scope(1000, 's');
  const std::string binary("\x00\xff\n\x7f r", 6);
  for (const std::string& route :
       {long_scope, binary, std::string(63, 'x'), std::string(64, 'x')}) {
    for (const std::string& cred : {std::string(), std::string(10000, 'c'), binary}) {
      const std::string s = PrincipalScope(route, cred);
      EXPECT_LE(s.size(), 96u);
      EXPECT_TRUE(IsPrintable(s)) << s;
    }
  }
  EXPECT_EQ(PrincipalScope(std::string(63, 'x'), "c").size(), 96u);
  // Long scopes that share a prefix stay apart.
  EXPECT_NE(PrincipalScope(long_scope + "a", "c"), PrincipalScope(long_scope + "b", "c"));
  EXPECT_NE(PrincipalScope(std::string(64, 'x'), "c"), PrincipalScope(std::string(65, 'x'), "c"));
}

// ---- IsHopByHop ----

TEST(IsHopByHopTest, TheEightHeadersInAnyCase) {
  for (std::string_view name :
       {"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "connection", "KEEP-ALIVE", "te", "transfer-encoding",
        "uPgRaDe"}) {
    EXPECT_TRUE(IsHopByHop(name)) << name;
  }
}

TEST(IsHopByHopTest, OthersAreEndToEnd) {
  for (std::string_view name : {"Content-Type", "Content-Length", "Set-Cookie", "Authorization", "",
                                "T", "TEE", "Connection ", "Trailers", "Upgrade-Insecure"}) {
    EXPECT_FALSE(IsHopByHop(name)) << name;
  }
}

// ---- OriginForm ----

TEST(OriginFormTest, AbsoluteFormBecomesPathAndQuery) {
  EXPECT_EQ(*OriginForm("http://127.0.0.1:8080/charges"), "/charges");
  EXPECT_EQ(*OriginForm("HTTPS://api.example/v1/charges?x=1"), "/v1/charges?x=1");
  EXPECT_EQ(*OriginForm("http://host"), "/");
  EXPECT_EQ(*OriginForm("http://host?x=1"), "/?x=1");
  EXPECT_EQ(*OriginForm("http://[::1]:80/a/b"), "/a/b");
}

TEST(OriginFormTest, OriginFormIsKept) {
  EXPECT_EQ(*OriginForm("/charges?x=http://y"), "/charges?x=http://y");
  EXPECT_EQ(*OriginForm("/"), "/");
}

TEST(OriginFormTest, OtherFormsAndMalformedUrlsAreRejected) {
  for (std::string_view bad : {"*", "host:443", "ftp://host/x", "http:/x", "http:///charges",
                               "http://?x", "http://user@host/x", "charges", ""}) {
    auto r = OriginForm(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// ---- Encode/DecodeStoredResponse ----

StoredResponse Sample() {
  StoredResponse r;
  r.status = 201;
  r.headers = {
      {"Content-Type", "application/json"}, {"Location", "/v1/charges/ch_1"}, {"X-Empty", ""}};
  r.body = R"({"id":"ch_1"})";
  r.body_size = r.body.size();
  return r;
}

StoredResponse RoundTrip(const StoredResponse& r) {
  Result<StoredResponse> decoded = DecodeStoredResponse(EncodeStoredResponse(r));
  EXPECT_TRUE(decoded.has_value()) << decoded.status().ToString();
  return decoded.value_or(StoredResponse{});
}

void ExpectDataLoss(std::string_view bytes, std::string_view message_part) {
  Result<StoredResponse> decoded = DecodeStoredResponse(bytes);
  ASSERT_FALSE(decoded.has_value());
  EXPECT_EQ(decoded.error().code(), StatusCode::kDataLoss);
  EXPECT_THAT(decoded.error().message(), HasSubstr(std::string(message_part)));
}

TEST(StoredResponseTest, RoundTrips) {
  EXPECT_EQ(RoundTrip(Sample()), Sample());
  EXPECT_EQ(RoundTrip(StoredResponse{}), StoredResponse{});
}

TEST(StoredResponseTest, EmptyBodyAndNoHeaders) {
  StoredResponse r;
  r.status = 204;
  EXPECT_EQ(RoundTrip(r), r);
  EXPECT_EQ(EncodeStoredResponse(r).size(), 6u);  // version, flags, status (2), count, size
}

TEST(StoredResponseTest, ManyHeadersAndBinaryBytes) {
  StoredResponse r;
  r.status = 200;
  for (int i = 0; i < 1000; ++i) {
    r.headers.emplace_back("X-H" + std::to_string(i),
                           std::string(static_cast<std::size_t>(i), 'v'));
  }
  r.headers.emplace_back(std::string("\0\xff", 2), std::string("\r\n\0", 3));
  r.headers.emplace_back("Set-Cookie", "a=1");
  r.headers.emplace_back("Set-Cookie", "b=2");  // repeated names keep their order
  r.body = std::string(100000, '\0') + "\xff\x80";
  r.body_size = r.body.size();
  EXPECT_EQ(RoundTrip(r), r);
}

TEST(StoredResponseTest, BodyOmitted) {
  StoredResponse r = Sample();
  r.body.clear();
  r.body_omitted = true;
  r.body_size = std::uint64_t{5} << 40;
  EXPECT_EQ(RoundTrip(r), r);
  // Only the size is stored: a body handed in anyway is dropped.
  StoredResponse with_body = r;
  with_body.body = "ignored";
  EXPECT_EQ(RoundTrip(with_body), r);
}

TEST(StoredResponseTest, KeptBodyDefinesBodySize) {
  StoredResponse r = Sample();
  r.body_size = 0;
  EXPECT_EQ(RoundTrip(r).body_size, r.body.size());
}

TEST(StoredResponseTest, ExtremeValues) {
  StoredResponse r;
  r.status = 0xFFFFFFFFu;
  r.body_omitted = true;
  r.body_size = UINT64_MAX;
  EXPECT_EQ(RoundTrip(r), r);
}

TEST(StoredResponseTest, EveryTruncationIsRejected) {
  for (const StoredResponse& r : {Sample(), StoredResponse{}}) {
    StoredResponse omitted = r;
    omitted.body.clear();
    omitted.body_omitted = true;
    omitted.body_size = 300;
    for (const StoredResponse& s : {r, omitted}) {
      const std::string bytes = EncodeStoredResponse(s);
      for (std::size_t n = 0; n < bytes.size(); ++n) {
        Result<StoredResponse> decoded = DecodeStoredResponse(std::string_view(bytes).substr(0, n));
        ASSERT_FALSE(decoded.has_value()) << "prefix of " << n << " of " << bytes.size();
        EXPECT_EQ(decoded.error().code(), StatusCode::kDataLoss);
      }
    }
  }
}

TEST(StoredResponseTest, TrailingBytesAreRejected) {
  const std::string bytes = EncodeStoredResponse(Sample());
  ExpectDataLoss(bytes + '\0', "1 bytes after its end");
  ExpectDataLoss(bytes + "abc", "3 bytes after its end");
  ExpectDataLoss(bytes + bytes, "after its end");
}

TEST(StoredResponseTest, VersionAndFlagsAreChecked) {
  std::string bytes = EncodeStoredResponse(Sample());
  ExpectDataLoss("", "truncated in the version");
  bytes[0] = 2;
  ExpectDataLoss(bytes, "unknown version 2");
  bytes[0] = 0;
  ExpectDataLoss(bytes, "unknown version 0");
  bytes[0] = 1;
  bytes[1] = 2;
  ExpectDataLoss(bytes, "unknown flags 0x02");
  bytes[1] = static_cast<char>(0x81);
  ExpectDataLoss(bytes, "unknown flags 0x81");
}

TEST(StoredResponseTest, VarintsMustBeCanonical) {
  // Status 200 as a two-byte varint is C8 01; padded to three bytes it is C8 81 00.
  ExpectDataLoss(std::string("\x01\x00\xc8\x81\x00\x00\x00", 7), "status is not in its shortest");
  // Status 0 as 80 00.
  ExpectDataLoss(std::string("\x01\x00\x80\x00\x00\x00", 6), "shortest form");
  // Eleven continuation bytes, and a tenth byte with more than the 64th bit.
  ExpectDataLoss(std::string("\x01\x00", 2) + std::string(11, '\xff'), "overflows 64 bits");
  ExpectDataLoss(std::string("\x01\x01\x00\x00", 4) + std::string(9, '\xff') + '\x02',
                 "body size overflows 64 bits");
  // 2^32 does not fit a status.
  ExpectDataLoss(std::string("\x01\x00\x80\x80\x80\x80\x10\x00\x00", 9), "has status 4294967296");
}

TEST(StoredResponseTest, LengthsBeyondTheInputAreRejected) {
  // One header whose name claims 100 bytes.
  ExpectDataLoss(std::string("\x01\x00\x00\x01\x64"
                             "ab",
                             7),
                 "truncated in the header name");
  // A header count larger than the bytes could hold.
  ExpectDataLoss(std::string("\x01\x00\x00\xff\xff\xff\xff\x0f\x00", 9), "truncated");
  // A body claiming 2^63 bytes.
  ExpectDataLoss(std::string("\x01\x00\x00\x00", 4) + std::string(8, '\x80') + '\x80' + '\x01',
                 "truncated in the body");
}

// ---- ProblemJson ----

TEST(ProblemJsonTest, Shape) {
  Problem p{422, "https://idem.dev/problems/key-reuse", "Idempotency-Key reused", "k"};
  EXPECT_EQ(ProblemJson(p),
            R"({"type":"https://idem.dev/problems/key-reuse","title":"Idempotency-Key reused",)"
            R"("status":422,"detail":"k"})");
}

TEST(ProblemJsonTest, DefaultsAndEmptyDetail) {
  EXPECT_EQ(ProblemJson(Problem{}), R"({"type":"about:blank","title":"","status":500})");
}

TEST(ProblemJsonTest, EscapesStrings) {
  Problem p{400, "t", "q\"b\\", std::string("a\nb\x01\x1f\x7f\0z", 8)};
  EXPECT_EQ(ProblemJson(p),
            R"({"type":"t","title":"q\"b\\","status":400,"detail":"a\u000Ab\u0001\u001F)"
            "\x7f"
            R"(\u0000z"})");
}

TEST(ProblemJsonTest, KeepsUtf8AndReplacesInvalidBytes) {
  Problem p{400, "t", "t", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"};
  EXPECT_THAT(ProblemJson(p), HasSubstr("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""));
  // Lone continuation, truncated, overlong, surrogate, beyond U+10FFFF, 0xFF.
  p.detail =
      "a\x80"
      "b\xe2\x82"
      "c\xc0\xaf"
      "d\xed\xa0\x80"
      "e\xf4\x90\x80\x80"
      "f\xff";
  const std::string json = ProblemJson(p);
  EXPECT_THAT(json, HasSubstr(R"("a\ufffdb\ufffd\ufffdc\ufffd\ufffdd\ufffd\ufffd\ufffde)"
                              R"(\ufffd\ufffd\ufffd\ufffdf\ufffd")"));
}

TEST(ProblemJsonTest, AlwaysParsesAsJson) {
  std::string every_byte;
  for (int i = 0; i < 256; ++i) every_byte.push_back(static_cast<char>(i));
  for (const std::string& detail : {std::string("plain"), every_byte,
                                    std::string("\"\\/\b\f\n\r\t"), std::string("\xf0\x9f")}) {
    Problem p{400, "https://idem.dev/problems/x", "T \"x\"", detail};
    const std::string json = ProblemJson(p);
    Result<std::string> canonical = CanonicalizeJson(json);
    EXPECT_TRUE(canonical.has_value()) << json << ": " << canonical.status().ToString();
  }
}

TEST(ProblemJsonTest, RoundTripsThroughJsonPointer) {
  Problem p{409, "https://idem.dev/problems/in-flight", "T", "key \"a\\b\"\n\xc3\xa9"};
  const std::string json = ProblemJson(p);
  EXPECT_EQ(JsonPointerText(json, "/detail").value_or("?"), p.detail);
  EXPECT_EQ(JsonPointerText(json, "/status").value_or("?"), "409");
  EXPECT_EQ(JsonPointerText(json, "/type").value_or("?"), p.type);
}

// ---- problems:: ----

struct Expected {
  Problem problem;
  unsigned status;
  std::string_view type;
};

TEST(ProblemsTest, StatusesAndTypes) {
  const Expected all[] = {
      {problems::MissingKey(), 400, "missing-key"},
      {problems::InvalidKey("bad"), 400, "invalid-key"},
      {problems::KeyReuse("k1"), 422, "key-reuse"},
      {problems::InFlight("k1"), 409, "in-flight"},
      {problems::StoreUnavailable("down"), 503, "store-unavailable"},
      {problems::BodyTooLarge(1024), 413, "body-too-large"},
      {problems::HeadersTooLarge(), 431, "headers-too-large"},
      {problems::TargetTooLong(), 414, "target-too-long"},
      {problems::InvalidBody("bad json"), 400, "invalid-body"},
      {problems::MalformedRequest("bad method"), 400, "malformed-request"},
      {problems::UnsupportedTransferCoding("gzip"), 501, "unsupported-transfer-coding"},
      {problems::InvalidPrincipal("two headers"), 400, "invalid-principal"},
      {problems::InvalidTarget("no host"), 400, "invalid-target"},
      {problems::UpstreamFailed("refused"), 502, "upstream-failed"},
      {problems::UpstreamTimeout(), 504, "upstream-timeout"},
      {problems::ReplayTooLarge(99), 502, "replay-too-large"},
  };
  for (const Expected& e : all) {
    EXPECT_EQ(e.problem.status, e.status) << e.type;
    EXPECT_EQ(e.problem.type, "https://idem.dev/problems/" + std::string(e.type));
    EXPECT_FALSE(e.problem.title.empty()) << e.type;
    EXPECT_LE(e.problem.title.size(), 40u) << e.problem.title;
    EXPECT_FALSE(e.problem.detail.empty()) << e.type;
    EXPECT_TRUE(CanonicalizeJson(ProblemJson(e.problem)).has_value()) << e.type;
  }
}

TEST(ProblemsTest, DetailsNameWhatTheyAreAbout) {
  EXPECT_EQ(problems::InvalidKey("Idempotency-Key is empty").detail, "Idempotency-Key is empty");
  EXPECT_THAT(problems::KeyReuse("order-17").detail, HasSubstr("\"order-17\""));
  EXPECT_THAT(problems::InFlight("order-17").detail, HasSubstr("\"order-17\""));
  EXPECT_THAT(problems::BodyTooLarge(1048576).detail, HasSubstr("1048576 bytes"));
  EXPECT_THAT(problems::ReplayTooLarge(123456789).detail, HasSubstr("123456789 bytes"));
  EXPECT_EQ(problems::StoreUnavailable("redis: connection refused").detail,
            "redis: connection refused");
  // A key with a quote still gives valid JSON.
  EXPECT_TRUE(CanonicalizeJson(ProblemJson(problems::KeyReuse("a\"b"))).has_value());
}

}  // namespace
}  // namespace idem::gateway
