#include "stores/redis/router.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <thread>

#include "stores/redis/scripts.h"

namespace idem::redis {
namespace {

using std::chrono::milliseconds;

// Tries per request (redirections, a refreshed slot map, a node busy loading).
constexpr int kMaxTries = 6;
// The slot map is read again at most this often unless a MOVED says it is wrong.
constexpr milliseconds kRefreshInterval{50};

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string_view ErrorText(const redisReply& r) { return std::string_view(r.str, r.len); }

// "MOVED 3999 127.0.0.1:6381" -> {3999, 127.0.0.1:6381}.
std::optional<std::pair<int, Endpoint>> ParseRedirect(std::string_view text) {
  const std::size_t sp1 = text.find(' ');
  if (sp1 == std::string_view::npos) return std::nullopt;
  const std::size_t sp2 = text.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return std::nullopt;
  const std::string_view slot_text = text.substr(sp1 + 1, sp2 - sp1 - 1);
  int slot = -1;
  const auto [end, ec] =
      std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), slot);
  if (ec != std::errc() || end != slot_text.data() + slot_text.size() || slot < 0 ||
      slot >= kSlots) {
    return std::nullopt;
  }
  auto endpoint = ParseEndpoint(text.substr(sp2 + 1), 0);
  if (!endpoint) return std::nullopt;
  return std::make_pair(slot, std::move(*endpoint));
}

void Reset(Call& c) {
  c.got.clear();
  c.status = OkStatus();
  c.sent = false;
  c.state.store(0, std::memory_order_relaxed);
}

}  // namespace

struct Router::Attempt {
  const Request* request = nullptr;
  int slot = 0;
  Node* ask = nullptr;   // ASKING at this node on the next try
  bool reload = false;   // SCRIPT LOAD before the next try
  bool refused = false;  // this round: not sent, its node is not answering
  int tries = 0;
  std::optional<Result<Reply>> result;
  std::string problem;  // why the last try did not finish
  // This round's.
  Node* node = nullptr;
  Connection* connection = nullptr;
  bool lead = false;
  std::string out;
  Call call;
};

Router::Router(const RouterOptions& options) : options_(options) {
  if (options_.cluster) {
    slots_ = std::make_unique<std::array<std::atomic<Node*>, kSlots>>();
    for (auto& s : *slots_) s.store(nullptr, std::memory_order_relaxed);
  }
  prober_ = std::thread([this] { ProbeLoop(); });
}

Router::~Router() {
  {
    std::lock_guard<std::mutex> lock(probe_mu_);
    stop_ = true;
  }
  probe_cv_.notify_one();
  prober_.join();
}

void Router::WakeProber() {
  {
    std::lock_guard<std::mutex> lock(probe_mu_);
    probe_due_ = true;
  }
  probe_cv_.notify_one();
}

void Router::ProbeLoop() {
  std::unique_lock<std::mutex> lock(probe_mu_);
  while (true) {
    probe_cv_.wait(lock, [this] { return stop_ || probe_due_; });
    if (stop_) return;
    probe_due_ = false;
    // PING every suspect node until none is left; a PING to a frozen node waits out the
    // command timeout, and one to a node that answers again ends its suspicion at once.
    while (true) {
      lock.unlock();
      std::vector<Node*> suspects;
      {
        std::lock_guard<std::mutex> nodes_lock(nodes_mu_);
        for (auto& [name, n] : nodes_) {
          if (!n->live()) suspects.push_back(n.get());
        }
      }
      for (Node* n : suspects) n->Probe();
      lock.lock();
      if (suspects.empty() || stop_) break;
      // Not in a tight loop, whatever a PING's failure cost.
      probe_cv_.wait_for(lock, milliseconds(10), [this] { return stop_; });
      if (stop_) return;
    }
  }
}

