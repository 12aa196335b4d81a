// The Redis Streams consumer against a plain XREADGROUP + XACK loop, in one run, on one
// server (bench/redis_streams/run.sh starts one of its own).
//
// One stream of --messages entries (~100-byte payload, a unique Idempotency-Key field) is
// written once; then each contender reads all of it through a fresh consumer group (from the
// start) with a no-op handler, and its rate is the entries it settled per second, from the first
// read to the last XACK's answer:
//
//   (a) plain  hiredis: XREADGROUP COUNT --batch, look at every entry's key, one XACK per batch.
//              Tuned like the adapter: two XREADGROUPs for the next batches are on their way
//              while a batch is looked at, an XACK's reply is read only when a later batch is
//              wanted, RESP is formatted by hand, and batches are read through hiredis object
//              callbacks that keep only the ids and keys (no reply objects), as the adapter
//              reads straight into messages. No dedup.
//   (b) memory idem::Consumer (batch_size --batch) over the Redis Streams broker, memory store.
//   (c) log    the same with the embedded log store, sync=always, in a fresh temporary directory.
//   (x) broker the broker alone (Poll + Acknowledge, no Consumer, no store), only with --only
//              x: it shows how much of the gap is the adapter's and how much the core's.
//
// The contenders run in turn --rounds times (a b c a b c ...); the medians and the ratios b/a
// and c/a are printed (targets: >= 0.85 and >= 0.6).
//
// Usage: redis_streams_bench --redis HOST:PORT [--messages 200000] [--batch 256] [--rounds 3]
//          [--only a,b,c]
// It deletes and writes the stream "idem-bench:orders": never point it at a server holding
// data you want.
#include <hiredis/hiredis.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/consumer.h"
#include "idem/consumers/redis_streams.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"

namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr std::string_view kStream = "idem-bench:orders";

struct Flags {
  std::string redis;
  int messages = 200'000;
  int batch = 256;
  int rounds = 3;
  std::string only = "a,b,c";
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "redis_streams_bench: %s\n", why.c_str());
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
      f.redis = value();
    } else if (a == "--messages") {
      f.messages = std::stoi(value());
    } else if (a == "--batch") {
      f.batch = std::stoi(value());
    } else if (a == "--rounds") {
      f.rounds = std::stoi(value());
    } else if (a == "--only") {
      f.only = value();
    } else {
      Die("unknown flag " + a);
    }
  }
  if (f.redis.empty()) Die("--redis HOST:PORT is required");
  if (f.messages <= 0 || f.batch <= 0 || f.rounds <= 0) Die("counts must be above 0");
  return f;
}

// ---- a plain hiredis connection ----

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

class Plain {
 public:
  explicit Plain(const std::string& address) {
    const std::size_t colon = address.rfind(':');
    c_ = redisConnect(address.substr(0, colon).c_str(), std::stoi(address.substr(colon + 1)));
    if (c_ == nullptr || c_->err != 0) Die("cannot connect to " + address);
    c_->reader->maxbuf = 0;  // keep the reply buffer, as the adapter does
  }
  ~Plain() { redisFree(c_); }
  // Formats RESP itself, as the adapter does (hiredis's redisAppendCommandArgv is slower).
  void Append(const std::vector<std::string_view>& words) {
    out_.clear();
    auto number = [&](char kind, std::size_t n) {
      char digits[24];
      out_.push_back(kind);
      out_.append(digits, std::to_chars(digits, digits + sizeof digits, n).ptr);
      out_.append("\r\n");
    };
    number('*', words.size());
    for (auto w : words) {
      number('$', w.size());
      out_.append(w);
      out_.append("\r\n");
    }
    redisAppendFormattedCommand(c_, out_.data(), out_.size());
  }
  void Flush() {
    int done = 0;
    while (done == 0) {
      if (redisBufferWrite(c_, &done) != REDIS_OK) Die(std::string("write: ") + c_->errstr);
    }
  }
  Reply Read() {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
      Die(std::string("read: ") + c_->errstr);
    }
    Reply reply(static_cast<redisReply*>(r));
    if (reply->type == REDIS_REPLY_ERROR) Die(std::string("redis: ") + reply->str);
    return reply;
  }
  Reply Call(const std::vector<std::string_view>& words) {
    Append(words);
    return Read();
  }
  // The next reply through hiredis object callbacks that keep what they need themselves (as the
  // adapter reads its batches: no reply objects made, copied and freed).
  void ReadWith(redisReplyObjectFunctions* fn, void* privdata) {
    redisReplyObjectFunctions* saved = c_->reader->fn;
    c_->reader->fn = fn;
    c_->reader->privdata = privdata;
    void* r = nullptr;
    const int ok = redisGetReply(c_, &r);
    c_->reader->fn = saved;
    c_->reader->privdata = nullptr;
    if (ok != REDIS_OK || r == nullptr) Die(std::string("read: ") + c_->errstr);
  }

 private:
  redisContext* c_;
  std::string out_;
};

