// The memory store against the least a key-dedup table can be: an absl::flat_hash_map from
// the 16 bytes a 32-hex-character key decodes to, to a one-byte state (the baseline). Both
// see the same pre-generated keys, one pass each (Iterations(1)), so runs are comparable.
//
//   BM_Baseline_InsertUpdate  try_emplace(reserved) then find -> completed, every key once.
//   BM_Baseline_InsertUpdateOwnMaps/threads:N  the same with a map per thread, each thread
//                             its share of the keys: nothing shared, so threads:2 against
//                             threads:1 bounds from above how far this machine scales the work
//                             (each map is also half the size). Context for the 2-thread
//                             target, not a target.
//   BM_Store_BeginComplete    Begin (new key) then Complete, every key once; /threads:2 splits
//                             the keys in two disjoint halves.
//   BM_Baseline_Find          find on a full map, keys in random order.
//   BM_Store_Replay           Begin on a full store of completed keys -> Replay, random order.
//   BM_Store_ReplayBatch16    the same through BeginBatch, 16 requests a call.
//   BM_Baseline_*WithClock    the baselines plus one Clock::System().Now() per operation:
//                             context, not a target (see below).
//
// Memory: bytes_per_record is the growth of the resident set (/proc/self/statm) over the
// records, measured after the pass. Targets (docs): store rate >= baseline rate, 2 threads >=
// 1.7x one thread, replay >= baseline find, <= 64 bytes per completed record.
//
// IDEM_BENCH_KEYS sets the number of keys (default 10,000,000).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "idem/clock.h"
#include "idem/stores/memory.h"

namespace {

constexpr std::size_t kKeyChars = 32;

std::size_t NumKeys() {
  const char* env = std::getenv("IDEM_BENCH_KEYS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 10'000'000;
}

// N random 32-hex-character keys in one buffer, and a random order to look them up in.
struct Keys {
  std::string chars;
  std::vector<std::uint32_t> random_order;
  std::size_t size() const { return chars.size() / kKeyChars; }
  std::string_view operator[](std::size_t i) const {
    return std::string_view(chars.data() + i * kKeyChars, kKeyChars);
  }
};

const Keys& TheKeys() {
  static const Keys keys = [] {
    Keys k;
    const std::size_t n = NumKeys();
    std::mt19937_64 rng(42);
    k.chars.resize(n * kKeyChars);
    for (std::size_t i = 0; i < k.chars.size(); i += 16) {
      std::uint64_t r = rng();
      for (std::size_t j = 0; j < 16; ++j, r >>= 4) k.chars[i + j] = "0123456789abcdef"[r & 15];
    }
    k.random_order.resize(n);
    for (auto& i : k.random_order) i = static_cast<std::uint32_t>(rng() % n);
    return k;
  }();
  return keys;
}

std::int64_t ResidentBytes() {
  long pages = 0;
  long resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE);
}

// ---- the baseline ----

struct Key16 {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  friend bool operator==(const Key16&, const Key16&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Key16& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
};

enum class State : std::uint8_t { kReserved = 1, kCompleted = 2 };
struct Value {
  State state;
};
using BaselineMap = absl::flat_hash_map<Key16, Value>;

inline std::uint64_t Nibble(char c) {
  return static_cast<std::uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
}

inline Key16 DecodeHex(std::string_view hex) {
  Key16 k;
  for (std::size_t i = 0; i < 16; ++i) k.hi = (k.hi << 4) | Nibble(hex[i]);
  for (std::size_t i = 16; i < 32; ++i) k.lo = (k.lo << 4) | Nibble(hex[i]);
  return k;
}

// The baseline's cycle for keys [from, to): insert as reserved, then find and complete.
void InsertUpdate(BaselineMap& map, const Keys& keys, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    const Key16 k = DecodeHex(keys[i]);
    map.try_emplace(k, Value{State::kReserved});
    map.find(k)->second.state = State::kCompleted;
  }
}

void BM_Baseline_InsertUpdate(benchmark::State& state) {
  const Keys& keys = TheKeys();
  for (auto _ : state) {
    state.PauseTiming();
    const std::int64_t before = ResidentBytes();
    auto map = std::make_unique<BaselineMap>();
    state.ResumeTiming();
    InsertUpdate(*map, keys, 0, keys.size());
    state.PauseTiming();
    state.counters["bytes_per_record"] =
        static_cast<double>(ResidentBytes() - before) / static_cast<double>(keys.size());
    map.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(keys.size()));
}

void BM_Baseline_InsertUpdateOwnMaps(benchmark::State& state) {
  const Keys& keys = TheKeys();
  const std::size_t per_thread = keys.size() / static_cast<std::size_t>(state.threads());
  const std::size_t from = per_thread * static_cast<std::size_t>(state.thread_index());
  for (auto _ : state) {
    BaselineMap map;
    InsertUpdate(map, keys, from, from + per_thread);
    benchmark::DoNotOptimize(map.size());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(per_thread));
}

// The same pass, reading the system clock once per operation, as anything that expires
// records must (Begin and Complete each read it once). Not a target: it shows what a clock
// read costs here, since reading the TSC waits for earlier loads and so stops independent
// lookups from overlapping.
void BM_Baseline_InsertUpdateWithClock(benchmark::State& state) {
  const Keys& keys = TheKeys();
  const idem::Clock& clock = idem::Clock::System();
  std::int64_t sum = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto map = std::make_unique<BaselineMap>();
    state.ResumeTiming();
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const Key16 k = DecodeHex(keys[i]);
      sum += clock.Now().time_since_epoch().count();
      map->try_emplace(k, Value{State::kReserved});
      sum += clock.Now().time_since_epoch().count();
      map->find(k)->second.state = State::kCompleted;
    }
    state.PauseTiming();
    map.reset();
    state.ResumeTiming();
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<std::int64_t>(keys.size()));
}

