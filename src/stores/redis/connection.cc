#include "stores/redis/connection.h"

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
#include <functional>
#include <thread>

namespace idem::redis {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kReadChunk = 64 * 1024;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

// ---- Command ----

Command& Command::Arg(std::string_view word) {
  char len[24];
  const auto end = std::to_chars(len, len + sizeof len, word.size()).ptr;
  body_.push_back('$');
  body_.append(len, end);
  body_.append("\r\n");
  body_.append(word);
  body_.append("\r\n");
  ++words_;
  return *this;
}

Command& Command::Arg(std::int64_t n) {
  char buf[24];
  const auto end = std::to_chars(buf, buf + sizeof buf, n).ptr;
  return Arg(std::string_view(buf, static_cast<std::size_t>(end - buf)));
}

Command& Command::UArg(std::uint64_t n) {
  char buf[24];
  const auto end = std::to_chars(buf, buf + sizeof buf, n).ptr;
  return Arg(std::string_view(buf, static_cast<std::size_t>(end - buf)));
}

void Command::AppendTo(std::string& out) const {
  char count[24];
  const auto end = std::to_chars(count, count + sizeof count, words_).ptr;
  out.push_back('*');
  out.append(count, end);
  out.append("\r\n");
  out.append(body_);
}

std::string Describe(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_ERROR:
      return "error \"" + std::string(r.str, r.len) + "\"";
    case REDIS_REPLY_STATUS:
      return "status \"" + std::string(r.str, r.len) + "\"";
    case REDIS_REPLY_STRING:
      return "a string of " + std::to_string(r.len) + " bytes";
    case REDIS_REPLY_INTEGER:
      return "integer " + std::to_string(r.integer);
    case REDIS_REPLY_NIL:
      return "nil";
    case REDIS_REPLY_ARRAY:
      return "an array of " + std::to_string(r.elements);
    default:
      return "a reply of type " + std::to_string(r.type);
  }
}

// ---- Endpoint ----

std::string Endpoint::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> ParseEndpoint(std::string_view text, int default_port) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  Endpoint e;
  std::string_view port;
  if (!text.empty() && text[0] == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return InvalidArgumentError("address " + quoted + ": '[' without ']'");
    }
    e.host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return InvalidArgumentError("address " + quoted + ": junk after ']'");
      port = rest.substr(1);
      if (port.empty()) return InvalidArgumentError("address " + quoted + ": empty port");
    }
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon != std::string_view::npos && text.find(':') != colon) {
      return InvalidArgumentError("address " + quoted + ": write an IPv6 address as [addr]:port");
    }
    e.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = text.substr(colon + 1);
      if (port.empty()) return InvalidArgumentError("address " + quoted + ": empty port");
    }
  }
  if (e.host.empty()) return InvalidArgumentError("address " + quoted + ": no host");
  if (port.empty()) {
    if (default_port == 0) return InvalidArgumentError("address " + quoted + ": no port");
    e.port = default_port;
    return e;
  }
  int p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p <= 0 || p > 65535) {
    return InvalidArgumentError("address " + quoted + ": port \"" + std::string(port) +
                                "\" is not a number from 1 to 65535");
  }
  e.port = p;
  return e;
}

// ---- Connection ----

Connection::Connection(Endpoint endpoint, const ConnectionOptions& options, Liveness& liveness)
    : endpoint_(std::move(endpoint)),
      options_(options),
      wait_command_(Command()
                        .Arg("WAIT")
                        .Arg(std::int64_t{options.wait_replicas})
                        .Arg(static_cast<std::int64_t>(options.wait_timeout.count()))
                        .Take()),
      liveness_(liveness) {}

Connection::~Connection() { Close(); }

Status Connection::Error(std::string_view what) const {
  return UnavailableError("redis " + endpoint_.ToString() + ": " + std::string(what));
}

void Connection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (reader_ != nullptr) redisReaderFree(reader_);
  reader_ = nullptr;
}

