// HttpHandler against a loopback HTTP/1.1 server of the test's own (plain POSIX sockets), which
// counts the POSTs it receives and answers each with the response the test chose.
#include "consume/http_handler.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace idem::consume {
namespace {

// Serves one connection at a time, keeping each alive until the client closes it.
class HandlerServer {
 public:
  // The raw response to request number n (0, 1, ...); "": close the connection without one.
  using Responder = std::function<std::string(int n)>;

  explicit HandlerServer(Responder respond) : respond_(std::move(respond)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener_, 8) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }

  ~HandlerServer() {
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    if (thread_.joinable()) thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/charges"; }
  int posts() const { return posts_.load(); }
  int connections() const { return connections_.load(); }

 private:
  void Serve() {
    for (;;) {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      ++connections_;
      ServeConnection(fd);
      ::close(fd);
    }
  }

  void ServeConnection(int fd) {
    std::string in;
    for (;;) {
      const std::size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (!Receive(fd, in)) return;
        continue;
      }
      const std::size_t body = end + 4 + ContentLength(in.substr(0, end));
      while (in.size() < body) {
        if (!Receive(fd, in)) return;
      }
      in.erase(0, body);
      const std::string out = respond_(posts_++);
      if (out.empty()) return;
      // A client that stops reading an unwanted body closes the connection: not an error.
      for (std::size_t sent = 0; sent < out.size();) {
        const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return;
        sent += static_cast<std::size_t>(n);
      }
    }
  }