void Fill(const Flags& f) {
  Plain p(f.redis);
  p.Call({"DEL", kStream});
  std::vector<idem::redis_streams::StreamEntry> entries;
  entries.reserve(static_cast<std::size_t>(f.messages));
  const std::string filler(100 - 16, 'x');
  for (int i = 0; i < f.messages; ++i) {
    char payload[32];
    std::snprintf(payload, sizeof payload, "{\"order\":%09d,\"", i);
    entries.push_back({.payload = payload + filler + "\"}",
                       .headers = {{"Idempotency-Key", "order-" + std::to_string(i) + "-" +
                                                           std::to_string(::getpid())}}});
  }
  const auto t0 = SteadyClock::now();
  auto s = idem::redis_streams::Publish("redis://" + f.redis, kStream, entries);
  if (!s.ok()) Die(s.ToString());
  const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::printf("wrote %d entries of %zu-byte payloads in %.2f s (XADD pipelined)\n", f.messages,
              entries.front().payload.size(), secs);
}

// Seconds of CPU Redis used so far (INFO cpu: used_cpu_user + used_cpu_sys).
double ServerCpu(const Flags& f) {
  Plain p(f.redis);
  Reply info = p.Call({"INFO", "cpu"});
  const std::string text(info->str, info->len);
  double total = 0;
  for (const char* name : {"used_cpu_user:", "used_cpu_sys:"}) {
    const std::size_t at = text.find(name);
    if (at != std::string::npos) total += std::stod(text.substr(at + std::strlen(name)));
  }
  return total;
}

// Seconds of CPU this process used so far.
double ClientCpu() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
  };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

std::string NewGroup(const Flags& f, const std::string& name) {
  Plain p(f.redis);
  p.Call({"XGROUP", "CREATE", kStream, name, "0"});
  return name;
}

// What the plain loop keeps of a batch while hiredis parses it: the ids (for the XACK) and the
// size of every Idempotency-Key (what a no-op handler would look at). No reply objects.
struct LeanBatch {
  std::vector<std::string> ids;
  std::size_t keys = 0;
  bool key_field = false;

  static LeanBatch& Of(const redisReadTask* t, int& depth) {
    depth = 0;
    for (; t->parent != nullptr; t = t->parent) ++depth;
    return *static_cast<LeanBatch*>(t->privdata);
  }
  // [[stream, [[id, [field, value, ...]], ...]]]: ids at depth 4, fields at depth 5.
  static void* String(const redisReadTask* t, char* str, std::size_t len) {
    int depth = 0;
    LeanBatch& b = Of(t, depth);
    if (depth == 4 && t->idx == 0) b.ids.emplace_back(str, len);
    if (depth == 5 && t->idx % 2 == 0) {
      b.key_field = std::string_view(str, len) == "Idempotency-Key";
    } else if (depth == 5 && b.key_field) {
      b.keys += len;
    }
    return &b;
  }
  static void* Array(const redisReadTask* t, int) { return Object(t); }
  static void* Integer(const redisReadTask* t, long long) { return Object(t); }
  static void* Nil(const redisReadTask* t) { return Object(t); }
  static void* Object(const redisReadTask* t) {
    int depth = 0;
    return &Of(t, depth);
  }
  static void Free(void*) {}
  static redisReplyObjectFunctions* Functions() {
    static redisReplyObjectFunctions fn = {&String, &Array, &Integer, &Nil, &Free};
    return &fn;
  }
};