Status Connection::Connect(Clock::time_point deadline) {
  Close();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint_.port);
  if (const int rc = ::getaddrinfo(endpoint_.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Error(std::string("cannot resolve the host: ") + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = "socket: " + ErrnoText(errno);
      continue;
    }
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int timeout =
          std::min(RemainingMs(deadline), static_cast<int>(options_.connect_timeout.count()));
      rc = ::poll(&p, 1, timeout);
      if (rc == 0) {
        ::close(fd);
        timed_out_ = true;
        last_error = "connect timed out after " + std::to_string(timeout) + " ms";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (rc < 0) {
        err = errno;
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      last_error = "connect: " + ErrnoText(errno);
      ::close(fd);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fd_ = fd;
    break;
  }
  if (fd_ < 0) return Error(last_error);
  reader_ = redisReaderCreate();
  if (reader_ == nullptr) {
    Close();
    return Error("out of memory creating a reply reader");
  }

  // AUTH and SELECT, answered before anything else is sent.
  std::string hello;
  int expect = 0;
  if (!options_.password.empty()) {
    Command auth;
    auth.Arg("AUTH");
    if (!options_.user.empty()) auth.Arg(options_.user);
    auth.Arg(options_.password).AppendTo(hello);
    ++expect;
  }
  if (options_.database != 0) {
    Command().Arg("SELECT").Arg(std::int64_t{options_.database}).AppendTo(hello);
    ++expect;
  }
  if (expect == 0) return OkStatus();
  const Clock::time_point hello_deadline = Clock::now() + options_.command_timeout;
  if (Status s = WriteAll(hello, hello_deadline); !s.ok()) return s;
  for (int i = 0; i < expect; ++i) {
    Result<Reply> r = ReadReply(hello_deadline);
    if (!r.has_value()) return r.error();
    if ((*r)->type == REDIS_REPLY_ERROR) {
      const Status s = Error(std::string(kHelloRefused) + Describe(**r));
      Close();
      return s;
    }
  }
  return OkStatus();
}

Status Connection::WriteAll(std::string_view bytes, Clock::time_point deadline) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const int rc = ::poll(&p, 1, RemainingMs(deadline));
      if (rc == 0) {
        Close();
        timed_out_ = true;
        return Error("timed out writing (after " +
                     std::to_string(options_.command_timeout.count()) + " ms)");
      }
      continue;
    }
    const Status s = Error("write: " + ErrnoText(errno));
    Close();
    return s;
  }
  return OkStatus();
}

Result<Reply> Connection::ReadReply(Clock::time_point deadline) {
  while (true) {
    void* reply = nullptr;
    if (redisReaderGetReply(reader_, &reply) != REDIS_OK) {
      const Status s = Error(std::string("protocol error: ") + reader_->errstr);
      Close();
      return s;
    }
    if (reply != nullptr) return Reply(static_cast<redisReply*>(reply));
    if (in_.size() < kReadChunk) in_.resize(kReadChunk);
    const ssize_t n = ::recv(fd_, in_.data(), in_.size(), 0);
    if (n > 0) {
      if (redisReaderFeed(reader_, in_.data(), static_cast<std::size_t>(n)) != REDIS_OK) {
        const Status s = Error(std::string("protocol error: ") + reader_->errstr);
        Close();
        return s;
      }
      continue;
    }
    if (n == 0) {
      const Status s = Error("the server closed the connection");
      Close();
      return s;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, RemainingMs(deadline));
      if (rc == 0) {
        Close();
        timed_out_ = true;
        return Error("no reply within the command timeout");
      }
      continue;
    }
    const Status s = Error("read: " + ErrnoText(errno));
    Close();
    return s;
  }
}

bool Connection::Enqueue(Call* call) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(call);
  if (leading_.load(std::memory_order_relaxed)) return false;
  leading_.store(true, std::memory_order_relaxed);
  return true;
}

bool Connection::Wait(Call* call) {
  int state = call->state.load(std::memory_order_acquire);
  while (state == 0) {
    call->state.wait(0, std::memory_order_acquire);
    state = call->state.load(std::memory_order_acquire);
  }
  return state == 2;
}

void Connection::Complete(Call* call, int state) {
  // Once the store is seen, the caller may return and destroy the call: the notify touches
  // only the futex word's address (a wake-up at an address nobody waits on is harmless), never
  // the call's memory.
  call->state.store(state, std::memory_order_release);
  call->state.notify_one();
}

void Connection::Start(Round& round) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    round.calls.swap(queue_);
  }
  round.deadline = Clock::now() + options_.command_timeout;
  timed_out_ = false;
  if (fd_ >= 0) {
    // Between rounds nothing may arrive: anything readable is the server closing the
    // connection (a restart, an idle timeout). Reconnect now rather than fail this round on a
    // dead socket (its commands might have been retried elsewhere, but not once sent).
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0) Close();
  }
  if (fd_ < 0) {
    round.error = Connect(Clock::now() + options_.connect_timeout);
    if (!round.error.ok()) return;  // nothing was sent
  }
  std::string_view bytes;
  if (round.calls.size() == 1) {
    bytes = round.calls[0]->out;
  } else {
    out_.clear();
    for (const Call* c : round.calls) out_.append(c->out);
    bytes = out_;
  }
  round.sent = true;
  round.error = WriteAll(bytes, round.deadline);
  if (out_.capacity() > (1u << 20)) std::string().swap(out_);
}

