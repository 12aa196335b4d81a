// End-to-end consumption from NATS JetStream: messages/s read, handled (no-op) and acknowledged
// by
//   (a) plain   a JetStream pull consumer written directly against libnats: fetch a batch,
//               read each message's key header and payload, ack each, one flush per batch.
//               No dedup. The peer.
//   (a') broker the NATS adapter alone (idem::Broker Poll + Acknowledge, no store, no core):
//               what the adapter costs over (a), to tell it from what the core costs.
//   (b) memory  idem::Consumer over the NATS adapter with the memory store.
//   (c) log     idem::Consumer over the NATS adapter with the log store, sync=always (every
//               BeginBatch and CompleteBatch waits for its fdatasync).
// Same stream, same batch size and ack pattern (ack each + one flush per batch), each pass
// with a fresh durable reading from the first message. The stream is filled once: N messages
// of ~100 bytes on S subjects, each with a unique Idempotency-Key header. Passes run in rounds
// (a, b, c, a, b, c, ...) and the medians are compared: b/a and c/a.
//
//   nats_consumer_bench --url nats://127.0.0.1:PORT [--messages 100000] [--batch 256]
//                       [--subjects 16] [--payload 100] [--rounds 3] [--dir /tmp]
//                       [--only plain,broker,memory,log] [--ack-sync] [--pipeline 1]
// --ack-sync: the plain consumer uses natsMsg_AckSync (a round trip per message) instead of
// ack + flush, to show what that would cost.
// --pipeline 0: (b) and (c) run the consumer without ConsumerOptions::pipeline (idemd consume
// pipelines NATS by default).
#include <nats/nats.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "idem/consumer.h"
#include "idem/consumers/nats.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"

namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Flags {
  std::string url;
  std::size_t messages = 100'000;
  std::size_t batch = 256;
  int subjects = 16;
  std::size_t payload = 100;
  int rounds = 3;
  std::string dir = "/tmp";
  std::string only = "plain,broker,memory,log";
  bool ack_sync = false;
  bool pipeline = true;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "nats_consumer_bench: %s\n", what.c_str());
  std::exit(1);
}

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--url") {
      f.url = next();
    } else if (a == "--messages") {
      f.messages = std::stoul(next());
    } else if (a == "--batch") {
      f.batch = std::stoul(next());
    } else if (a == "--subjects") {
      f.subjects = std::stoi(next());
    } else if (a == "--payload") {
      f.payload = std::stoul(next());
    } else if (a == "--rounds") {
      f.rounds = std::stoi(next());
    } else if (a == "--dir") {
      f.dir = next();
    } else if (a == "--only") {
      f.only = next();
    } else if (a == "--ack-sync") {
      f.ack_sync = true;
    } else if (a == "--pipeline") {
      f.pipeline = next() != "0";
    } else {
      Die("unknown flag " + a + " (see the comment at the top of nats_consumer_bench.cc)");
    }
  }
  if (f.url.empty()) Die("--url is required");
  if (f.messages == 0 || f.batch == 0 || f.subjects < 1 || f.rounds < 1) Die("bad numbers");
  return f;
}

void Check(natsStatus s, const char* what) {
  if (s != NATS_OK)
    Die(std::string(what) + ": " + natsStatus_GetText(s) + " " + nats_GetLastError(nullptr));
}

struct Setup {
  std::string stream;
  std::string prefix;  // subjects prefix.0 .. prefix.S-1
  std::string dlq_stream;
  std::string dlq_subject;
};

void Fill(const Flags& f, const Setup& s) {
  auto p = idem::nats::Publisher::Open(f.url);
  if (!p) Die(p.error().ToString());
  if (auto st = (*p)->EnsureStream(s.stream, {s.prefix + ".>"}); !st.ok()) Die(st.ToString());
  std::string payload(f.payload, 'x');
  const auto start = SteadyClock::now();
  for (std::size_t i = 0; i < f.messages; ++i) {
    const std::string key = "key-" + std::to_string(i);
    std::memcpy(payload.data(), key.data(), std::min(key.size(), payload.size()));
    const std::string subject = s.prefix + "." + std::to_string(i % f.subjects);
    if (auto st = (*p)->PublishAsync(subject, payload, {{"Idempotency-Key", key}}); !st.ok()) {
      Die(st.ToString());
    }
  }
  if (auto st = (*p)->WaitPublished(120s); !st.ok()) Die(st.ToString());
  const double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::printf("filled %s: %zu messages of %zu bytes on %d subjects in %.2f s (%.0f msg/s)\n",
              s.stream.c_str(), f.messages, f.payload, f.subjects, secs,
              static_cast<double>(f.messages) / secs);
}

