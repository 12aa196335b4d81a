// The Redis store against a plain hiredis client doing the least a dedup gate can do, side by
// side in one run, on the same server (bench/redis/run.sh starts one of its own):
//
//   (a) cycle  every caller: a new 32-hex-digit key, begin then complete with a 100-byte
//              response. idem: Begin + Complete on one shared store (its connections
//              pipeline the callers' commands). Plain: SET k 1 NX PX, then SET k <resp> XX PX,
//              each thread on a connection of its own. Target: idem >= 1.0x plain.
//   (b) batch  the same with 32 keys a call: BeginBatch + CompleteBatch against 32 SET NX PX
//              pipelined, then 32 SET XX PX pipelined. Target: idem >= 1.0x plain.
//   (c) memory Redis's used_memory per completed key without a response (INFO memory, over
//              --memory-keys keys, after FLUSHALL): idem against a bare SET k 1 PX with the
//              same keys. Target: <= 128 bytes (and about what the bare SET costs).
//
// With --cluster the plain client routes by slot (the same CRC16) with one connection per
// thread and master; idem uses its cluster router.
//
// Each contender of (a) and (b) starts on an empty server (FLUSHALL before it): the keys an
// earlier run left (hundreds of thousands, 24 h TTL) made Redis's work per command larger for
// whoever ran second (measured: idem's batches 8.7 us of Redis CPU a key on an empty server,
// 10.6 after the plain client's run).
//
// Usage: redis_store_bench --redis HOST:PORT[,HOST:PORT...] [--cluster] [--threads 50]
//          [--seconds 5] [--connections N] [--memory-keys 100000] [--only a,b,c]
// It runs FLUSHALL: never point it at a server holding data you want.
#include <hiredis/hiredis.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/stores/redis.h"
#include "stores/redis/slots.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Flags {
  std::vector<std::string> nodes;
  bool cluster = false;
  int threads = 50;
  int seconds = 5;
  int connections = 0;  // 0: the store's default
  int memory_keys = 100'000;
  int batch = 32;
  std::string only = "a,b,c";
  bool plain = true;  // --idem-only: skip the plain client (for profiling)
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "redis_store_bench: %s\n", why.c_str());
  std::exit(2);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--redis") {
      std::string list = value();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        f.nodes.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a == "--cluster") {
      f.cluster = true;
    } else if (a == "--threads") {
      f.threads = std::stoi(value());
    } else if (a == "--seconds") {
      f.seconds = std::stoi(value());
    } else if (a == "--connections") {
      f.connections = std::stoi(value());
    } else if (a == "--memory-keys") {
      f.memory_keys = std::stoi(value());
    } else if (a == "--idem-only") {
      f.plain = false;
    } else if (a == "--only") {
      f.only = value();
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.nodes.empty()) Die("--redis HOST:PORT is required");
  return f;
}

std::string RandomKey(std::mt19937_64& rng) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string k(32, '0');
  std::uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) {
    k[static_cast<std::size_t>(i)] = kHex[(a >> (4 * i)) & 15];
    k[static_cast<std::size_t>(16 + i)] = kHex[(b >> (4 * i)) & 15];
  }
  return k;
}

const std::string kResponse(100, 'r');
constexpr long long kRetentionMs = 24LL * 3600 * 1000;

struct Rate {
  double keys_per_s = 0;
  double redis_us_per_key = 0;   // the server's CPU (INFO cpu, every master)
  double client_us_per_key = 0;  // this process's CPU
};

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double RedisCpuSeconds(const std::vector<std::string>& nodes);

// Runs body(thread) on `threads` threads for `seconds` (after a one-second warm-up); each call
// returns how many keys it finished.
Rate Measure(const Flags& f, const std::function<long(int, std::mt19937_64&)>& body) {
  std::atomic<bool> counting{false}, stop{false};
  std::atomic<long> total{0};
  std::vector<std::thread> running;
  for (int t = 0; t < f.threads; ++t) {
    running.emplace_back([&, t] {
      std::mt19937_64 rng(std::random_device{}() ^ (static_cast<std::uint64_t>(t) << 32));
      long mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const long n = body(t, rng);
        if (counting.load(std::memory_order_relaxed)) mine += n;
      }
      total.fetch_add(mine);
    });
  }
  std::this_thread::sleep_for(1s);
  const double redis0 = RedisCpuSeconds(f.nodes), client0 = ProcessCpuSeconds();
  counting.store(true);
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(f.seconds));
  counting.store(false);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  const double redis1 = RedisCpuSeconds(f.nodes), client1 = ProcessCpuSeconds();
  stop.store(true);
  for (auto& th : running) th.join();
  Rate r;
  const double keys = static_cast<double>(total.load());
  r.keys_per_s = keys / elapsed;
  r.redis_us_per_key = (redis1 - redis0) * 1e6 / keys;
  r.client_us_per_key = (client1 - client0) * 1e6 / keys;
  return r;
}

