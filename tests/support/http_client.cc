#include "tests/support/http_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace idem::testing {
namespace {

// A response head larger than this is a server bug, not something to wait for.
constexpr std::size_t kMaxHead = 1 << 20;

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
           return lower(x) == lower(y);
         });
}

bool ContainsIgnoreCase(std::string_view haystack, std::string_view needle) {
  if (needle.size() > haystack.size()) return false;
  for (std::size_t i = 0; i + needle.size() <= haystack.size(); ++i) {
    if (EqualsIgnoreCase(haystack.substr(i, needle.size()), needle)) return true;
  }
  return false;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// "Name: value" into `headers`; false if malformed.
bool ParseHeaderLine(std::string_view line, HttpHeaders& headers) {
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  const std::string_view name = line.substr(0, colon);
  if (name.find_first_of(" \t") != std::string_view::npos) return false;
  headers.emplace_back(std::string(name), std::string(Trim(line.substr(colon + 1))));
  return true;
}

std::string ErrnoText(std::string_view what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

int MillisLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1'000'000));
}

// Waits until `fd` is ready for `events`; kUnavailable at the deadline.
Status PollUntil(int fd, short events, std::chrono::steady_clock::time_point deadline,
                 std::string_view what) {
  while (true) {
    pollfd p = {fd, events, 0};
    const int r = ::poll(&p, 1, MillisLeft(deadline));
    if (r > 0) return OkStatus();
    if (r == 0) return UnavailableError("timed out " + std::string(what));
    if (errno != EINTR) return UnavailableError(ErrnoText("poll", errno));
  }
}

}  // namespace

std::string HttpResponse::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (EqualsIgnoreCase(n, name)) return v;
  }
  return "";
}

bool HttpResponse::HasHeader(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(),
                     [&](const auto& h) { return EqualsIgnoreCase(h.first, name); });
}

Result<std::optional<HttpResponse>> HttpResponseParser::Next() { return Parse(false); }

Result<std::optional<HttpResponse>> HttpResponseParser::Finish() {
  if (buffer_.empty()) return std::optional<HttpResponse>();
  return Parse(true);
}