// Wall time and this process's CPU time (all threads, libnats' own included) of one pass.
// One pass: msg/s and the client's CPU microseconds per message.
struct Pass {
  double rate = 0;
  double cpu_us = 0;
};

class Stopwatch {
 public:
  Stopwatch() : wall_(SteadyClock::now()), cpu_(CpuSeconds()) {}
  Pass Stop(std::size_t messages) const {
    const double secs = std::chrono::duration<double>(SteadyClock::now() - wall_).count();
    const double n = static_cast<double>(messages);
    return {n / secs, (CpuSeconds() - cpu_) * 1e6 / n};
  }

 private:
  static double CpuSeconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto secs = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
    };
    return secs(ru.ru_utime) + secs(ru.ru_stime);
  }
  SteadyClock::time_point wall_;
  double cpu_;
};

// (a) plain libnats: fetch, read, ack each, flush per batch.
Pass RunPlain(const Flags& f, const Setup& s, const std::string& durable) {
  natsConnection* nc = nullptr;
  Check(natsConnection_ConnectTo(&nc, f.url.c_str()), "connect");
  jsCtx* js = nullptr;
  Check(natsConnection_JetStream(&js, nc, nullptr), "jetstream");
  jsConsumerConfig cc;
  jsConsumerConfig_Init(&cc);
  cc.Durable = durable.c_str();
  cc.AckPolicy = js_AckExplicit;
  cc.DeliverPolicy = js_DeliverAll;
  cc.AckWait = 30'000'000'000LL;
  cc.MaxAckPending = 1000;  // the adapter's default
  jsConsumerInfo* ci = nullptr;
  Check(js_AddConsumer(&ci, js, s.stream.c_str(), &cc, nullptr, nullptr), "add consumer");
  jsConsumerInfo_Destroy(ci);
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = s.stream.c_str();
  so.Consumer = durable.c_str();
  natsSubscription* sub = nullptr;
  Check(js_PullSubscribe(&sub, js, nullptr, durable.c_str(), nullptr, &so, nullptr), "subscribe");
  natsSubscription_SetPendingLimits(sub, 1 << 20, 1 << 30);

  std::size_t got = 0;
  std::size_t bytes = 0;
  const Stopwatch watch;
  while (got < f.messages) {
    natsMsgList list{};
    // As the adapter does: never more than max_ack_pending at once.
    const natsStatus st = natsSubscription_Fetch(
        &list, sub, static_cast<int>(std::min<std::size_t>(f.batch, 1000)), 100, nullptr);
    if (st == NATS_TIMEOUT) continue;
    Check(st, "fetch");
    for (int i = 0; i < list.Count; ++i) {
      natsMsg* m = list.Msgs[i];
      const char* key = nullptr;
      natsMsgHeader_Get(m, "Idempotency-Key", &key);
      bytes += static_cast<std::size_t>(natsMsg_GetDataLength(m)) + (key ? std::strlen(key) : 0);
      if (f.ack_sync) {
        Check(natsMsg_AckSync(m, nullptr, nullptr), "ack sync");
      } else {
        Check(natsMsg_Ack(m, nullptr), "ack");
      }
    }
    if (!f.ack_sync) Check(natsConnection_FlushTimeout(nc, 5000), "flush");
    got += static_cast<std::size_t>(list.Count);
    natsMsgList_Destroy(&list);
  }
  const Pass pass = watch.Stop(got);
  if (bytes == 0) Die("read nothing");
  natsSubscription_Destroy(sub);
  js_DeleteConsumer(js, s.stream.c_str(), durable.c_str(), nullptr, nullptr);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return pass;
}

idem::nats::NatsConsumerConfig AdapterConfig(const Flags& f, const Setup& s,
                                             const std::string& durable) {
  idem::nats::NatsConsumerConfig c;
  c.url = f.url;
  c.stream = s.stream;
  c.subjects = {s.prefix + ".>"};
  c.durable = durable;
  c.dlq_stream = s.dlq_stream;
  c.dlq_subject = s.dlq_subject;
  return c;
}

// (a') the adapter alone: Poll a batch, Acknowledge it.
Pass RunBroker(const Flags& f, const Setup& s, const std::string& durable) {
  auto broker = idem::nats::OpenNatsConsumer(AdapterConfig(f, s, durable));
  if (!broker) Die(broker.error().ToString());
  std::size_t got = 0;
  std::vector<const idem::BrokerMessage*> ptrs;
  const Stopwatch watch;
  while (got < f.messages) {
    auto batch = (*broker)->Poll(f.batch, 100ms);
    if (!batch) Die(batch.error().ToString());
    ptrs.clear();
    for (const auto& m : *batch) ptrs.push_back(&m);
    if (auto st = (*broker)->Acknowledge(ptrs); !st.ok()) Die(st.ToString());
    got += batch->size();
  }
  return watch.Stop(got);
}