// ---- the plain client ----

struct Endpoint {
  std::string host;
  int port;
};
Endpoint Split(const std::string& hp) {
  const std::size_t colon = hp.rfind(':');
  return {hp.substr(0, colon), std::stoi(hp.substr(colon + 1))};
}

redisContext* Connect(const Endpoint& e) {
  redisContext* c = redisConnect(e.host.c_str(), e.port);
  if (c == nullptr || c->err) Die("cannot connect to " + e.host + ":" + std::to_string(e.port));
  return c;
}

void Check(redisReply* r, const char* what) {
  if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
    Die(std::string(what) + ": " + (r != nullptr ? r->str : "no reply"));
  }
  freeReplyObject(r);
}

// One connection per master; routes by slot in a cluster.
class PlainClient {
 public:
  PlainClient(const Flags& f) {
    if (!f.cluster) {
      contexts_.push_back(Connect(Split(f.nodes[0])));
      owner_.assign(idem::redis::kSlots, 0);
      return;
    }
    redisContext* seed = Connect(Split(f.nodes[0]));
    auto* r = static_cast<redisReply*>(redisCommand(seed, "CLUSTER SLOTS"));
    auto ranges = idem::redis::ParseClusterSlots(*r, Split(f.nodes[0]).host);
    if (!ranges.has_value()) Die(ranges.error().ToString());
    freeReplyObject(r);
    redisFree(seed);
    owner_.assign(idem::redis::kSlots, 0);
    std::vector<std::string> names;
    for (const auto& range : *ranges) {
      const std::string name = range.host + ":" + std::to_string(range.port);
      std::size_t index = 0;
      while (index < names.size() && names[index] != name) ++index;
      if (index == names.size()) {
        names.push_back(name);
        contexts_.push_back(Connect({range.host, range.port}));
      }
      for (int s = range.first; s <= range.last; ++s) owner_[static_cast<std::size_t>(s)] = index;
    }
  }
  ~PlainClient() {
    for (redisContext* c : contexts_) redisFree(c);
  }
  redisContext* For(const std::string& key) {
    return contexts_.size() == 1
               ? contexts_[0]
               : contexts_[owner_[static_cast<std::size_t>(idem::redis::KeySlot(key))]];
  }
  // Pipelines `commands(context, key)` for every key (per node), then reads every reply.
  void Pipeline(const std::vector<std::string>& keys,
                const std::function<void(redisContext*, const std::string&)>& append,
                const char* what) {
    std::vector<int> pending(contexts_.size(), 0);
    for (const std::string& k : keys) {
      redisContext* c = For(k);
      append(c, k);
      for (std::size_t i = 0; i < contexts_.size(); ++i) pending[i] += contexts_[i] == c;
    }
    for (std::size_t i = 0; i < contexts_.size(); ++i) {
      for (int n = 0; n < pending[i]; ++n) {
        void* reply = nullptr;
        if (redisGetReply(contexts_[i], &reply) != REDIS_OK) Die(what);
        Check(static_cast<redisReply*>(reply), what);
      }
    }
  }

 private:
  std::vector<redisContext*> contexts_;
  std::vector<std::size_t> owner_;
};

std::unique_ptr<idem::Store> OpenStore(const Flags& f) {
  idem::RedisStoreOptions o;
  o.nodes = f.nodes;
  o.cluster = f.cluster;
  if (f.connections > 0) o.connections_per_node = static_cast<std::size_t>(f.connections);
  auto store = idem::OpenRedisStore(o);
  if (!store.has_value()) Die(store.error().ToString());
  return std::move(*store);
}

Rate RunCycleIdem(const Flags& f) {
  auto store = OpenStore(f);
  return Measure(f, [&](int, std::mt19937_64& rng) -> long {
    const std::string key = RandomKey(rng);
    auto a = store->Begin(idem::BeginRequest{.scope = "b", .key = key});
    if (!a.has_value() || !std::holds_alternative<idem::Acquired>(*a)) Die("begin failed");
    auto c = store->Complete(idem::CompleteRequest{.scope = "b",
                                                   .key = key,
                                                   .token = std::get<idem::Acquired>(*a).token,
                                                   .response = kResponse});
    if (!c.has_value() || *c != idem::WriteAnswer::kApplied) Die("complete failed");
    return 1;
  });
}

