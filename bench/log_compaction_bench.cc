// How long compaction stops callers of the log store: a store of IDEM_BENCH_COMPACT_KEYS
// (default 2 M) completed records, one caller doing Begin/Complete cycles without pause while
// the store compacts (Purge() forces it). Reports the caller's worst and 99.9th percentile
// cycle time during compaction next to the same caller with no compaction running (the peer).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "idem/stores/log.h"

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::size_t Keys() {
  const char* env = std::getenv("IDEM_BENCH_COMPACT_KEYS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 2'000'000;
}

std::string Key(std::size_t i) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016zx%016zx", i * 0x9E3779B97F4A7C15u, i);
  return buf;
}

struct Latencies {
  std::vector<double> us;
  double Percentile(double p) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1,
                       static_cast<std::size_t>(p * static_cast<double>(us.size())))];
  }
};

// Cycles new keys until `stop`, recording each cycle's time.
Latencies Caller(idem::Store& store, std::atomic<bool>& stop, std::size_t first_key) {
  Latencies l;
  for (std::size_t i = first_key; !stop.load(std::memory_order_relaxed); ++i) {
    const std::string key = Key(i);
    auto t0 = Clock::now();
    auto a = store.Begin({"bench", key, std::nullopt, milliseconds(60'000)});
    if (a && std::holds_alternative<idem::Acquired>(*a)) {
      (void)store.Complete({"bench",
                            key,
                            std::get<idem::Acquired>(*a).token,
                            idem::Outcome::kSuccess,
                            {},
                            milliseconds(3'600'000)});
    }
    l.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return l;
}

void BM_CompactionPause(benchmark::State& state) {
  const bool compact = state.range(0) != 0;
  const std::string dir = "/tmp/idem-bench-compact";
  std::filesystem::remove_all(dir);
  idem::LogStoreOptions o;
  o.dir = dir;
  o.sync = idem::SyncMode::kNone;  // the pause is compaction's, not the disk's
  o.compact_ratio = 0;             // only Purge() compacts
  auto store = idem::OpenLogStore(o);
  if (!store) {
    state.SkipWithError(store.error().ToString().c_str());
    return;
  }
  const std::size_t n = Keys();
  for (std::size_t i = 0; i < n; ++i) {
    auto a = (*store)->Begin({"bench", Key(i), std::nullopt, milliseconds(60'000)});
    (void)(*store)->Complete({"bench",
                              Key(i),
                              std::get<idem::Acquired>(*a).token,
                              idem::Outcome::kSuccess,
                              {},
                              milliseconds(3'600'000)});
  }
  double seconds = 0;
  Latencies l;
  for (auto _ : state) {
    std::atomic<bool> stop{false};
    std::thread caller([&] { l = Caller(**store, stop, n); });
    auto t0 = Clock::now();
    if (compact) {
      auto p = (*store)->Purge();
      if (!p) state.SkipWithError(p.error().ToString().c_str());
    } else {
      std::this_thread::sleep_for(milliseconds(1500));
    }
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    stop = true;
    caller.join();
  }
  state.counters["records"] = static_cast<double>(n);
  state.counters["compaction_s"] = compact ? seconds : 0;
  state.counters["caller_cycles"] = static_cast<double>(l.us.size());
  state.counters["p50_us"] = l.Percentile(0.5);
  state.counters["p999_us"] = l.Percentile(0.999);
  state.counters["max_us"] = l.Percentile(1.0);
  store->reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_CompactionPause)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
