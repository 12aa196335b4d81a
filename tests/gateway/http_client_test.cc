// The test HTTP client's response parser, fed bytes by hand: Content-Length and chunked bodies,
// responses split at every byte, and malformed input.
#include <optional>
#include <string>
#include <string_view>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"

namespace idem::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

HttpResponse ParseOne(std::string_view bytes) {
  HttpResponseParser parser;
  parser.Feed(bytes);
  Result<std::optional<HttpResponse>> r = parser.Next();
  EXPECT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ(parser.buffered(), 0u);
  return r.has_value() && r->has_value() ? **r : HttpResponse{};
}

TEST(HttpResponseParserTest, ContentLength) {
  const HttpResponse r = ParseOne(
      "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\ncontent-length: 11\r\n\r\n"
      "{\"id\":1234}");
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.reason, "Created");
  EXPECT_EQ(r.body, "{\"id\":1234}");
  EXPECT_EQ(r.Header("CONTENT-TYPE"), "application/json");
  EXPECT_TRUE(r.HasHeader("Content-Length"));
  EXPECT_FALSE(r.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(r.Header("Idempotent-Replayed"), "");
}

TEST(HttpResponseParserTest, ChunkedWithExtensionsAndTrailers) {
  const HttpResponse r = ParseOne(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello 0123456789");
  EXPECT_EQ(r.Header("x-trailer"), "t");
}

TEST(HttpResponseParserTest, EveryByteAtATimeAndPipelined) {
  const std::string two =
      "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ndef\r\n0\r\n\r\n";
  HttpResponseParser parser;
  std::string bodies;
  for (const char c : two) {
    parser.Feed(std::string_view(&c, 1));
    Result<std::optional<HttpResponse>> r = parser.Next();
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    if (r->has_value()) bodies += (*r)->body + "|";
  }
  EXPECT_EQ(bodies, "abc|def|");
  EXPECT_EQ(parser.buffered(), 0u);
}

TEST(HttpResponseParserTest, SkipsInterimResponses) {
  const HttpResponse r =
      ParseOne("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n");
  EXPECT_EQ(r.status, 204);
  EXPECT_THAT(r.headers, ElementsAre(Pair("X-A", "1")));
}

TEST(HttpResponseParserTest, HeadResponseHasNoBody) {
  HttpResponseParser parser;
  parser.set_head_request(true);
  parser.Feed("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
  Result<std::optional<HttpResponse>> r = parser.Next();
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ((*r)->body, "");
}

TEST(HttpResponseParserTest, BodyUntilClose) {
  HttpResponseParser parser;
  parser.Feed("HTTP/1.0 200 OK\r\n\r\nall of ");
  Result<std::optional<HttpResponse>> r = parser.Next();
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->has_value());
  parser.Feed("it");
  r = parser.Finish();
  ASSERT_TRUE(r.has_value() && r->has_value());
  EXPECT_EQ((*r)->body, "all of it");
}

TEST(HttpResponseParserTest, CutShortIsUnavailable) {
  HttpResponseParser parser;
  parser.Feed("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
  Result<std::optional<HttpResponse>> r = parser.Next();
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->has_value());
  r = parser.Finish();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kUnavailable);
}

TEST(HttpResponseParserTest, RejectsMalformedResponses) {
  for (const std::string_view bad : {
           std::string_view("HTTX/1.1 200 OK\r\n\r\n"),
           std::string_view("HTTP/1.1 2x0 OK\r\n\r\n"),
           std::string_view("HTTP/1.1 200 OK\r\nno colon\r\n\r\n"),
           std::string_view("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
           std::string_view("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
           std::string_view("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
           std::string_view("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n"),
       }) {
    HttpResponseParser parser;
    parser.Feed(bad);
    const Result<std::optional<HttpResponse>> r = parser.Next();
    EXPECT_FALSE(r.has_value()) << bad;
    if (!r.has_value()) {
      EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

TEST(ParsePortTest, ReadyLines) {
  Result<std::uint16_t> port = ParseListeningPort("ledger listening on 127.0.0.1:9000");
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(*port, 9000);
  const std::string_view idemd = "idemd listening on 127.0.0.1:18080 admin 127.0.0.1:18081";
  port = ParseListeningPort(idemd);
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(*port, 18080);
  port = ParsePortAfter(idemd, "admin");
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(*port, 18081);
  port = ParseListeningPort("x listening on [::1]:443");
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(*port, 443);
  EXPECT_FALSE(ParseListeningPort("ledger listening on 127.0.0.1").has_value());
  EXPECT_FALSE(ParseListeningPort("ledger listening on 127.0.0.1:0").has_value());
  EXPECT_FALSE(ParseListeningPort("ledger started").has_value());
}

}  // namespace
}  // namespace idem::testing