void BM_Baseline_Find(benchmark::State& state) {
  const Keys& keys = TheKeys();
  BaselineMap map;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    map.try_emplace(DecodeHex(keys[i]), Value{State::kCompleted});
  }
  std::size_t found = 0;
  for (auto _ : state) {
    for (std::uint32_t i : keys.random_order) {
      const auto it = map.find(DecodeHex(keys[i]));
      found += it != map.end() && it->second.state == State::kCompleted;
    }
  }
  if (found != keys.size()) state.SkipWithError("a key was not found");
  state.SetItemsProcessed(static_cast<std::int64_t>(keys.size()));
}

void BM_Baseline_FindWithClock(benchmark::State& state) {
  const Keys& keys = TheKeys();
  const idem::Clock& clock = idem::Clock::System();
  BaselineMap map;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    map.try_emplace(DecodeHex(keys[i]), Value{State::kCompleted});
  }
  std::size_t found = 0;
  std::int64_t sum = 0;
  for (auto _ : state) {
    for (std::uint32_t i : keys.random_order) {
      const Key16 k = DecodeHex(keys[i]);
      sum += clock.Now().time_since_epoch().count();
      const auto it = map.find(k);
      found += it != map.end() && it->second.state == State::kCompleted;
    }
  }
  benchmark::DoNotOptimize(sum);
  if (found != keys.size()) state.SkipWithError("a key was not found");
  state.SetItemsProcessed(static_cast<std::int64_t>(keys.size()));
}

// ---- the memory store ----

std::unique_ptr<idem::Store> NewStore() {
  idem::MemoryStoreOptions o;
  o.reclaim_interval = std::chrono::milliseconds(0);  // nothing expires during a run
  return idem::NewMemoryStore(o);
}

// Begin then Complete for keys [from, to); false on any unexpected answer.
bool FillStore(idem::Store& store, const Keys& keys, std::size_t from, std::size_t to,
               std::string_view response) {
  for (std::size_t i = from; i < to; ++i) {
    idem::BeginRequest b;
    b.key = keys[i];
    idem::Result<idem::BeginAnswer> a = store.Begin(b);
    if (!a.has_value() || !std::holds_alternative<idem::Acquired>(*a)) return false;
    idem::CompleteRequest c;
    c.key = keys[i];
    c.token = std::get<idem::Acquired>(*a).token;
    c.response = response;
    idem::Result<idem::WriteAnswer> w = store.Complete(c);
    if (!w.has_value() || *w != idem::WriteAnswer::kApplied) return false;
  }
  return true;
}