  static bool Receive(int fd, std::string& in) {
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  static std::size_t ContentLength(const std::string& head) {
    for (const char* name : {"Content-Length: ", "content-length: "}) {
      const std::size_t at = head.find(name);
      if (at != std::string::npos) return std::stoul(head.substr(at + std::string(name).size()));
    }
    return 0;
  }

  Responder respond_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int> posts_{0};
  std::atomic<int> connections_{0};
};

std::string Response(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string Chunked(int status, const std::string& body) {
  std::string out =
      "HTTP/1.1 " + std::to_string(status) + " X\r\nTransfer-Encoding: chunked\r\n\r\n";
  constexpr std::size_t kChunk = 64 * 1024;
  for (std::size_t at = 0; at < body.size(); at += kChunk) {
    const std::string part = body.substr(at, kChunk);
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", part.size());
    out += size + part + "\r\n";
  }
  return out + "0\r\n\r\n";
}

std::unique_ptr<HttpHandler> Open(const HandlerServer& server,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  ConsumerConfig config;
  config.handler = server.url();
  config.handler_timeout = timeout;
  auto handler = HttpHandler::Open(config);
  EXPECT_TRUE(handler.has_value()) << handler.error().ToString();
  return handler ? std::move(*handler) : nullptr;
}

HandlerVerdict Post(HttpHandler& handler, std::string key) {
  BrokerMessage message{.partition = "p0", .position = "0", .payload = R"({"amount":3})"};
  HandlerContext context{.scope = "payments", .key = key, .attempt = 1, .token = 1};
  return handler.Handle(context, message);
}

TEST(HttpHandlerTest, AnswersByStatus) {
  HandlerServer server([](int n) {
    return n == 0 ? Response(201, "made") : n == 1 ? Response(422, "bad") : Response(503, "later");
  });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  HandlerVerdict ok = Post(*handler, "a");
  EXPECT_EQ(ok.verdict, Verdict::kSuccess);
  EXPECT_EQ(ok.detail, "201 made");
  EXPECT_EQ(Post(*handler, "b").verdict, Verdict::kPermanent);
  EXPECT_EQ(Post(*handler, "c").verdict, Verdict::kRetryable);
  EXPECT_EQ(server.posts(), 3);
  EXPECT_EQ(server.connections(), 1);  // kept alive
}

// A handler that succeeded with a body over the 1 MiB read limit succeeded: the verdict is the
// status line's. The request must not be sent again (on a kept-alive connection it was, at once,
// then retried by the consumer until dead-lettered), and the connection, left in the middle of
// the body, is not reused.
TEST(HttpHandlerTest, ABodyOverTheLimitIsASuccessPostedOnce) {
  const std::string big(2 << 20, 'x');
  HandlerServer server([&](int n) { return n == 1 ? Response(200, big) : Response(200, "ok"); });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(Post(*handler, "first").verdict, Verdict::kSuccess);  // the connection stays open
  HandlerVerdict big_one = Post(*handler, "big");
  EXPECT_EQ(big_one.verdict, Verdict::kSuccess) << big_one.detail;
  EXPECT_EQ(big_one.detail, "200 ");
  EXPECT_EQ(server.posts(), 2);
  // The next message goes over a new connection.
  HandlerVerdict next = Post(*handler, "next");
  EXPECT_EQ(next.verdict, Verdict::kSuccess);
  EXPECT_EQ(next.detail, "200 ok");
  EXPECT_EQ(server.posts(), 3);
  EXPECT_EQ(server.connections(), 2);
}

// The same with a chunked body, whose size shows only while it is read.
TEST(HttpHandlerTest, AChunkedBodyOverTheLimitIsASuccessPostedOnce) {
  const std::string big(2 << 20, 'y');
  HandlerServer server([&](int n) { return n == 1 ? Chunked(200, big) : Response(200, "ok"); });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(Post(*handler, "first").verdict, Verdict::kSuccess);
  HandlerVerdict big_one = Post(*handler, "big");
  EXPECT_EQ(big_one.verdict, Verdict::kSuccess) << big_one.detail;
  EXPECT_EQ(server.posts(), 2);
  EXPECT_EQ(Post(*handler, "next").detail, "200 ok");
  EXPECT_EQ(server.posts(), 3);
}

// A kept-alive connection closed before any answer came: the request goes again over a new one.
TEST(HttpHandlerTest, AReusedConnectionClosedBeforeAnyAnswerIsSentAgainOnce) {
  HandlerServer server([](int n) {
    return n == 0 ? Response(200, "ok") : n == 1 ? std::string() : Response(200, "again");
  });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(Post(*handler, "a").verdict, Verdict::kSuccess);
  HandlerVerdict again = Post(*handler, "b");
  EXPECT_EQ(again.verdict, Verdict::kSuccess) << again.detail;
  EXPECT_EQ(again.detail, "200 again");
  EXPECT_EQ(server.posts(), 3);
  EXPECT_EQ(server.connections(), 2);
}

// handler_timeout bounds the whole call, the reconnect after a reused connection was closed
// included.
TEST(HttpHandlerTest, OneTimeoutBoundsTheWholeCallAReconnectIncluded) {
  HandlerServer server([](int n) {
    if (n == 0) return Response(200, "ok");
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    return n == 1 ? std::string() : Response(200, "late");
  });
  auto handler = Open(server, std::chrono::milliseconds(1'000));
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(Post(*handler, "a").verdict, Verdict::kSuccess);
  const auto started = std::chrono::steady_clock::now();
  HandlerVerdict late = Post(*handler, "b");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(late.verdict, Verdict::kRetryable) << late.detail;
  EXPECT_LT(took, std::chrono::milliseconds(1'300));
}

// An interim answer (103 Early Hints) is not the verdict: the final status after it is. Taken as
// final, it left its request's real answer to be read as the next request's.
TEST(HttpHandlerTest, InterimAnswersAreReadPastToTheFinalStatus) {
  HandlerServer server([](int n) {
    const std::string early = "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n";
    return n == 0 ? early + early + Response(400, "no") : Response(200, "ok");
  });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  HandlerVerdict refused = Post(*handler, "bad");
  EXPECT_EQ(refused.verdict, Verdict::kPermanent) << refused.detail;
  EXPECT_EQ(refused.detail, "handler answered 400: no");
  HandlerVerdict next = Post(*handler, "good");
  EXPECT_EQ(next.verdict, Verdict::kSuccess) << next.detail;
  EXPECT_EQ(next.detail, "200 ok");
  EXPECT_EQ(server.posts(), 2);
  EXPECT_EQ(server.connections(), 1);
}

// An answer's header block up to 64 KiB is read (Beast's 8 KiB default made a 200 with a large
// header look like no answer, and the request was sent again); a larger one is a retryable
// failure, but the request, which the handler answered, is not sent again at once.
TEST(HttpHandlerTest, ALargeAnswerHeaderIsReadAndOneTooLargeIsNotSentAgain) {
  const auto with_header = [](std::size_t bytes) {
    return "HTTP/1.1 200 OK\r\nX-Big: " + std::string(bytes, 'b') +
           "\r\nContent-Length: 2\r\n\r\nok";
  };
  HandlerServer server([&](int n) {
    return n == 0 ? Response(200, "first") : n == 1 ? with_header(20'000) : with_header(100'000);
  });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  EXPECT_EQ(Post(*handler, "first").verdict, Verdict::kSuccess);
  HandlerVerdict big = Post(*handler, "big");
  EXPECT_EQ(big.verdict, Verdict::kSuccess) << big.detail;
  EXPECT_EQ(server.posts(), 2);
  HandlerVerdict huge = Post(*handler, "huge");
  EXPECT_EQ(huge.verdict, Verdict::kRetryable) << huge.detail;
  EXPECT_EQ(server.posts(), 3);
}

// What an HTTP header cannot carry as it is fails the message for good, without a request: a
// key with CR LF would have added a header of the message's choosing to the request, one with
// spaces around it would have reached the handler trimmed, unlike the key stored.
TEST(HttpHandlerTest, KeysAndHeadersAnHttpHeaderCannotCarryArePermanentFailures) {
  HandlerServer server([](int) { return Response(200, "ok"); });
  auto handler = Open(server);
  ASSERT_NE(handler, nullptr);
  for (const std::string& key :
       {std::string("k3\r\nX-Injected: yes"), std::string("  k5  "), std::string("nul\0byte", 8)}) {
    HandlerVerdict v = Post(*handler, key);
    EXPECT_EQ(v.verdict, Verdict::kPermanent) << key;
    EXPECT_NE(v.detail.find("the key cannot be sent in an HTTP header"), std::string::npos)
        << v.detail;
  }
  BrokerMessage message{.partition = "p0",
                        .position = "0",
                        .payload = "{}",
                        .headers = {{"Content-Type", "application/json\r\nX-Evil: 1"}}};
  HandlerContext context{.scope = "payments", .key = "k", .attempt = 1, .token = 1};
  HandlerVerdict v = handler->Handle(context, message);
  EXPECT_EQ(v.verdict, Verdict::kPermanent);
  EXPECT_NE(v.detail.find("Content-Type"), std::string::npos) << v.detail;
  EXPECT_EQ(server.posts(), 0);
  EXPECT_EQ(Post(*handler, "fine\tkey").verdict, Verdict::kSuccess);  // HTAB inside is allowed
}

}  // namespace
}  // namespace idem::consume