// Stateless: each call parses from the start of the buffer and consumes only a whole response.
Result<std::optional<HttpResponse>> HttpResponseParser::Parse(bool at_eof) {
  const auto incomplete = [&]() -> Result<std::optional<HttpResponse>> {
    if (at_eof) return UnavailableError("connection closed in the middle of a response");
    return std::optional<HttpResponse>();
  };
  while (true) {
    const std::size_t head_end = buffer_.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      if (buffer_.size() > kMaxHead) return InvalidArgumentError("response head too large");
      return incomplete();
    }
    const std::string_view head(buffer_.data(), head_end);
    const std::size_t line_end = std::min(head.find("\r\n"), head.size());
    const std::string_view status_line = head.substr(0, line_end);
    // HTTP/1.x SSS[ reason]
    if (status_line.size() < 12 || !status_line.starts_with("HTTP/1.") || status_line[8] != ' ' ||
        (status_line.size() > 12 && status_line[12] != ' ')) {
      return InvalidArgumentError("bad status line '" + std::string(status_line) + "'");
    }
    HttpResponse response;
    const std::string_view code = status_line.substr(9, 3);
    const auto [p, ec] = std::from_chars(code.data(), code.data() + 3, response.status);
    if (ec != std::errc() || p != code.data() + 3 || response.status < 100) {
      return InvalidArgumentError("bad status code '" + std::string(status_line) + "'");
    }
    if (status_line.size() > 13) response.reason = std::string(status_line.substr(13));
    std::size_t pos = line_end;
    while (pos < head.size()) {
      pos += 2;  // The CRLF before this line.
      const std::size_t end = std::min(head.find("\r\n", pos), head.size());
      if (!ParseHeaderLine(head.substr(pos, end - pos), response.headers)) {
        return InvalidArgumentError("bad header line '" + std::string(head.substr(pos, end - pos)) +
                                    "'");
      }
      pos = end;
    }
    const std::size_t body_start = head_end + 4;
    if (response.status < 200 && response.status != 101) {
      buffer_.erase(0, body_start);  // Interim response: the real one follows.
      continue;
    }

    std::size_t consumed = 0;
    const bool no_body =
        head_request_ || response.status < 200 || response.status == 204 || response.status == 304;
    const std::string transfer_encoding = response.Header("Transfer-Encoding");
    std::optional<std::size_t> content_length;
    for (const auto& [name, value] : response.headers) {
      if (!EqualsIgnoreCase(name, "Content-Length")) continue;
      std::size_t n = 0;
      const auto [q, err] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || err != std::errc() || q != value.data() + value.size() ||
          (content_length && *content_length != n)) {
        return InvalidArgumentError("bad Content-Length '" + value + "'");
      }
      content_length = n;
    }
    if (no_body) {
      consumed = body_start;
    } else if (!transfer_encoding.empty() && ContainsIgnoreCase(transfer_encoding, "chunked")) {
      if (content_length) return InvalidArgumentError("both Content-Length and chunked");
      std::size_t at = body_start;
      while (true) {
        const std::size_t size_end = buffer_.find("\r\n", at);
        if (size_end == std::string::npos) return incomplete();
        std::string_view size_text(buffer_.data() + at, size_end - at);
        size_text = Trim(size_text.substr(0, size_text.find(';')));
        std::size_t size = 0;
        const auto [q, err] =
            std::from_chars(size_text.data(), size_text.data() + size_text.size(), size, 16);
        if (size_text.empty() || err != std::errc() || q != size_text.data() + size_text.size()) {
          return InvalidArgumentError("bad chunk size '" + std::string(size_text) + "'");
        }
        at = size_end + 2;
        if (size == 0) {
          // Trailers, then an empty line.
          while (true) {
            const std::size_t end = buffer_.find("\r\n", at);
            if (end == std::string::npos) return incomplete();
            const std::string_view line(buffer_.data() + at, end - at);
            at = end + 2;
            if (line.empty()) break;
            if (!ParseHeaderLine(line, response.headers)) {
              return InvalidArgumentError("bad trailer '" + std::string(line) + "'");
            }
          }
          break;
        }
        if (buffer_.size() < at + size + 2) return incomplete();
        if (buffer_.compare(at + size, 2, "\r\n") != 0) {
          return InvalidArgumentError("chunk not followed by CRLF");
        }
        response.body.append(buffer_, at, size);
        at += size + 2;
      }
      consumed = at;
    } else if (content_length && transfer_encoding.empty()) {
      if (buffer_.size() - body_start < *content_length) return incomplete();
      response.body = buffer_.substr(body_start, *content_length);
      consumed = body_start + *content_length;
    } else {
      // The body runs to the end of the connection.
      if (!at_eof) return std::optional<HttpResponse>();
      response.body = buffer_.substr(body_start);
      consumed = buffer_.size();
    }
    buffer_.erase(0, consumed);
    head_request_ = false;
    return std::optional<HttpResponse>(std::move(response));
  }
}

Result<HttpConnection> HttpConnection::Connect(const std::string& host, std::uint16_t port,
                                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(port);
  if (const int r = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &addresses); r != 0) {
    return UnavailableError("resolve " + host + ": " + ::gai_strerror(r));
  }
  Status last = UnavailableError("no address for " + host);
  for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = UnavailableError(ErrnoText("socket", errno));
      continue;
    }
    int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      Status polled = PollUntil(fd, POLLOUT, deadline, "connecting");
      if (!polled.ok()) {
        ::close(fd);
        last = std::move(polled);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      r = err == 0 ? 0 : -1;
    }
    if (r != 0) {
      last = UnavailableError(ErrnoText("connect " + host + ":" + service, errno));
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::freeaddrinfo(addresses);
    return HttpConnection(fd, host + ":" + service, timeout);
  }
  ::freeaddrinfo(addresses);
  return last;
}