std::unique_ptr<idem::Store> g_store;
std::int64_t g_resident_before = 0;

void StoreBeginComplete(benchmark::State& state, std::string_view response) {
  const Keys& keys = TheKeys();
  const std::size_t per_thread = keys.size() / static_cast<std::size_t>(state.threads());
  const std::size_t from = per_thread * static_cast<std::size_t>(state.thread_index());
  if (state.thread_index() == 0) {
    g_resident_before = ResidentBytes();
    g_store = NewStore();
  }
  bool ok = true;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) ok = FillStore(*g_store, keys, from, from + per_thread, response);
  if (!ok) state.SkipWithError("unexpected answer");
  if (state.thread_index() == 0) {
    // Wall time from before the opening barrier to after the closing one: a cross-check of
    // items_per_second for the threaded runs.
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start;
    state.counters["wall_items_per_second"] =
        static_cast<double>(per_thread * static_cast<std::size_t>(state.threads())) / wall.count();
    state.counters["bytes_per_record"] =
        static_cast<double>(ResidentBytes() - g_resident_before) /
        static_cast<double>(per_thread * static_cast<std::size_t>(state.threads()));
    g_store.reset();  // after the loop's closing barrier: the other thread is done with it
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(per_thread));
}

void BM_Store_BeginComplete(benchmark::State& state) { StoreBeginComplete(state, {}); }

void BM_Store_BeginCompleteResponse100(benchmark::State& state) {
  StoreBeginComplete(state, std::string(100, 'r'));
}

void BM_Store_Replay(benchmark::State& state) {
  const Keys& keys = TheKeys();
  auto store = NewStore();
  if (!FillStore(*store, keys, 0, keys.size(), {})) state.SkipWithError("fill failed");
  std::size_t replays = 0;
  for (auto _ : state) {
    for (std::uint32_t i : keys.random_order) {
      idem::BeginRequest b;
      b.key = keys[i];
      idem::Result<idem::BeginAnswer> a = store->Begin(b);
      replays += a.has_value() && std::holds_alternative<idem::Replay>(*a);
    }
  }
  if (replays != keys.size()) state.SkipWithError("a Begin did not replay");
  state.SetItemsProcessed(static_cast<std::int64_t>(keys.size()));
}

void BM_Store_ReplayBatch16(benchmark::State& state) {
  constexpr std::size_t kBatch = 16;
  const Keys& keys = TheKeys();
  auto store = NewStore();
  if (!FillStore(*store, keys, 0, keys.size(), {})) state.SkipWithError("fill failed");
  std::size_t replays = 0;
  std::vector<idem::BeginRequest> batch(kBatch);
  for (auto _ : state) {
    for (std::size_t i = 0; i + kBatch <= keys.random_order.size(); i += kBatch) {
      for (std::size_t j = 0; j < kBatch; ++j) batch[j].key = keys[keys.random_order[i + j]];
      for (const auto& a : store->BeginBatch(batch)) {
        replays += a.has_value() && std::holds_alternative<idem::Replay>(*a);
      }
    }
  }
  if (replays != keys.size() / kBatch * kBatch) state.SkipWithError("a Begin did not replay");
  state.SetItemsProcessed(static_cast<std::int64_t>(keys.size() / kBatch * kBatch));
}

BENCHMARK(BM_Baseline_InsertUpdate)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Baseline_InsertUpdateWithClock)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Store_BeginComplete)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Threads(1);
BENCHMARK(BM_Store_BeginComplete)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Threads(2);
BENCHMARK(BM_Store_BeginCompleteResponse100)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Baseline_Find)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Baseline_FindWithClock)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Store_Replay)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Store_ReplayBatch16)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
// Last: after its two threads' maps, the replay rows above ran at less than half their rate
// (seen twice; the heap or the huge pages those threads leave behind).
BENCHMARK(BM_Baseline_InsertUpdateOwnMaps)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->Threads(1)
    ->Threads(2);

}  // namespace

BENCHMARK_MAIN();