Result<std::unique_ptr<Router>> Router::Open(const RouterOptions& options) {
  if (options.seeds.empty()) return InvalidArgumentError("no Redis node given");
  std::unique_ptr<Router> router(new Router(options));
  if (!options.cluster) {
    router->single_ = router->GetNode(options.seeds[0]);
    Result<Reply> pong = router->RunOn(*router->single_, Command().Arg("PING").Take());
    if (!pong.has_value()) return pong.error();
    if ((*pong)->type == REDIS_REPLY_ERROR) {
      return UnavailableError("redis " + options.seeds[0].ToString() + " answered PING with " +
                              Describe(**pong));
    }
    // A cluster node would answer MOVED for most keys: say so now.
    Result<Reply> info =
        router->RunOn(*router->single_, Command().Arg("INFO").Arg("cluster").Take());
    if (info.has_value() && (*info)->type == REDIS_REPLY_STRING &&
        std::string_view((*info)->str, (*info)->len).find("cluster_enabled:1") !=
            std::string_view::npos) {
      return InvalidArgumentError("redis " + options.seeds[0].ToString() +
                                  " is a Redis Cluster node: use redis+cluster://");
    }
    return router;
  }
  for (const Endpoint& e : options.seeds) router->GetNode(e);
  IDEM_RETURN_IF_ERROR(router->Refresh(true));
  return router;
}

Node* Router::GetNode(const Endpoint& e) {
  const std::string name = e.ToString();
  std::lock_guard<std::mutex> lock(nodes_mu_);
  auto& node = nodes_[name];
  if (node == nullptr) {
    node = std::make_unique<Node>(e, options_.connection, options_.connections_per_node,
                                  [this] { WakeProber(); });
  }
  return node.get();
}

Node* Router::NodeForSlot(int slot) {
  if (!options_.cluster) return single_;
  return (*slots_)[static_cast<std::size_t>(slot)].load(std::memory_order_acquire);
}

Result<Reply> Router::RunOn(Node& node, std::string_view command) {
  if (!node.live()) return node.Refused();
  Call call;
  call.out = command;
  RunCall(node.Pick(), call);
  if (!call.status.ok()) return call.status;
  if (call.got.size() != 1) {
    return UnavailableError("redis " + node.endpoint().ToString() + ": no reply");
  }
  return std::move(call.got[0]);
}

Result<std::vector<Node*>> Router::Masters() {
  if (!options_.cluster) return std::vector<Node*>{single_};
  std::vector<Node*> masters;
  for (int s = 0; s < kSlots; ++s) {
    Node* n = NodeForSlot(s);
    if (n == nullptr) {
      return UnavailableError("the cluster slot map has no master for slot " + std::to_string(s));
    }
    if (std::find(masters.begin(), masters.end(), n) == masters.end()) masters.push_back(n);
  }
  return masters;
}

Status Router::Refresh(bool force) {
  if (!options_.cluster) return OkStatus();
  std::lock_guard<std::mutex> lock(refresh_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_refresh_ < kRefreshInterval) return OkStatus();
  // Ask the masters we know first, then the seeds, then every node ever seen.
  std::vector<Node*> candidates;
  auto add = [&candidates](Node* n) {
    if (n != nullptr && std::find(candidates.begin(), candidates.end(), n) == candidates.end()) {
      candidates.push_back(n);
    }
  };
  for (int s = 0; s < kSlots; ++s) add(NodeForSlot(s));
  for (const Endpoint& e : options_.seeds) add(GetNode(e));
  {
    std::vector<Node*> all;
    {
      std::lock_guard<std::mutex> nodes_lock(nodes_mu_);
      for (auto& [name, n] : nodes_) all.push_back(n.get());
    }
    for (Node* n : all) add(n);
  }
  const std::string slots_command = Command().Arg("CLUSTER").Arg("SLOTS").Take();
  std::string problems;
  for (Node* node : candidates) {
    auto note = [&](std::string_view what) {
      if (!problems.empty()) problems += "; ";
      problems += node->endpoint().ToString() + ": " + std::string(what);
    };
    Result<Reply> r = RunOn(*node, slots_command);
    if (!r.has_value()) {
      note(r.error().message());
      continue;
    }
    if ((*r)->type == REDIS_REPLY_ERROR) {
      note(Describe(**r));
      continue;
    }
    Result<std::vector<SlotRange>> ranges = ParseClusterSlots(**r, node->endpoint().host);
    if (!ranges.has_value()) {
      note(ranges.error().message());
      continue;
    }
    if (ranges->empty()) {
      note("no slots are assigned");
      continue;
    }
    std::vector<Node*> fresh(kSlots, nullptr);
    for (const SlotRange& range : *ranges) {
      Node* owner = GetNode(Endpoint{range.host, range.port});
      for (int s = range.first; s <= range.last; ++s) fresh[static_cast<std::size_t>(s)] = owner;
    }
    for (int s = 0; s < kSlots; ++s) {
      (*slots_)[static_cast<std::size_t>(s)].store(fresh[static_cast<std::size_t>(s)],
                                                   std::memory_order_release);
    }
    last_refresh_ = now;
    return OkStatus();
  }
  return UnavailableError("cannot read the Redis Cluster slot map (" + problems + ")");
}

