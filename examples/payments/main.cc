// An at-least-once payment stream through idem's receiver on the embedded log store (the
// default; `--store memory:` for the memory store).
//
// A "broker" delivers every payment at least once: producers publish some payments twice,
// consumers crash after storing an outcome but before acknowledging (so the broker redelivers),
// and some consumers crash in the middle of a handler before charging (so the key's lease runs
// out and another consumer takes over). The ledger counts how often each payment was applied.
// The program prints what happened and exits 1 unless every payment was applied exactly once.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/metrics.h"
#include "idem/receiver.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"

namespace {

struct Delivery {
  std::string payment_id;
  std::string body;
};

// An at-least-once queue: an unacknowledged delivery goes back to the end of the queue.
class Broker {
 public:
  void Publish(Delivery d) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(d));
    ++published_;
  }
  bool Poll(Delivery* out) {
    std::lock_guard lock(mu_);
    if (queue_.empty()) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    ++deliveries_;
    ++in_flight_;
    return true;
  }
  void Ack() {
    std::lock_guard lock(mu_);
    --in_flight_;
  }
  void Redeliver(Delivery d) {
    std::lock_guard lock(mu_);
    --in_flight_;
    queue_.push_back(std::move(d));
  }
  // Nothing queued and nothing being processed: every delivery was acknowledged.
  bool Drained() {
    std::lock_guard lock(mu_);
    return queue_.empty() && in_flight_ == 0;
  }
  std::uint64_t deliveries() {
    std::lock_guard lock(mu_);
    return deliveries_;
  }
  std::uint64_t published() {
    std::lock_guard lock(mu_);
    return published_;
  }

 private:
  std::mutex mu_;
  std::deque<Delivery> queue_;
  std::uint64_t deliveries_ = 0;
  std::uint64_t published_ = 0;
  std::uint64_t in_flight_ = 0;
};

std::string Flag(int argc, char** argv, std::string_view name, std::string fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (name == argv[i]) return argv[i + 1];
  }
  return fallback;
}

// "memory:" or "log:DIR[?sync=...]".
idem::Result<std::unique_ptr<idem::Store>> OpenStore(const std::string& url) {
  if (url == "memory:") return idem::NewMemoryStore();
  auto options = idem::ParseLogStoreUrl(url);
  if (!options) return options.error();
  return idem::OpenLogStore(*options);
}

}  // namespace

