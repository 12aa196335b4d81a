// The consumer core's own cost per message, without a broker: idem::Consumer over a synthetic
// Broker that hands out copies of pre-generated messages (as an adapter copies what its client
// library delivered), against the same Poll + Acknowledge loop with no deduplication (the
// baseline: what a plain consumer of that broker would do with the messages).
//
//   BM_Baseline_PollAck              Poll a batch, Acknowledge all of it.
//   BM_Consumer/memory/pipeline:P    idem::Consumer + MemoryStore, no-op handler.
//   BM_Consumer/log_none/pipeline:P  idem::Consumer + log store, sync=none (its CPU, no disk
//                                    wait).
//
// Every run consumes the same kMessages messages (100-byte payload, a 32-hex-character key in
// the Idempotency-Key header, 4 partitions, batch 256) with a fresh store, so ns_per_message is
// comparable between rows: the difference to the baseline is what the core and the store add
// to each message. The broker benchmarks (bench/kafka, bench/redis_streams, bench/nats) measure
// the same thing end to end, where the broker's own noise hides it.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "idem/consumer.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"

namespace {

constexpr std::size_t kMessages = 200'000;
constexpr std::size_t kBatch = 256;
constexpr int kPartitions = 4;

// The messages, generated once.
const std::vector<idem::BrokerMessage>& Pool() {
  static const std::vector<idem::BrokerMessage> pool = [] {
    std::vector<idem::BrokerMessage> v;
    v.reserve(kMessages);
    std::mt19937_64 rng(42);
    static const char kHex[] = "0123456789abcdef";
    std::vector<std::uint64_t> offsets(kPartitions, 0);
    for (std::size_t i = 0; i < kMessages; ++i) {
      std::string key(32, '0');
      for (char& c : key) c = kHex[rng() & 15];
      const int p = static_cast<int>(i % kPartitions);
      idem::BrokerMessage m;
      m.partition = "bench-topic/" + std::to_string(p);
      m.position = std::to_string(offsets[static_cast<std::size_t>(p)]++);
      m.payload = std::string(100, 'x');
      m.headers = {{"Idempotency-Key", std::move(key)}};
      m.handle = i;
      v.push_back(std::move(m));
    }
    return v;
  }();
  return pool;
}

// Hands out copies of the pool's messages in order; Acknowledge counts them.
class SyntheticBroker : public idem::Broker {
 public:
  std::string_view Name() const override { return "synthetic"; }
  idem::Result<std::vector<idem::BrokerMessage>> Poll(std::size_t max,
                                                      std::chrono::milliseconds) override {
    const auto& pool = Pool();
    std::vector<idem::BrokerMessage> batch;
    const std::size_t n = std::min(max, pool.size() - next_);
    batch.reserve(n);
    for (std::size_t i = 0; i < n; ++i) batch.push_back(pool[next_ + i]);
    next_ += n;
    return batch;
  }
  idem::Status Acknowledge(std::span<const idem::BrokerMessage* const> messages) override {
    for (const idem::BrokerMessage* m : messages) checksum_ += m->handle;
    acknowledged_ += messages.size();
    return idem::OkStatus();
  }
  idem::Status Redeliver(std::span<const idem::BrokerMessage* const>,
                         std::chrono::milliseconds) override {
    return idem::UnavailableError("synthetic broker: no redelivery");
  }
  idem::Status DeadLetter(const idem::BrokerMessage&, const idem::DeadLetterInfo&) override {
    return idem::UnavailableError("synthetic broker: no dead-letter channel");
  }
  idem::Status Health() override { return idem::OkStatus(); }

  std::size_t acknowledged() const { return acknowledged_; }
  bool drained() const { return next_ == Pool().size(); }

 private:
  std::size_t next_ = 0;
  std::size_t acknowledged_ = 0;
  std::uint64_t checksum_ = 0;
};

void Report(benchmark::State& state, std::chrono::steady_clock::duration busy) {
  const double ns = std::chrono::duration<double, std::nano>(busy).count();
  state.counters["ns_per_message"] =
      benchmark::Counter(ns / static_cast<double>(kMessages * state.iterations()));
  state.counters["messages_per_s"] =
      benchmark::Counter(static_cast<double>(kMessages * state.iterations()) / (ns / 1e9));
}

void BM_Baseline_PollAck(benchmark::State& state) {
  (void)Pool();
  std::chrono::steady_clock::duration busy{};
  for (auto _ : state) {
    SyntheticBroker broker;
    std::vector<const idem::BrokerMessage*> settled;
    const auto start = std::chrono::steady_clock::now();
    while (!broker.drained()) {
      auto batch = broker.Poll(kBatch, std::chrono::milliseconds(0));
      settled.clear();
      for (const auto& m : *batch) settled.push_back(&m);
      (void)broker.Acknowledge(settled);
    }
    busy += std::chrono::steady_clock::now() - start;
    if (broker.acknowledged() != kMessages) state.SkipWithError("baseline lost messages");
  }
  Report(state, busy);
}
BENCHMARK(BM_Baseline_PollAck)->Unit(benchmark::kMillisecond)->Iterations(5);

enum StoreKind { kMemory = 0, kLogNone = 1 };

void BM_Consumer(benchmark::State& state) {
  (void)Pool();
  const auto kind = static_cast<StoreKind>(state.range(0));
  const bool pipeline = state.range(1) != 0;
  std::chrono::steady_clock::duration busy{};
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<idem::Store> store;
    std::filesystem::path dir;
    if (kind == kMemory) {
      store = idem::NewMemoryStore();
    } else {
      dir = std::filesystem::temp_directory_path() /
            ("idem-consumer-core-bench-" + std::to_string(::getpid()));
      std::filesystem::remove_all(dir);
      idem::LogStoreOptions options;
      options.dir = dir.string();
      options.sync = idem::SyncMode::kNone;
      auto opened = idem::OpenLogStore(options);
      if (!opened) {
        state.SkipWithError(opened.error().ToString().c_str());
        return;
      }
      store = std::move(*opened);
    }
    SyntheticBroker broker;
    std::size_t executed = 0;
    auto handler = [&](const idem::HandlerContext&, const idem::BrokerMessage&) {
      ++executed;
      return idem::HandlerVerdict{};
    };
    {
      idem::Consumer consumer(*store, broker, handler,
                              {.scope = "bench", .batch_size = kBatch, .pipeline = pipeline});
      state.ResumeTiming();
      const auto start = std::chrono::steady_clock::now();
      while (!broker.drained()) {
        auto r = consumer.RunOnce();
        if (!r) {
          state.SkipWithError(r.error().ToString().c_str());
          return;
        }
      }
      if (!consumer.Flush().ok()) state.SkipWithError("flush failed");
      busy += std::chrono::steady_clock::now() - start;
      state.PauseTiming();
    }
    if (executed != kMessages || broker.acknowledged() != kMessages) {
      state.SkipWithError("the consumer did not settle every message once");
    }
    store.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
    state.ResumeTiming();
  }
  Report(state, busy);
}
BENCHMARK(BM_Consumer)
    ->ArgNames({"store", "pipeline"})
    ->Args({kMemory, 0})
    ->Args({kMemory, 1})
    ->Args({kLogNone, 0})
    ->Args({kLogNone, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