// (b), (c): idem::Consumer over the adapter; RunOnce until every key was executed.
Pass RunIdem(const Flags& f, const Setup& s, const std::string& durable, idem::Store& store) {
  auto broker = idem::nats::OpenNatsConsumer(AdapterConfig(f, s, durable));
  if (!broker) Die(broker.error().ToString());
  idem::ConsumerOptions o;
  o.name = durable;
  o.scope = durable;  // a scope per pass: every key is new to it
  o.batch_size = f.batch;
  o.poll_wait = 100ms;
  o.pipeline = f.pipeline;  // on by default, as idemd consume runs NATS (docs/consumers.md)
  idem::Consumer consumer(
      store, **broker,
      [](const idem::HandlerContext&, const idem::BrokerMessage&) {
        return idem::HandlerVerdict{};
      },
      o);
  const Stopwatch watch;
  while (consumer.counts().executed < f.messages) {
    auto r = consumer.RunOnce();
    if (!r) Die("RunOnce: " + r.error().ToString());
  }
  const Pass pass = watch.Stop(f.messages);
  const auto counts = consumer.counts();
  if (counts.replayed != 0 || counts.dead_lettered != 0 || counts.executed != f.messages) {
    Die("unexpected counts: executed " + std::to_string(counts.executed) + " replayed " +
        std::to_string(counts.replayed) + " dead-lettered " + std::to_string(counts.dead_lettered));
  }
  return pass;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  const std::string tag = std::to_string(::getpid());
  Setup s{"BENCH_" + tag, "bench." + tag, "BENCH_DLQ_" + tag, "bench_dlq." + tag};
  Fill(f, s);
  auto want = [&](const char* name) { return f.only.find(name) != std::string::npos; };

  std::map<std::string, std::vector<Pass>> passes;
  auto record = [&](const char* name, const char* label, int round, Pass p) {
    passes[name].push_back(p);
    std::printf("round %d  %-34s %9.0f msg/s  %5.2f us CPU/msg\n", round, label, p.rate, p.cpu_us);
    std::fflush(stdout);
  };
  for (int round = 1; round <= f.rounds; ++round) {
    const std::string r = std::to_string(round);
    if (want("plain")) {
      record("a", f.ack_sync ? "(a) plain JetStream pull, AckSync" : "(a) plain JetStream pull",
             round, RunPlain(f, s, "plain" + r));
    }
    if (want("broker"))
      record("a'", "(a') NATS adapter alone", round, RunBroker(f, s, "broker" + r));
    if (want("memory")) {
      auto store = idem::NewMemoryStore();
      record("b", "(b) idem + memory store", round, RunIdem(f, s, "memory" + r, *store));
    }
    if (want("log")) {
      idem::LogStoreOptions lo;
      lo.dir = (std::filesystem::path(f.dir) / ("idem-nats-bench-" + tag + "-" + r)).string();
      lo.sync = idem::SyncMode::kAlways;
      Pass p;
      {
        auto store = idem::OpenLogStore(lo);
        if (!store) Die(store.error().ToString());
        p = RunIdem(f, s, "log" + r, **store);
      }
      std::filesystem::remove_all(lo.dir);
      record("c", "(c) idem + log store, sync=always", round, p);
    }
  }
  std::printf("medians over %d rounds (%zu messages, batch %zu, pipeline %d):\n", f.rounds,
              f.messages, f.batch, f.pipeline ? 1 : 0);
  std::map<std::string, double> rate;
  for (const auto& [name, v] : passes) {
    std::vector<double> rates, cpus;
    for (const Pass& p : v) {
      rates.push_back(p.rate);
      cpus.push_back(p.cpu_us);
    }
    rate[name] = Median(rates);
    std::printf("  %-3s %9.0f msg/s  %5.2f us CPU/msg\n", name.c_str(), rate[name], Median(cpus));
  }
  if (rate.count("a")) {
    const double a = rate["a"];
    if (rate.count("a'")) std::printf("  a'/a = %.2f (the adapter alone)\n", rate["a'"] / a);
    if (rate.count("b")) std::printf("  b/a  = %.2f (target >= 0.85)\n", rate["b"] / a);
    if (rate.count("c")) std::printf("  c/a  = %.2f (target >= 0.60)\n", rate["c"] / a);
  }
  auto p = idem::nats::Publisher::Open(f.url);
  if (p) {
    (void)(*p)->DeleteStream(s.stream);
    (void)(*p)->DeleteStream(s.dlq_stream);
  }
  return 0;
}