Result<Reply> Router::Run(const Request& request) {
  std::vector<Result<Reply>> out = RunMany(std::span<const Request>(&request, 1));
  return std::move(out[0]);
}

std::vector<Result<Reply>> Router::RunMany(std::span<const Request> requests) {
  std::vector<Attempt> attempts(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    attempts[i].request = &requests[i];
    if (options_.cluster) attempts[i].slot = KeySlot(requests[i].key);
  }
  while (true) {
    bool pending = false;
    for (const Attempt& a : attempts) pending = pending || !a.result.has_value();
    if (!pending) break;
    Round(attempts);
  }
  std::vector<Result<Reply>> out;
  out.reserve(attempts.size());
  for (Attempt& a : attempts) out.push_back(std::move(*a.result));
  return out;
}

void Router::Round(std::span<Attempt> attempts) {
  // Send: one connection per node for this round, so each node gets one pipeline; none to a
  // node that is not answering (see Liveness), whose attempts are refused unsent.
  // Nodes are few: a list beats a hash map here.
  std::vector<std::pair<Node*, Connection*>> picked;
  std::vector<Attempt*> sent;
  sent.reserve(attempts.size());
  for (Attempt& a : attempts) {
    if (a.result.has_value()) continue;
    a.node = a.ask != nullptr ? a.ask : NodeForSlot(a.slot);
    a.refused = false;
    if (a.node == nullptr) {
      a.problem = "no master serves slot " + std::to_string(a.slot);
      ++a.tries;
      if (a.tries >= kMaxTries) a.result = UnavailableError("redis: " + a.problem);
      continue;
    }
    auto it = std::find_if(picked.begin(), picked.end(),
                           [&a](const auto& p) { return p.first == a.node; });
    if (it == picked.end()) {
      it = picked.insert(it, {a.node, a.node->live() ? &a.node->Pick() : nullptr});
    }
    a.connection = it->second;
    a.refused = a.connection == nullptr;
    if (a.refused) continue;
    a.out.clear();
    int replies = 1;
    if (a.reload) {
      Command().Arg("SCRIPT").Arg("LOAD").Arg(a.request->script->body).AppendTo(a.out);
      ++replies;
    }
    if (a.ask != nullptr) {
      Command().Arg("ASKING").AppendTo(a.out);
      ++replies;
    }
    a.out.append(a.request->command);
    Reset(a.call);
    a.call.out = a.out;
    a.call.replies = replies;
    a.call.wrote = a.request->wrote;
    a.lead = a.connection->Enqueue(&a.call);
    sent.push_back(&a);
  }
  // Lead the connections we must (all of their writes first, then the reads), then wait for
  // the calls that rode on another caller's round.
  std::vector<std::pair<Connection*, Connection::Round>> led;
  for (Attempt* a : sent) {
    if (!a->lead) continue;
    led.emplace_back(a->connection, Connection::Round{});
    a->connection->Start(led.back().second);
  }
  for (auto& [connection, round] : led) connection->Finish(round);
  for (Attempt* a : sent) {
    if (a->lead) continue;
    if (Connection::Wait(&a->call)) {
      Connection::Round round;
      a->connection->Start(round);
      a->connection->Finish(round);
    }
  }

  // Sort out the replies.
  bool refresh = false;
  bool pause = false;
  bool refused = false;
  for (Attempt& a : attempts) {
    if (a.result.has_value()) continue;
    if (a.node == nullptr) {
      refresh = true;
      pause = true;
    } else if (a.refused) {
      // Unless a refreshed map moves the slot (a replica took over), it fails now: trying the
      // same node again would hold the caller until the prober hears from it.
      ++a.tries;
      a.problem = a.node->Refused().message();
      refresh = true;
      refused = true;
      continue;
    } else {
      ++a.tries;
      const bool asked = a.ask != nullptr;
      const bool reloaded = a.reload;
      a.ask = nullptr;
      a.reload = false;
      Call& c = a.call;
      if (!c.status.ok()) {
        if (c.sent || !options_.cluster) {
          a.result = c.status;  // it may have run: never retried
          continue;
        }
        a.problem = c.status.message();
        refresh = true;  // the node is down: has a replica taken over?
        pause = true;
      } else {
        std::size_t at = 0;
        if (reloaded && c.got[at++]->type == REDIS_REPLY_ERROR) {
          a.result = std::move(c.got[0]);  // the script does not load
          continue;
        }
        if (asked) ++at;  // ASKING's +OK (an error there shows in the command's reply)
        Reply reply = std::move(c.got[at]);
        if (reply->type != REDIS_REPLY_ERROR) {
          a.result = std::move(reply);
          continue;
        }
        const std::string_view text = ErrorText(*reply);
        const bool moved = StartsWith(text, "MOVED ");
        if (moved || StartsWith(text, "ASK ")) {
          const auto target = ParseRedirect(text);
          if (!options_.cluster) {
            a.result = UnavailableError("redis " + a.node->endpoint().ToString() +
                                        " is a cluster node (it answered \"" + std::string(text) +
                                        "\"): use redis+cluster://");
            continue;
          }
          if (!target) {
            a.result = UnavailableError("redis " + a.node->endpoint().ToString() +
                                        ": a redirection I cannot read: " + std::string(text));
            continue;
          }
          Node* to = GetNode(target->second);
          if (moved) {
            (*slots_)[static_cast<std::size_t>(target->first)].store(to, std::memory_order_release);
            refresh = true;
          } else {
            a.ask = to;
          }
          a.problem = std::string(text);
        } else if (StartsWith(text, "NOSCRIPT") && a.request->script != nullptr) {
          a.reload = true;
          if (asked) a.ask = a.node;  // load it where the ASK pointed, and ask there again
          a.problem = std::string(text);
        } else if (StartsWith(text, "TRYAGAIN") || StartsWith(text, "CLUSTERDOWN") ||
                   StartsWith(text, "LOADING") || StartsWith(text, "MASTERDOWN") ||
                   (options_.cluster && StartsWith(text, "READONLY"))) {
          // Not run: the cluster is moving a slot, electing a master, or loading.
          a.problem = std::string(text);
          pause = true;
          refresh = true;
        } else {
          a.result = std::move(reply);
          continue;
        }
      }
    }
    if (a.tries >= kMaxTries) {
      a.result = UnavailableError("redis: no answer after " + std::to_string(a.tries) +
                                  " tries; the last: " + a.problem);
    }
  }
  if (pause) std::this_thread::sleep_for(milliseconds(20));
  if (refresh) {
    // A failed refresh leaves the old map; the next try finds out what it is worth.
    (void)Refresh(false);
  }
  if (!refused) return;
  for (Attempt& a : attempts) {
    if (a.result.has_value() || !a.refused) continue;
    if (a.ask != nullptr || NodeForSlot(a.slot) == a.node || a.tries >= kMaxTries) {
      a.result = a.node->Refused();
    }
  }
}

}  // namespace idem::redis