// (a): returns the entries settled. The same pipelining as the adapter: two XREADGROUPs for
// the next batches are on their way while a batch is looked at, and each XACK's reply is read
// only when a later batch is wanted (Redis answers in the order it was asked).
long long RunPlain(const Flags& f, const std::string& group) {
  constexpr std::size_t kDepth = 2;  // the adapter's kReadAheadDepth
  Plain p(f.redis);
  const std::string count = std::to_string(f.batch);
  const std::vector<std::string_view> read = {"XREADGROUP", "GROUP",   group,   "c", "COUNT",
                                              count,        "STREAMS", kStream, ">"};
  long long settled = 0;
  std::size_t keys = 0;
  std::deque<char> expected;  // 'r': a batch, 'a': an XACK's count, in the order asked
  std::size_t reads = 0;
  std::vector<std::string_view> ack;
  auto ask_batches = [&] {
    for (; reads < kDepth; ++reads) {
      p.Append(read);
      expected.push_back('r');
    }
    p.Flush();
  };
  ask_batches();
  LeanBatch batch;
  while (!expected.empty()) {
    bool have_batch = false;
    while (!expected.empty() && !have_batch) {
      const char kind = expected.front();
      expected.pop_front();
      if (kind == 'a') {
        settled += p.Read()->integer;
      } else {
        --reads;
        batch.ids.clear();
        p.ReadWith(LeanBatch::Functions(), &batch);
        have_batch = true;
      }
    }
    if (!have_batch || batch.ids.empty()) continue;
    if (batch.ids.size() == static_cast<std::size_t>(f.batch)) ask_batches();
    ack = {"XACK", kStream, group};
    for (const std::string& id : batch.ids) ack.emplace_back(id);
    p.Append(ack);
    p.Flush();
    expected.push_back('a');
  }
  keys = batch.keys;
  if (keys == 0) Die("no keys seen");
  return settled;
}

// (x), for reading the others: the broker alone, Poll + Acknowledge, no store, no Consumer.
long long RunBroker(const Flags& f, const std::string& group) {
  auto broker = idem::redis_streams::OpenRedisStreamsConsumer({.url = "redis://" + f.redis,
                                                               .streams = {std::string(kStream)},
                                                               .group = group,
                                                               .consumer = "c",
                                                               .dlq_stream = "idem-bench:dlq",
                                                               .create_group = false});
  if (!broker) Die(broker.error().ToString());
  long long settled = 0;
  std::vector<const idem::BrokerMessage*> ack;
  while (true) {
    auto batch = (*broker)->Poll(static_cast<std::size_t>(f.batch), 0ms);
    if (!batch) Die(batch.error().ToString());
    if (batch->empty()) break;
    ack.clear();
    for (const auto& m : *batch) ack.push_back(&m);
    if (auto s = (*broker)->Acknowledge(ack); !s.ok()) Die(s.ToString());
    settled += static_cast<long long>(batch->size());
  }
  return settled;
}

