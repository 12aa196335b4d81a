// Connections to one Redis node, shared by concurrent callers with automatic pipelining.
//
// A caller puts its Call (one or more RESP commands, already formatted) on a connection's
// queue. If nobody is doing I/O on that connection, the caller becomes the leader: it takes
// everything queued, writes it in one write, reads the replies in order and hands each waiting
// caller its replies. Callers that queued meanwhile wait; when the leader is done, the first
// of them leads the next round with everything queued by then. So under load each write and
// each read on both sides carries many commands, and Redis spends its time running them
// rather than in system calls; with no load a call is one write and one read.
//
// Fail closed: a connect failure, a timeout (command_timeout for a round), a broken
// connection or a protocol error fails the round's calls (and those queued behind it) with
// kUnavailable and closes the connection; the next round reconnects. A Call says whether its
// commands may have reached the server (`sent`), so that only unsent ones are retried.
//
// With wait_replicas > 0, a round in which some command changed data ends with WAIT, and only
// those commands wait for it (a Replay needs no replica, so it is answered even while a
// promoted master has none).
//
// A node that lets a round time out (frozen, a network black hole) is suspect until a round
// ends without a timeout (Liveness): callers do not send to it, so that it holds no caller
// beyond those in flight when it stopped answering.
#ifndef IDEM_STORES_REDIS_CONNECTION_H_
#define IDEM_STORES_REDIS_CONNECTION_H_

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

namespace idem::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// A RESP command: Arg() each word, then Append it to a buffer of commands.
class Command {
 public:
  Command& Arg(std::string_view word);
  Command& Arg(std::int64_t n);
  Command& UArg(std::uint64_t n);
  void AppendTo(std::string& out) const;
  std::string Take() const {
    std::string s;
    AppendTo(s);
    return s;
  }

 private:
  std::string body_;
  int words_ = 0;
};

// A reply as text for error messages: "ERR ...", "integer 5", "array of 3", ...
std::string Describe(const redisReply& r);

struct Endpoint {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "host:port", "[v6]:port"
};
// "host:port" / "[v6]:port"; the port defaults to `default_port` when omitted (0: required).
Result<Endpoint> ParseEndpoint(std::string_view text, int default_port);

struct ConnectionOptions {
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds command_timeout{1000};
  int wait_replicas = 0;
  std::chrono::milliseconds wait_timeout{1000};
  std::string user;
  std::string password;
  int database = 0;
};

// One caller's commands and, once done, their replies (or the error).
struct Call {
  std::string_view out;  // formatted commands
  int replies = 1;       // how many replies they give
  // Whether the command changed data, judged from its (last) reply; a change is acknowledged
  // only once WAIT says enough replicas have it (when wait_replicas > 0). Null: never.
  bool (*wrote)(const redisReply&) = nullptr;

  // Set by the leader.
  std::vector<Reply> got;
  Status status;
  bool sent = false;  // the commands may have reached the server

  // Internal: 0 queued, 1 done, 2 must lead. Set by the leader, waited on by the caller.
  std::atomic<int> state{0};
};

// Whether a node answers, shared by its connections: live until a round on one of them times
// out, then suspect (calls are not sent to it) until a round ends without a timeout. Whoever
// owns the node probes it while it is suspect (on_suspect says when to start).
class Liveness {
 public:
  explicit Liveness(std::function<void()> on_suspect = {}) : on_suspect_(std::move(on_suspect)) {}
  bool live() const { return !suspect_.load(std::memory_order_acquire); }
  // The end of a round on one of the node's connections.
  void RoundEnded(bool timed_out) {
    if (timed_out) {
      if (!suspect_.exchange(true, std::memory_order_acq_rel) && on_suspect_) on_suspect_();
    } else if (suspect_.load(std::memory_order_relaxed)) {
      suspect_.store(false, std::memory_order_release);
    }
  }

 private:
  const std::function<void()> on_suspect_;
  std::atomic<bool> suspect_{false};
};

class Connection {
 public:
  Connection(Endpoint endpoint, const ConnectionOptions& options, Liveness& liveness);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Queues the call; true when the caller must lead (Start, then Finish).
  bool Enqueue(Call* call);
  // A caller that did not lead: blocks until its call is done (false) or it must lead (true).
  static bool Wait(Call* call);

  // The leader's round, in two halves so that one thread can drive several connections at
  // once (a batch spanning cluster nodes): Start takes the queue and writes it, Finish reads
  // the replies, completes every call but the leader's own wake-up, and passes the lead on.
  struct Round {
    std::vector<Call*> calls;
    Status error;
    bool sent = false;
    std::chrono::steady_clock::time_point deadline;
  };
  void Start(Round& round);
  void Finish(Round& round);

  // Whether a round is under way (a hint for choosing a connection).
  bool busy() const { return leading_.load(std::memory_order_relaxed); }
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  Status Connect(std::chrono::steady_clock::time_point deadline);
  void Close();
  Status WriteAll(std::string_view bytes, std::chrono::steady_clock::time_point deadline);
  Result<Reply> ReadReply(std::chrono::steady_clock::time_point deadline);
  Status Error(std::string_view what) const;
  static void Complete(Call* call, int state);

  const Endpoint endpoint_;
  const ConnectionOptions options_;
  const std::string wait_command_;
  Liveness& liveness_;

  std::mutex mu_;
  std::vector<Call*> queue_;
  std::atomic<bool> leading_{false};

  // The leader's own: only the thread leading a round touches these.
  bool timed_out_ = false;  // this round waited out a timeout
  int fd_ = -1;
  redisReader* reader_ = nullptr;
  std::string out_;
  std::vector<char> in_;
};

// A node's connections.
class Node {
 public:
  // `on_suspect` runs when the node stops answering (on the thread that saw it).
  Node(Endpoint endpoint, const ConnectionOptions& options, std::size_t connections,
       std::function<void()> on_suspect = {});
  const Endpoint& endpoint() const { return endpoint_; }
  // A connection for the calling thread: an idle one if there is one.
  Connection& Pick();
  // Whether calls may go to the node (see Liveness); when not, Refused() says why.
  bool live() const { return liveness_.live(); }
  Status Refused() const;
  // One PING, whatever the node's liveness, which it updates; kept short by the timeouts.
  void Probe();

 private:
  const Endpoint endpoint_;
  Liveness liveness_;
  std::vector<std::unique_ptr<Connection>> connections_;
};

// Runs one call on `connection`, leading if needed. Returns once the call is done.
void RunCall(Connection& connection, Call& call);

// How a connection's error begins when the server refused its AUTH or SELECT.
inline constexpr std::string_view kHelloRefused = "AUTH/SELECT refused: ";

}  // namespace idem::redis

#endif  // IDEM_STORES_REDIS_CONNECTION_H_
