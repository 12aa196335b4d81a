// Throughput of the PostgreSQL store's full cycle (begin -> complete with a 100-byte response),
// one call at a time or in batches, from N threads for a fixed time. bench/postgres/run.sh runs it
// next to pgbench doing the same writes by hand (INSERT ... ON CONFLICT DO NOTHING, then UPDATE,
// as two transactions per key) and reports the ratio.
//
//   postgres_store_bench URL [--threads 32] [--seconds 20] [--warmup 2] [--batch 0|N]
//
// URL is a postgres:// store URL whose schema exists (idem store init). Keys are 32 random hex
// digits. Prints one line: "keys/s <rate> ..." plus the answers that were not Acquired/Applied.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/stores/postgres.h"

namespace {

std::string HexKey(std::mt19937_64& rng) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string k(32, '0');
  std::uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) {
    k[static_cast<std::size_t>(i)] = kHex[(a >> (4 * i)) & 15];
    k[static_cast<std::size_t>(16 + i)] = kHex[(b >> (4 * i)) & 15];
  }
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [--threads N] [--seconds S] [--warmup S] [--batch N]\n",
                 argv[0]);
    return 2;
  }
  int threads = 32;
  int seconds = 20;
  int warmup = 2;
  int batch = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--threads") threads = v;
    if (flag == "--seconds") seconds = v;
    if (flag == "--warmup") warmup = v;
    if (flag == "--batch") batch = v;
  }
  auto options = idem::ParsePostgresStoreUrl(argv[1]);
  if (!options) {
    std::fprintf(stderr, "%s\n", options.error().ToString().c_str());
    return 2;
  }
  auto store = idem::OpenPostgresStore(*options);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.error().ToString().c_str());
    return 1;
  }
  const std::string response(100, 'r');
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<std::uint64_t> done{0}, failed{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(
          0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(t + 1) ^
          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
      idem::Store& s = **store;
      std::vector<std::string> keys(static_cast<std::size_t>(std::max(batch, 1)));
      std::vector<idem::BeginRequest> begins(keys.size());
      std::vector<idem::CompleteRequest> completes(keys.size());
      while (!stop.load(std::memory_order_relaxed)) {
        std::uint64_t ok = 0, bad = 0;
        if (batch == 0) {
          keys[0] = HexKey(rng);
          auto b = s.Begin({.scope = "bench", .key = keys[0]});
          const auto* a = b ? std::get_if<idem::Acquired>(&*b) : nullptr;
          if (a == nullptr) {
            ++bad;
          } else {
            auto c = s.Complete(
                {.scope = "bench", .key = keys[0], .token = a->token, .response = response});
            (c && *c == idem::WriteAnswer::kApplied) ? ++ok : ++bad;
          }
        } else {
          for (std::size_t i = 0; i < keys.size(); ++i) {
            keys[i] = HexKey(rng);
            begins[i] = {.scope = "bench", .key = keys[i]};
          }
          auto got = s.BeginBatch(begins);
          std::size_t n = 0;
          for (std::size_t i = 0; i < got.size(); ++i) {
            const auto* a = got[i] ? std::get_if<idem::Acquired>(&*got[i]) : nullptr;
            if (a == nullptr) {
              ++bad;
              continue;
            }
            completes[n++] = {
                .scope = "bench", .key = keys[i], .token = a->token, .response = response};
          }
          for (const auto& c : s.CompleteBatch({completes.data(), n})) {
            (c && *c == idem::WriteAnswer::kApplied) ? ++ok : ++bad;
          }
        }
        if (measuring.load(std::memory_order_relaxed)) {
          done.fetch_add(ok, std::memory_order_relaxed);
          failed.fetch_add(bad, std::memory_order_relaxed);
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(warmup));
  measuring.store(true);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  measuring.store(false);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop.store(true);
  for (std::thread& w : workers) w.join();
  std::printf("keys/s %.0f  (%llu keys in %.1f s, %d threads, %s, pool_size %zu, %llu failed)\n",
              static_cast<double>(done.load()) / elapsed,
              static_cast<unsigned long long>(done.load()), elapsed, threads,
              batch == 0 ? "one call at a time" : ("batches of " + std::to_string(batch)).c_str(),
              options->pool_size, static_cast<unsigned long long>(failed.load()));
  return failed.load() == 0 ? 0 : 1;
}
