// Sends commands to the node that owns their key: one node, or a Redis Cluster.
//
// Cluster: the slot map comes from CLUSTER SLOTS (from any node that answers: the masters
// known, then the seeds). A MOVED reply points the slot at the named node, refreshes the map
// and retries; an ASK reply sends ASKING and the command to the named node once; TRYAGAIN,
// CLUSTERDOWN, LOADING and MASTERDOWN retry after a short pause; a node that cannot be
// connected to refreshes the map (its replica may have taken over) and retries. Nothing is sent
// to a node that is not answering (a round timed out; see Liveness): its commands fail at once
// unless a refreshed map moves their slot, and a thread of the router PINGs it until it
// answers. NOSCRIPT loads
// the script and retries. Retries are bounded; a command whose reply was lost after it may
// have reached the server is never retried (kUnavailable), since it may have run.
//
// Thread-safe.
#ifndef IDEM_STORES_REDIS_ROUTER_H_
#define IDEM_STORES_REDIS_ROUTER_H_

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/status.h"
#include "stores/redis/connection.h"
#include "stores/redis/slots.h"

namespace idem::redis {

struct Script;

struct RouterOptions {
  std::vector<Endpoint> seeds;
  bool cluster = false;
  ConnectionOptions connection;
  std::size_t connections_per_node = 2;
};

// Judges from a command's reply whether it changed data (see Call::wrote).
using Wrote = bool (*)(const redisReply&);

// One command, sent to the node that owns `key`.
struct Request {
  std::string key;                             // decides the slot
  std::string command;                         // one formatted command
  bool (*wrote)(const redisReply&) = nullptr;  // see Call::wrote
  const Script* script = nullptr;              // loaded and retried on NOSCRIPT
};

class Router {
 public:
  // Single node: connects once to check that it answers. Cluster: reads the slot map.
  // kUnavailable naming the addresses tried when none answers.
  static Result<std::unique_ptr<Router>> Open(const RouterOptions& options);
  ~Router();

  // The reply (an error reply included, except the redirections handled here), or
  // kUnavailable.
  Result<Reply> Run(const Request& request);
  // One reply per request, in order; the requests for a node go in one pipeline, and the
  // nodes' pipelines are in flight at the same time.
  std::vector<Result<Reply>> RunMany(std::span<const Request> requests);

  // Every master (the one node when not a cluster), for scans.
  Result<std::vector<Node*>> Masters();
  // `command` on `node` as is (no redirections).
  Result<Reply> RunOn(Node& node, std::string_view command);

  // Reads the slot map again (cluster only; at most every few milliseconds unless `force`).
  Status Refresh(bool force);

  bool cluster() const { return options_.cluster; }

 private:
  explicit Router(const RouterOptions& options);
  Node* GetNode(const Endpoint& e);
  Node* NodeForSlot(int slot);
  struct Attempt;
  // Sends every unfinished attempt (grouped per node), then sorts out the replies: finished,
  // or set up for another try.
  void Round(std::span<Attempt> attempts);

  // Wakes the prober: a node stopped answering.
  void WakeProber();
  // The prober thread: PINGs the nodes that are not answering until they answer again.
  void ProbeLoop();

  const RouterOptions options_;
  std::mutex nodes_mu_;
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // by "host:port"; never removed
  Node* single_ = nullptr;
  std::unique_ptr<std::array<std::atomic<Node*>, kSlots>> slots_;
  std::mutex refresh_mu_;
  std::chrono::steady_clock::time_point last_refresh_{};

  std::mutex probe_mu_;
  std::condition_variable probe_cv_;
  bool probe_due_ = false;
  bool stop_ = false;
  std::thread prober_;
};

}  // namespace idem::redis

#endif  // IDEM_STORES_REDIS_ROUTER_H_