Rate RunCyclePlain(const Flags& f) {
  std::vector<std::unique_ptr<PlainClient>> clients;
  for (int t = 0; t < f.threads; ++t) clients.push_back(std::make_unique<PlainClient>(f));
  return Measure(f, [&](int t, std::mt19937_64& rng) -> long {
    const std::string key = RandomKey(rng);
    redisContext* c = clients[static_cast<std::size_t>(t)]->For(key);
    Check(static_cast<redisReply*>(
              redisCommand(c, "SET %b 1 NX PX %lld", key.data(), key.size(), kRetentionMs)),
          "SET NX");
    Check(static_cast<redisReply*>(redisCommand(c, "SET %b %b XX PX %lld", key.data(), key.size(),
                                                kResponse.data(), kResponse.size(), kRetentionMs)),
          "SET XX");
    return 1;
  });
}

Rate RunBatchIdem(const Flags& f) {
  auto store = OpenStore(f);
  return Measure(f, [&](int, std::mt19937_64& rng) -> long {
    std::vector<std::string> keys;
    for (int i = 0; i < f.batch; ++i) keys.push_back(RandomKey(rng));
    std::vector<idem::BeginRequest> begins;
    for (const auto& k : keys) begins.push_back(idem::BeginRequest{.scope = "b", .key = k});
    auto acquired = store->BeginBatch(begins);
    std::vector<idem::CompleteRequest> completes;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!acquired[i].has_value() || !std::holds_alternative<idem::Acquired>(*acquired[i])) {
        Die("batch begin failed");
      }
      completes.push_back(
          idem::CompleteRequest{.scope = "b",
                                .key = keys[i],
                                .token = std::get<idem::Acquired>(*acquired[i]).token,
                                .response = kResponse});
    }
    for (const auto& r : store->CompleteBatch(completes)) {
      if (!r.has_value() || *r != idem::WriteAnswer::kApplied) Die("batch complete failed");
    }
    return f.batch;
  });
}

Rate RunBatchPlain(const Flags& f) {
  std::vector<std::unique_ptr<PlainClient>> clients;
  for (int t = 0; t < f.threads; ++t) clients.push_back(std::make_unique<PlainClient>(f));
  return Measure(f, [&](int t, std::mt19937_64& rng) -> long {
    std::vector<std::string> keys;
    for (int i = 0; i < f.batch; ++i) keys.push_back(RandomKey(rng));
    PlainClient& client = *clients[static_cast<std::size_t>(t)];
    client.Pipeline(
        keys,
        [](redisContext* c, const std::string& k) {
          redisAppendCommand(c, "SET %b 1 NX PX %lld", k.data(), k.size(), kRetentionMs);
        },
        "SET NX");
    client.Pipeline(
        keys,
        [](redisContext* c, const std::string& k) {
          redisAppendCommand(c, "SET %b %b XX PX %lld", k.data(), k.size(), kResponse.data(),
                             kResponse.size(), kRetentionMs);
        },
        "SET XX");
    return f.batch;
  });
}

// ---- memory ----

// One INFO field summed over the masters among `nodes`.
double SumInfo(const std::vector<std::string>& nodes, const char* section,
               const std::vector<const char*>& fields) {
  double sum = 0;
  for (const std::string& node : nodes) {
    redisContext* c = Connect(Split(node));
    auto* role = static_cast<redisReply*>(redisCommand(c, "ROLE"));
    const bool master = role != nullptr && role->type == REDIS_REPLY_ARRAY &&
                        std::string_view(role->element[0]->str) == "master";
    freeReplyObject(role);
    if (master) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "INFO %s", section));
      for (const char* field : fields) {
        const std::string name = std::string(field) + ":";
        const char* at = std::strstr(r->str, name.c_str());
        if (at != nullptr) sum += std::atof(at + name.size());
      }
      freeReplyObject(r);
    }
    redisFree(c);
  }
  return sum;
}

double RedisCpuSeconds(const std::vector<std::string>& nodes) {
  return SumInfo(nodes, "cpu", {"used_cpu_sys", "used_cpu_user"});
}

long long UsedMemory(const Flags& f) {
  return static_cast<long long>(SumInfo(f.nodes, "memory", {"used_memory"}));
}

void FlushAll(const Flags& f) {
  for (const std::string& node : f.nodes) {
    redisContext* c = Connect(Split(node));
    freeReplyObject(redisCommand(c, "FLUSHALL SYNC"));
    redisFree(c);
  }
}