void Connection::Finish(Round& round) {
  std::size_t done = 0;  // calls with every reply read
  if (round.error.ok()) {
    for (; done < round.calls.size(); ++done) {
      Call* c = round.calls[done];
      c->got.clear();
      for (int i = 0; i < c->replies && round.error.ok(); ++i) {
        Result<Reply> r = ReadReply(round.deadline);
        if (r.has_value()) {
          c->got.push_back(std::move(*r));
        } else {
          round.error = r.error();
        }
      }
      if (!round.error.ok()) break;
    }
  }
  // Which calls changed data; if any did, WAIT for the replicas (a second round trip, only
  // for rounds that wrote).
  std::vector<bool> wrote(done, false);
  bool any_wrote = false;
  for (std::size_t i = 0; i < done; ++i) {
    const Call* c = round.calls[i];
    wrote[i] = c->wrote != nullptr && !c->got.empty() && c->wrote(*c->got.back());
    any_wrote = any_wrote || wrote[i];
  }
  Status unreplicated;  // for the calls that wrote
  if (options_.wait_replicas > 0 && any_wrote) {
    if (!round.error.ok()) {
      unreplicated = round.error;
    } else {
      const Clock::time_point deadline =
          Clock::now() + options_.command_timeout + options_.wait_timeout;
      Status st = WriteAll(wait_command_, deadline);
      Result<Reply> r = st.ok() ? ReadReply(deadline) : Result<Reply>(st);
      if (!r.has_value()) {
        round.error = r.error();
        unreplicated = round.error;
      } else if ((*r)->type != REDIS_REPLY_INTEGER) {
        unreplicated = Error("WAIT answered " + Describe(**r));
      } else if ((*r)->integer < options_.wait_replicas) {
        unreplicated =
            Error("the write reached " + std::to_string((*r)->integer) + " of the " +
                  std::to_string(options_.wait_replicas) + " replicas asked for within " +
                  std::to_string(options_.wait_timeout.count()) + " ms");
      }
    }
  }
  if (in_.capacity() > 4 * kReadChunk) std::vector<char>().swap(in_);
  liveness_.RoundEnded(timed_out_);

  // Hand out the results. The leader's own call is among them; completing it wakes nobody.
  std::vector<Call*> failed_behind;
  if (!round.error.ok()) {
    // The server is unreachable or broken: the calls queued behind this round would go to the
    // same server. Fail them now (they were not sent) rather than make each wait its timeout.
    std::lock_guard<std::mutex> lock(mu_);
    failed_behind.swap(queue_);
  }
  for (std::size_t i = 0; i < round.calls.size(); ++i) {
    Call* c = round.calls[i];
    c->sent = round.sent;
    if (i < done) {
      c->status = wrote[i] ? unreplicated : OkStatus();
    } else {
      c->status = round.error;
    }
    if (!c->status.ok()) c->got.clear();
    Complete(c, 1);
  }
  for (Call* c : failed_behind) {
    c->sent = false;
    c->status = round.error;
    c->got.clear();
    Complete(c, 1);
  }
  // Pass the lead to the first caller queued meanwhile, or put it down.
  Call* next = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) {
      leading_.store(false, std::memory_order_relaxed);
    } else {
      next = queue_.front();
    }
  }
  if (next != nullptr) Complete(next, 2);
  round.calls.clear();
}

// ---- Node ----

Node::Node(Endpoint endpoint, const ConnectionOptions& options, std::size_t connections,
           std::function<void()> on_suspect)
    : endpoint_(std::move(endpoint)), liveness_(std::move(on_suspect)) {
  connections_.reserve(std::max<std::size_t>(connections, 1));
  for (std::size_t i = 0; i < std::max<std::size_t>(connections, 1); ++i) {
    connections_.push_back(std::make_unique<Connection>(endpoint_, options, liveness_));
  }
}

Status Node::Refused() const {
  return UnavailableError("redis " + endpoint_.ToString() +
                          ": not answering (a call to it timed out; nothing is sent to it until "
                          "it answers a PING); not sent");
}

void Node::Probe() {
  const std::string ping = Command().Arg("PING").Take();
  Call call;
  call.out = ping;
  RunCall(Pick(), call);
}

Connection& Node::Pick() {
  if (connections_.size() == 1) return *connections_[0];
  // Each thread starts at its own connection, so that under load the callers spread evenly;
  // an idle connection is taken first (no waiting at all).
  static thread_local const std::size_t start =
      std::hash<std::thread::id>()(std::this_thread::get_id());
  const std::size_t n = connections_.size();
  for (std::size_t i = 0; i < n; ++i) {
    Connection& c = *connections_[(start + i) % n];
    if (!c.busy()) return c;
  }
  return *connections_[start % n];
}

void RunCall(Connection& connection, Call& call) {
  if (!connection.Enqueue(&call) && !Connection::Wait(&call)) return;
  Connection::Round round;
  connection.Start(round);
  connection.Finish(round);
}

}  // namespace idem::redis
