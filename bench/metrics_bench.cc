// Hot-path metric updates against their peer: one std::atomic<uint64_t> that every thread
// fetch_adds (what a naive counter does). Single-threaded the peer is the floor; with
// ->Threads(2) it shows the cache-line bouncing that striping avoids.
//
// Link with benchmark::benchmark_main.
#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "idem/metrics.h"

namespace {

idem::Registry& BenchRegistry() {
  static idem::Registry registry;
  return registry;
}

// Peer: one shared atomic, relaxed fetch_add.
void BM_SharedAtomicFetchAdd(benchmark::State& state) {
  static std::atomic<std::uint64_t> shared{0};
  for (auto _ : state) shared.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_SharedAtomicFetchAdd)->Threads(1)->Threads(2);

// Counter::Inc on one counter shared by all threads (compare: BM_SharedAtomicFetchAdd).
void BM_CounterInc(benchmark::State& state) {
  static idem::Counter& counter =
      BenchRegistry().AddCounter("bench_total", "Bench.", {{"scope", "bench"}});
  for (auto _ : state) counter.Inc();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CounterInc)->Threads(1)->Threads(2);

// Histogram::Observe with the default latency buckets, values spread over them (compare:
// BM_SharedAtomicFetchAdd, a single add; Observe does a bucket search and two adds).
void BM_HistogramObserve(benchmark::State& state) {
  static idem::Histogram& histogram =
      BenchRegistry().AddHistogram("bench_seconds", "Bench.", {{"scope", "bench"}});
  constexpr std::array<double, 8> kValues = {2e-5, 3e-4, 1.2e-3, 4e-3, 0.02, 0.07, 0.3, 3};
  std::size_t i = 0;
  for (auto _ : state) {
    histogram.Observe(kValues[i]);
    i = (i + 1) % kValues.size();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HistogramObserve)->Threads(1)->Threads(2);

}  // namespace

BENCHMARK_MAIN();