HttpConnection::HttpConnection(HttpConnection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      host_header_(std::move(other.host_header_)),
      timeout_(other.timeout_),
      parser_(std::move(other.parser_)),
      peer_closed_(other.peer_closed_) {}

HttpConnection& HttpConnection::operator=(HttpConnection&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    host_header_ = std::move(other.host_header_);
    timeout_ = other.timeout_;
    parser_ = std::move(other.parser_);
    peer_closed_ = other.peer_closed_;
  }
  return *this;
}

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status HttpConnection::WriteAll(std::string_view bytes,
                                std::chrono::steady_clock::time_point deadline) {
  if (fd_ < 0) return FailedPreconditionError("connection is closed");
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IDEM_RETURN_IF_ERROR(PollUntil(fd_, POLLOUT, deadline, "writing the request"));
      continue;
    }
    return UnavailableError(ErrnoText("send", errno));
  }
  return OkStatus();
}

Result<bool> HttpConnection::ReadSome(std::chrono::steady_clock::time_point deadline) {
  if (fd_ < 0) return FailedPreconditionError("connection is closed");
  if (peer_closed_) return false;
  char buf[16384];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n > 0) {
      parser_.Feed(std::string_view(buf, static_cast<std::size_t>(n)));
      return true;
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      peer_closed_ = true;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IDEM_RETURN_IF_ERROR(PollUntil(fd_, POLLIN, deadline, "waiting for the response"));
      continue;
    }
    return UnavailableError(ErrnoText("recv", errno));
  }
}

Status HttpConnection::RawSend(std::string_view bytes) {
  return WriteAll(bytes, std::chrono::steady_clock::now() + timeout_);
}

Result<HttpResponse> HttpConnection::ReadResponse(bool head_request) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  parser_.set_head_request(head_request);
  while (true) {
    Result<std::optional<HttpResponse>> next = parser_.Next();
    if (!next) return std::move(next).error();
    if (next->has_value()) return std::move(**next);
    if (peer_closed_) {
      Result<std::optional<HttpResponse>> last = parser_.Finish();
      if (!last) return std::move(last).error();
      if (last->has_value()) return std::move(**last);
      return UnavailableError("connection closed before a response");
    }
    Result<bool> more = ReadSome(deadline);
    if (!more) return std::move(more).error();
  }
}

Result<bool> HttpConnection::WaitForClose(std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!peer_closed_) {
    Result<bool> more = ReadSome(deadline);
    if (!more) {
      if (more.error().code() == StatusCode::kUnavailable &&
          std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      return std::move(more).error();
    }
  }
  return true;
}

Result<HttpResponse> HttpConnection::Send(std::string_view method, std::string_view target,
                                          const HttpHeaders& headers, std::string_view body) {
  const auto has = [&](std::string_view name) {
    return std::any_of(headers.begin(), headers.end(),
                       [&](const auto& h) { return EqualsIgnoreCase(h.first, name); });
  };
  std::string request;
  request.reserve(256 + body.size());
  request.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  if (!has("Host")) request.append("Host: ").append(host_header_).append("\r\n");
  for (const auto& [name, value] : headers) {
    request.append(name).append(": ").append(value).append("\r\n");
  }
  const bool body_method = method == "POST" || method == "PUT" || method == "PATCH";
  if ((!body.empty() || body_method) && !has("Content-Length") && !has("Transfer-Encoding")) {
    request.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  }
  request.append("\r\n").append(body);
  IDEM_RETURN_IF_ERROR(WriteAll(request, std::chrono::steady_clock::now() + timeout_));
  return ReadResponse(method == "HEAD");
}

Result<HttpResponse> HttpRequest(std::uint16_t port, std::string_view method,
                                 std::string_view target, const HttpHeaders& headers,
                                 std::string_view body, std::chrono::milliseconds timeout) {
  Result<HttpConnection> connection = HttpConnection::Connect("127.0.0.1", port, timeout);
  if (!connection) return std::move(connection).error();
  return connection->Send(method, target, headers, body);
}

}  // namespace idem::testing