// (b), (c): returns the entries settled.
long long RunIdem(const Flags& f, const std::string& group, idem::Store& store) {
  auto broker = idem::redis_streams::OpenRedisStreamsConsumer({.url = "redis://" + f.redis,
                                                               .streams = {std::string(kStream)},
                                                               .group = group,
                                                               .consumer = "c",
                                                               .dlq_stream = "idem-bench:dlq",
                                                               .create_group = false});
  if (!broker) Die(broker.error().ToString());
  idem::Consumer consumer(store, **broker,
                          [](const idem::HandlerContext&, const idem::BrokerMessage&) {
                            return idem::HandlerVerdict{};
                          },
                          {.name = "bench",
                           .scope = "bench:" + group,
                           .batch_size = static_cast<std::size_t>(f.batch),
                           .poll_wait = 20ms,
                           .pipeline = true});  // as idemd consume runs it
  while (consumer.counts().executed + consumer.counts().replayed <
         static_cast<std::uint64_t>(f.messages)) {
    auto n = consumer.RunOnce();
    if (!n) Die(n.error().ToString());
  }
  const auto c = consumer.counts();
  if (c.dead_lettered != 0 || c.store_errors != 0 || c.broker_errors != 0) {
    Die("errors: dlq " + std::to_string(c.dead_lettered) + ", store " +
        std::to_string(c.store_errors) + ", broker " + std::to_string(c.broker_errors));
  }
  return static_cast<long long>(c.executed + c.replayed);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = ParseFlags(argc, argv);
  Fill(f);
  std::map<char, std::vector<double>> rates;
  const std::map<char, std::string> names = {{'a', "plain XREADGROUP+XACK"},
                                             {'b', "idem, memory store"},
                                             {'c', "idem, log store"},
                                             {'x', "broker alone (no store)"}};
  for (int round = 0; round < f.rounds; ++round) {
    for (const char which : {'a', 'b', 'c', 'x'}) {
      if (f.only.find(which) == std::string::npos) continue;
      const std::string group = NewGroup(f, std::string("g-") + which + std::to_string(round));
      std::unique_ptr<idem::Store> store;
      std::filesystem::path dir;
      if (which == 'b') store = idem::NewMemoryStore();
      if (which == 'c') {
        char tmpl[] = "/tmp/idem-streams-bench.XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp");
        dir = tmpl;
        idem::LogStoreOptions options;
        options.dir = dir.string();
        options.sync = idem::SyncMode::kAlways;
        auto log = idem::OpenLogStore(options);
        if (!log) Die(log.error().ToString());
        store = std::move(*log);
      }
      const double server0 = ServerCpu(f);
      const double client0 = ClientCpu();
      const auto t0 = SteadyClock::now();
      const long long settled = which == 'a'   ? RunPlain(f, group)
                                : which == 'x' ? RunBroker(f, group)
                                               : RunIdem(f, group, *store);
      const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
      const double client_cpu = ClientCpu() - client0;
      const double server_cpu = ServerCpu(f) - server0;
      if (settled != f.messages) {
        Die(std::string(1, which) + " settled " + std::to_string(settled) + " of " +
            std::to_string(f.messages));
      }
      const double rate = static_cast<double>(settled) / secs;
      rates[which].push_back(rate);
      // CPU per message on each side shows which one is the bottleneck.
      std::printf(
          "round %d  (%c) %-24s %9.0f msg/s  (%.2f s; cpu/msg: client %.2f us, redis %.2f us)\n",
          round + 1, which, names.at(which).c_str(), rate, secs,
          client_cpu * 1e6 / static_cast<double>(settled),
          server_cpu * 1e6 / static_cast<double>(settled));
      std::fflush(stdout);
      store.reset();
      if (!dir.empty()) std::filesystem::remove_all(dir);
    }
  }
  std::printf("\nmedians over %d rounds, %d messages, batch %d:\n", f.rounds, f.messages, f.batch);
  for (const auto& [which, v] : rates) {
    std::printf("  (%c) %-24s %9.0f msg/s\n", which, names.at(which).c_str(), Median(v));
  }
  // The ratios of the medians, and the median of each round's ratio (rounds run back to back,
  // so a round's ratio is less touched by other load on the machine that comes and goes).
  auto ratio = [&](char x, const char* target) {
    if (rates.count('a') == 0 || rates.count(x) == 0) return;
    std::vector<double> per_round;
    for (std::size_t i = 0; i < rates[x].size() && i < rates['a'].size(); ++i) {
      per_round.push_back(rates[x][i] / rates['a'][i]);
    }
    std::printf("  %c/a = %.2f (median of rounds' ratios %.2f; target >= %s)\n", x,
                Median(rates[x]) / Median(rates['a']), Median(per_round), target);
  };
  ratio('b', "0.85");
  ratio('c', "0.60");
  ratio('x', "-");
  return 0;
}