std::vector<std::string> MemoryKeys(const Flags& f) {
  std::mt19937_64 rng(42);
  std::vector<std::string> keys;
  for (int i = 0; i < f.memory_keys; ++i) keys.push_back(RandomKey(rng));
  return keys;
}

double MemoryIdem(const Flags& f) {
  FlushAll(f);
  const long long before = UsedMemory(f);
  auto store = OpenStore(f);
  const std::vector<std::string> keys = MemoryKeys(f);
  for (std::size_t at = 0; at < keys.size(); at += 256) {
    std::vector<idem::BeginRequest> begins;
    for (std::size_t i = at; i < std::min(keys.size(), at + 256); ++i) {
      begins.push_back(idem::BeginRequest{.scope = "", .key = keys[i]});
    }
    auto acquired = store->BeginBatch(begins);
    std::vector<idem::CompleteRequest> completes;
    for (std::size_t i = 0; i < begins.size(); ++i) {
      if (!acquired[i].has_value()) Die(acquired[i].error().ToString());
      completes.push_back(
          idem::CompleteRequest{.scope = "",
                                .key = begins[i].key,
                                .token = std::get<idem::Acquired>(*acquired[i]).token});
    }
    for (const auto& r : store->CompleteBatch(completes)) {
      if (!r.has_value()) Die(r.error().ToString());
    }
  }
  return static_cast<double>(UsedMemory(f) - before) / static_cast<double>(keys.size());
}

double MemoryPlain(const Flags& f) {
  FlushAll(f);
  const long long before = UsedMemory(f);
  PlainClient client(f);
  const std::vector<std::string> keys = MemoryKeys(f);
  for (std::size_t at = 0; at < keys.size(); at += 256) {
    std::vector<std::string> part(
        keys.begin() + static_cast<long>(at),
        keys.begin() + static_cast<long>(std::min(keys.size(), at + 256)));
    client.Pipeline(
        part,
        [](redisContext* c, const std::string& k) {
          redisAppendCommand(c, "SET %b 1 PX %lld", k.data(), k.size(), kRetentionMs);
        },
        "SET");
  }
  return static_cast<double>(UsedMemory(f) - before) / static_cast<double>(keys.size());
}

bool Wants(const Flags& f, char scenario) { return f.only.find(scenario) != std::string::npos; }

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  std::printf("redis_store_bench: %s%s, %d threads, %d s a run, %s connections per node\n",
              f.cluster ? "cluster " : "", f.nodes[0].c_str(), f.threads, f.seconds,
              f.connections > 0 ? std::to_string(f.connections).c_str() : "default");
  auto row = [&f](const char* what, const Rate& plain, const Rate& idem) {
    std::printf("%s\n", what);
    if (f.plain) {
      std::printf("    plain %9.0f keys/s (redis %5.1f us/key, client %5.1f us/key)\n",
                  plain.keys_per_s, plain.redis_us_per_key, plain.client_us_per_key);
    }
    std::printf("    idem  %9.0f keys/s (redis %5.1f us/key, client %5.1f us/key)", idem.keys_per_s,
                idem.redis_us_per_key, idem.client_us_per_key);
    if (f.plain) std::printf("   ratio %.2fx (target >= 1.0)", idem.keys_per_s / plain.keys_per_s);
    std::printf("\n");
  };
  // Each contender on an empty server.
  auto plain_then_idem = [&](Rate (*plain)(const Flags&), Rate (*idem)(const Flags&)) {
    Rate p{};
    if (f.plain) {
      FlushAll(f);
      p = plain(f);
    }
    FlushAll(f);
    return std::pair{p, idem(f)};
  };
  if (Wants(f, 'a')) {
    const auto [plain, idem] = plain_then_idem(RunCyclePlain, RunCycleIdem);
    row("(a) cycle: plain SET NX PX + SET XX PX (a connection per thread) vs idem Begin+Complete",
        plain, idem);
  }
  if (Wants(f, 'b')) {
    const auto [plain, idem] = plain_then_idem(RunBatchPlain, RunBatchIdem);
    row("(b) batches of 32: plain 32 SET NX PX then 32 SET XX PX pipelined vs idem "
        "BeginBatch+CompleteBatch",
        plain, idem);
  }
  if (Wants(f, 'c')) {
    const double plain = MemoryPlain(f);
    const double idem = MemoryIdem(f);
    std::printf(
        "(c) memory  SET k 1 PX %6.1f bytes/key   idem completed key, no response %6.1f "
        "bytes/key   (%d keys; target <= 128)\n",
        plain, idem, f.memory_keys);
    FlushAll(f);
  }
  return 0;
}
