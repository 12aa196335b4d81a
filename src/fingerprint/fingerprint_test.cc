// Fingerprint, FingerprintBytes/Parts/Json: SHA-256 test vectors, hex, and what equal
// fingerprints mean.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fingerprint/sha256.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

using ::testing::HasSubstr;

// FIPS 180-2 / NIST examples.
TEST(FingerprintBytesTest, KnownSha256Vectors) {
  EXPECT_EQ(FingerprintBytes("abc").Hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(FingerprintBytes("").Hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(FingerprintBytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").Hex(),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(FingerprintBytes(std::string(1000000, 'a')).Hex(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// RFC 4231, test cases 1, 2 and 6 (a key longer than SHA-256's block).
TEST(HmacSha256Test, Rfc4231Vectors) {
  auto hex = [](const internal::Sha256Digest& d) { return Fingerprint{d}.Hex(); };
  EXPECT_EQ(hex(internal::HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(internal::HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(internal::HmacSha256(std::string(131, '\xaa'),
                                     "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(FingerprintBytesTest, HashesBytesAsTheyAre) {
  EXPECT_NE(FingerprintBytes("{\"a\":1}"), FingerprintBytes("{ \"a\": 1 }"));
  EXPECT_EQ(FingerprintBytes(std::string_view("\0x", 2)), FingerprintBytes(std::string("\0x", 2)));
  EXPECT_NE(FingerprintBytes(std::string_view("\0x", 2)), FingerprintBytes("x"));
}

TEST(FingerprintTest, HexRoundTrip) {
  Fingerprint fp = FingerprintBytes("abc");
  std::string hex = fp.Hex();
  EXPECT_EQ(hex.size(), 64u);
  Result<Fingerprint> parsed = Fingerprint::FromHex(hex);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, fp);
  // Upper case is accepted; Hex() always writes lower case.
  std::string upper = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
  Result<Fingerprint> from_upper = Fingerprint::FromHex(upper);
  ASSERT_TRUE(from_upper.has_value());
  EXPECT_EQ(*from_upper, fp);
  EXPECT_EQ(Fingerprint{}.Hex(), std::string(64, '0'));
}

TEST(FingerprintTest, FromHexRejectsBadInput) {
  std::string good = FingerprintBytes("abc").Hex();
  auto error = [](std::string_view hex) {
    Result<Fingerprint> r = Fingerprint::FromHex(hex);
    EXPECT_FALSE(r.has_value()) << hex;
    if (r.has_value()) return std::string();
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    return r.error().message();
  };
  EXPECT_THAT(error(""), HasSubstr("64 hex characters, got 0"));
  EXPECT_THAT(error(good.substr(0, 63)), HasSubstr("got 63"));
  EXPECT_THAT(error(good + "0"), HasSubstr("got 65"));
  std::string bad = good;
  bad[0] = 'g';
  EXPECT_THAT(error(bad), HasSubstr("non-hex character at position 0"));
  EXPECT_THAT(error(good.substr(0, 63) + " "), HasSubstr("position 63"));
  EXPECT_THAT(error(good.substr(0, 10) + "-" + good.substr(11)), HasSubstr("position 10"));
}

TEST(FingerprintJsonTest, IsSha256OfTheCanonicalForm) {
  constexpr std::string_view kJson = R"({ "b" : [1, 2.50, "x"], "a" : null })";
  Result<std::string> canonical = CanonicalizeJson(kJson);
  ASSERT_TRUE(canonical.has_value());
  EXPECT_EQ(*canonical, R"({"a":null,"b":[1,2.5,"x"]})");
  Result<Fingerprint> fp = FingerprintJson(kJson);
  ASSERT_TRUE(fp.has_value());
  EXPECT_EQ(*fp, FingerprintBytes(*canonical));
}

TEST(FingerprintJsonTest, SemanticallyEqualDocumentsAgree) {
  Result<Fingerprint> a = FingerprintJson(R"({"b":1,"a":2})");
  Result<Fingerprint> b = FingerprintJson("{ \"a\" : 2.0, \"b\" : 1 }");
  Result<Fingerprint> c = FingerprintJson("{\"a\":2e0,\n\t\"\\u0062\":1.000}");
  ASSERT_TRUE(a.has_value() && b.has_value() && c.has_value());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *c);
  Result<Fingerprint> different = FingerprintJson(R"({"b":1,"a":3})");
  ASSERT_TRUE(different.has_value());
  EXPECT_NE(*a, *different);
  // Array order matters; a number and a string that looks like it differ.
  EXPECT_NE(*FingerprintJson("[1,2]"), *FingerprintJson("[2,1]"));
  EXPECT_NE(*FingerprintJson(R"({"a":1})"), *FingerprintJson(R"({"a":"1"})"));
}

TEST(FingerprintJsonTest, RejectsWhatCanonicalizeJsonRejects) {
  Result<Fingerprint> r = FingerprintJson(R"({"a":1,"a":2})");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.error().message(), HasSubstr("duplicate member name"));
  EXPECT_FALSE(FingerprintJson("").has_value());
  EXPECT_FALSE(FingerprintJson("[1e400]").has_value());
}

TEST(FingerprintJsonTest, ThreadsDoNotShareState) {
  // Each thread canonicalises its own documents with its own buffers.
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failures] {
      std::string doc = "{\"thread\":";
      doc += std::to_string(t);
      doc += ",\"list\":[";
      for (int i = 0; i < 50; ++i) {
        if (i > 0) doc += ",";
        doc += std::to_string(i * t);
      }
      doc += "]}";
      Result<std::string> canonical = CanonicalizeJson(doc);
      Fingerprint expected = FingerprintBytes(*canonical);
      for (int i = 0; i < 2000; ++i) {
        Result<Fingerprint> fp = FingerprintJson(doc);
        if (!fp.has_value() || *fp != expected) ++failures[static_cast<std::size_t>(t)];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

// The length-prefix framing: an 8-byte little-endian length before each part.
std::string Framed(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) {
    std::uint64_t size = part.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((size >> (8 * i)) & 0xFF));
    out.append(part);
  }
  return out;
}

TEST(FingerprintPartsTest, PrefixesEachPartWithItsLength) {
  EXPECT_EQ(FingerprintParts({"POST", "/v1/payments", "{}"}),
            FingerprintBytes(Framed({"POST", "/v1/payments", "{}"})));
  EXPECT_EQ(FingerprintParts({}), FingerprintBytes(""));
  EXPECT_EQ(FingerprintParts({""}), FingerprintBytes(std::string(8, '\0')));
  std::string big(300, 'x');
  EXPECT_EQ(FingerprintParts({big}), FingerprintBytes(Framed({big})));
}

TEST(FingerprintPartsTest, SeparatesParts) {
  EXPECT_NE(FingerprintParts({"ab", "c"}), FingerprintParts({"a", "bc"}));
  EXPECT_NE(FingerprintParts({"abc"}), FingerprintParts({"ab", "c"}));
  EXPECT_NE(FingerprintParts({"", "x"}), FingerprintParts({"x", ""}));
  EXPECT_NE(FingerprintParts({}), FingerprintParts({""}));
  EXPECT_NE(FingerprintParts({"abc"}), FingerprintBytes("abc"));
  EXPECT_EQ(FingerprintParts({"GET", "/a"}), FingerprintParts({"GET", "/a"}));
}

}  // namespace
}  // namespace idem
