// A small blocking HTTP/1.1 client for end-to-end tests over loopback: plain POSIX sockets, no
// Boost, so tests compile fast. It is deliberately strict (CRLF line ends, one Content-Length)
// so that a sloppy server shows up as a test failure.
//
// Errors: kUnavailable for connect failures, timeouts and a connection closed before a complete
// response; kInvalidArgument for a malformed response.
#ifndef IDEM_TESTS_SUPPORT_HTTP_CLIENT_H_
#define IDEM_TESTS_SUPPORT_HTTP_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/status.h"

namespace idem::testing {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

inline constexpr std::chrono::milliseconds kHttpTimeout{10'000};

struct HttpResponse {
  int status = 0;
  std::string reason;
  HttpHeaders headers;  // In arrival order, trailers of a chunked body last.
  std::string body;     // Decoded: no chunk framing.

  // The first value of header `name` (case-insensitive), or "" if absent.
  std::string Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
};

// Feed bytes, get responses (no I/O, like hiredis's reader).
class HttpResponseParser {
 public:
  void Feed(std::string_view bytes) { buffer_.append(bytes); }
  // The next response answers a HEAD request: it has no body whatever its headers say.
  void set_head_request(bool head) { head_request_ = head; }

  // The next complete response, removed from the buffer; nullopt until enough bytes arrived.
  // Interim 1xx responses are skipped.
  Result<std::optional<HttpResponse>> Next();
  // The peer closed the connection: a response whose body runs to the close is complete now.
  // kUnavailable if a response was cut short; nullopt if nothing was buffered.
  Result<std::optional<HttpResponse>> Finish();

  std::size_t buffered() const { return buffer_.size(); }

 private:
  Result<std::optional<HttpResponse>> Parse(bool at_eof);

  std::string buffer_;
  bool head_request_ = false;
};

// One keep-alive connection. Not thread-safe. Movable; closes the socket when destroyed.
class HttpConnection {
 public:
  static Result<HttpConnection> Connect(const std::string& host, std::uint16_t port,
                                        std::chrono::milliseconds timeout = kHttpTimeout);

  HttpConnection(HttpConnection&& other) noexcept;
  HttpConnection& operator=(HttpConnection&& other) noexcept;
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;
  ~HttpConnection();

  // Sends one request and reads its response. Adds Host, and Content-Length when there is a body
  // or the method is POST, PUT or PATCH, unless `headers` has them.
  Result<HttpResponse> Send(std::string_view method, std::string_view target,
                            const HttpHeaders& headers = {}, std::string_view body = {});

  // For malformed-request tests: writes `bytes` as they are.
  Status RawSend(std::string_view bytes);
  // Reads the next response (e.g. after RawSend).
  Result<HttpResponse> ReadResponse(bool head_request = false);
  // Waits up to `wait` for the server to close the connection; bytes that arrive meanwhile are
  // kept for ReadResponse. True if it closed (EOF or reset), false if it is still open.
  Result<bool> WaitForClose(std::chrono::milliseconds wait);

  // Per-call timeout of Send, RawSend and ReadResponse.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  bool open() const { return fd_ >= 0 && !peer_closed_; }
  void Close();

 private:
  HttpConnection(int fd, std::string host_header, std::chrono::milliseconds timeout)
      : fd_(fd), host_header_(std::move(host_header)), timeout_(timeout) {}
  Status WriteAll(std::string_view bytes, std::chrono::steady_clock::time_point deadline);
  // Reads what is available into the parser; false on EOF.
  Result<bool> ReadSome(std::chrono::steady_clock::time_point deadline);

  int fd_ = -1;
  std::string host_header_;
  std::chrono::milliseconds timeout_;
  HttpResponseParser parser_;
  bool peer_closed_ = false;
};

// One request on a fresh connection to 127.0.0.1:`port`.
Result<HttpResponse> HttpRequest(std::uint16_t port, std::string_view method,
                                 std::string_view target, const HttpHeaders& headers = {},
                                 std::string_view body = {},
                                 std::chrono::milliseconds timeout = kHttpTimeout);

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_HTTP_CLIENT_H_