int main(int argc, char** argv) {
  const int payments = std::atoi(Flag(argc, argv, "--payments", "10000").c_str());
  const int consumers = std::atoi(Flag(argc, argv, "--consumers", "4").c_str());
  // By default a fresh log store in a new temporary directory, so every run starts empty.
  std::string url = Flag(argc, argv, "--store", "");
  if (url.empty()) {
    char dir[] = "/tmp/idem-payments-XXXXXX";
    if (::mkdtemp(dir) == nullptr) {
      std::perror("mkdtemp");
      return 2;
    }
    url = std::string("log:") + dir;
  }
  using std::chrono::milliseconds;

  auto opened = OpenStore(url);
  if (!opened) {
    std::fprintf(stderr, "cannot open store %s: %s\n", url.c_str(),
                 opened.error().ToString().c_str());
    return 2;
  }
  std::unique_ptr<idem::Store> store = std::move(*opened);
  std::printf("store:                         %s\n", url.c_str());
  idem::Registry registry;
  idem::Metrics metrics(registry, "payments");
  idem::ReceiverOptions options;
  options.scope = "payments";
  // Short, so crashed consumers are taken over quickly, but well above a handler's time plus
  // a durable store's sync: a live consumer must never lose its lease (see docs/semantics.md).
  options.lease = milliseconds(std::atoi(Flag(argc, argv, "--lease-ms", "250").c_str()));
  options.fingerprint = idem::FingerprintMode::kJson;
  options.metrics = &metrics;
  idem::Receiver receiver(*store, options);

  Broker broker;
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> cents(100, 99999);
  for (int i = 0; i < payments; ++i) {
    std::string id = "pay-" + std::to_string(i);
    std::string body = R"({"payment_id":")" + id + R"(","amount_cents":)" +
                       std::to_string(cents(rng)) + R"(,"currency":"EUR"})";
    broker.Publish({id, body});
    if (rng() % 5 == 0) broker.Publish({id, body});  // the producer retried: a duplicate
  }

  std::vector<std::atomic<int>> applied(payments);
  std::atomic<long long> charges{0};  // ledger entries
  std::atomic<std::uint64_t> replays{0}, busy{0}, ack_crashes{0}, handler_crashes{0};

  auto consume = [&](int worker) {
    std::mt19937_64 local(static_cast<std::uint64_t>(worker) * 7919 + 1);
    idem::Handler charge = [&](const idem::HandlerContext& c) -> idem::HandlerResult {
      int n = std::stoi(std::string(c.key.substr(4)));
      applied[n].fetch_add(1);
      charges.fetch_add(1);
      return {idem::Outcome::kSuccess, "charged " + std::string(c.key)};
    };
    Delivery d;
    while (!broker.Drained()) {
      if (!broker.Poll(&d)) {
        std::this_thread::sleep_for(milliseconds(1));
        continue;
      }
      if (local() % 50 == 0) {
        // The consumer dies inside the handler, before charging: the key was reserved but no
        // outcome is stored, so it stays IN_PROGRESS until its lease runs out and another
        // consumer takes over (attempt 2). Simulated by reserving the key and walking away.
        auto a = store->Begin(
            {"payments", d.payment_id, idem::FingerprintJson(d.body).value(), options.lease});
        if (a && std::holds_alternative<idem::Acquired>(*a)) handler_crashes.fetch_add(1);
        broker.Redeliver(std::move(d));
        continue;
      }
      auto r = receiver.Receive({.key = d.payment_id, .payload = d.body}, charge);
      if (!r) {
        std::fprintf(stderr, "receive failed: %s\n", r.error().ToString().c_str());
        broker.Redeliver(std::move(d));
        continue;
      }
      switch (r->delivery) {
        case idem::Delivery::kBusy:  // someone holds it: not acknowledged, comes back later
          busy.fetch_add(1);
          broker.Redeliver(std::move(d));
          continue;
        case idem::Delivery::kReplayed:
        case idem::Delivery::kCoalesced:
          replays.fetch_add(1);
          break;
        default:
          break;
      }
      if (local() % 20 == 0) {  // crashed after the outcome was stored, before the ack
        ack_crashes.fetch_add(1);
        broker.Redeliver(std::move(d));
        continue;
      }
      broker.Ack();
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < consumers; ++w) threads.emplace_back(consume, w);
  for (auto& t : threads) t.join();

  int once = 0, twice_or_more = 0, never = 0;
  for (auto& a : applied) {
    int n = a.load();
    once += n == 1;
    twice_or_more += n > 1;
    never += n == 0;
  }
  std::printf("payments published:            %d (+%llu producer duplicates)\n", payments,
              static_cast<unsigned long long>(broker.published() - payments));
  std::printf("deliveries to consumers:       %llu\n",
              static_cast<unsigned long long>(broker.deliveries()));
  std::printf("consumer crashes before ack:   %llu (redelivered)\n",
              static_cast<unsigned long long>(ack_crashes.load()));
  std::printf("consumer crashes in handler:   %llu (taken over after the lease)\n",
              static_cast<unsigned long long>(handler_crashes.load()));
  std::printf("duplicates suppressed:         %llu replayed + %llu busy (redelivered later)\n",
              static_cast<unsigned long long>(replays.load()),
              static_cast<unsigned long long>(busy.load()));
  std::printf("lease takeovers:               %llu\n",
              static_cast<unsigned long long>(metrics.takeovers->Value()));
  std::printf("payments applied exactly once: %d of %d (twice or more: %d, never: %d)\n", once,
              payments, twice_or_more, never);
  bool ok = once == payments && charges.load() == payments;
  std::printf("%s\n", ok ? "OK: every payment was applied exactly once"
                         : "FAILED: the ledger does not match the payments");
  return ok ? 0 : 1;
}
