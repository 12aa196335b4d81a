// The consumer core (include/idem/consumer.h): one poll-begin-handle-complete-acknowledge round
// over any Broker, with per-partition order, retries, Busy waits and the dead-letter channel.
#include "idem/consumer.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>

#include <utility>
#include <vector>
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "core/lease_keeper.h"
#include "core/receiver_parts.h"

namespace idem {

using std::chrono::milliseconds;

std::string_view VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kSuccess:
      return "success";
    case Verdict::kRetryable:
      return "retryable";
    case Verdict::kPermanent:
      return "permanent";
  }
  return "unknown";
}

std::vector<std::pair<std::string, std::string>> DeadLetterHeaders(const BrokerMessage& message,
                                                                   const DeadLetterInfo& info) {
  auto headers = message.headers;
  headers.emplace_back(kDlqReasonHeader, info.reason);
  headers.emplace_back(kDlqAttemptsHeader, std::to_string(info.attempts));
  headers.emplace_back(kDlqErrorHeader, info.last_error);
  headers.emplace_back(kDlqKeyHeader, info.key);
  headers.emplace_back(kDlqSourceHeader, message.partition + "@" + message.position);
  return headers;
}

Status Broker::Touch(std::span<const BrokerMessage* const>) { return OkStatus(); }

Status Broker::Settle() { return OkStatus(); }

namespace {

// The consumer's own counters, next to the standard idem_* metrics of its scope.
struct ConsumerMetrics {
  ConsumerMetrics(Registry& r, const std::string& name) {
    auto messages = [&](std::string_view result) {
      return &r.AddCounter("idem_consumer_messages_total",
                           "Messages a consumer settled or handed back, by result",
                           {{"consumer", name}, {"result", std::string(result)}});
    };
    received = &r.AddCounter("idem_consumer_received_total", "Messages polled from the broker",
                             {{"consumer", name}});
    executed = messages("executed");
    replayed = messages("replayed");
    dead_lettered = messages("dead_lettered");
    redelivered = messages("redelivered");
    poison = &r.AddCounter("idem_consumer_poison_total",
                           "Messages dead-lettered because they had no usable key or payload",
                           {{"consumer", name}});
    retries = &r.AddCounter("idem_consumer_retries_total", "Handler runs after a retryable failure",
                            {{"consumer", name}});
    broker_errors = &r.AddCounter("idem_consumer_broker_errors_total",
                                  "Failed poll, acknowledge, redeliver or dead-letter calls",
                                  {{"consumer", name}});
    batches = &r.AddCounter("idem_consumer_batches_total", "Non-empty batches processed",
                            {{"consumer", name}});
  }
  Counter* received;
  Counter* executed;
  Counter* replayed;
  Counter* dead_lettered;
  Counter* redelivered;
  Counter* poison;
  Counter* retries;
  Counter* broker_errors;
  Counter* batches;
};

// What happened to one message of a batch.
enum class Fate : std::uint8_t {
  kOpen,        // not decided yet
  kSettled,     // may be acknowledged (once its completion, if any, is stored)
  kHandedBack,  // must be delivered again
  kReturned,    // already handed back with the previous batch's messages of its partition
};

struct Item {
  const BrokerMessage* message = nullptr;
  // A view into the message's header, or into key_storage when the key had to be made (a
  // JSON pointer's text, a fingerprint): an Item is never moved once classified.
  std::string_view key{};
  std::string key_storage{};
  std::uint32_t partition = 0;  // index into its Round's partitions
  std::optional<Fingerprint> fingerprint{};
  std::string poison_reason{};  // non-empty: dead-letter without a key
  std::string poison_error{};
  int first = -1;                      // index of the earlier item of this batch with the same key
  bool conflict = false;               // ... whose fingerprint differs from this one's
  int begin_index = -1;                // into the batch's begin requests and answers
  std::optional<Acquired> acquired{};  // held by this consumer, not completed yet
  bool executed = false;               // the handler ran (or the DLQ got it): complete it
  bool lease_lost = false;             // another worker took the key over: never run it here
  int complete_index = -1;             // into the batch's completions
  Fate fate = Fate::kOpen;
};

// How Execute left an Acquired message.
enum class Ran : std::uint8_t {
  kSettled,    // completed or dead-lettered: acknowledged once the completion is stored
  kLeaseLost,  // another worker took the key over and owns the message now: hand it back
  kUnsettled,  // the dead-letter publish failed, or stopping: hand it back
};

// The dead-letter reason of a message whose key the receiver could not take.
std::string_view PoisonReason(Receiver::KeyFault fault) {
  switch (fault) {
    case Receiver::KeyFault::kNoKey:
      return "no_key";
    case Receiver::KeyFault::kBadPayload:
      return "bad_payload";
    case Receiver::KeyFault::kBadKey:
      break;
  }
  return "bad_key";
}

struct Completion {
  std::size_t item = 0;
  Outcome outcome = Outcome::kSuccess;
  std::string response{};
};

// Numbers a batch's partitions 0, 1, ... in order of first appearance (into `names`). A batch
// has few partitions, and messages of one mostly come in runs: the last one is checked first,
// then the few seen so far, and a hash map only once there are many.
class PartitionIndex {
 public:
  explicit PartitionIndex(std::vector<std::string_view>& names) : names_(names) {}

  std::uint32_t Of(std::string_view name) {
    if (!names_.empty() && names_[last_] == name) return last_;
    if (names_.size() <= kLinear) {
      for (std::uint32_t p = 0; p < names_.size(); ++p) {
        if (names_[p] == name) return last_ = p;
      }
      last_ = Add(name);
      if (names_.size() > kLinear) {
        for (std::uint32_t p = 0; p < names_.size(); ++p) by_name_.emplace(names_[p], p);
      }
      return last_;
    }
    const auto [it, inserted] =
        by_name_.try_emplace(name, static_cast<std::uint32_t>(names_.size()));
    if (inserted) names_.push_back(name);
    return last_ = it->second;
  }

 private:
  static constexpr std::size_t kLinear = 8;
  std::uint32_t Add(std::string_view name) {
    names_.push_back(name);
    return static_cast<std::uint32_t>(names_.size() - 1);
  }
  std::vector<std::string_view>& names_;
  std::uint32_t last_ = 0;
  absl::flat_hash_map<std::string_view, std::uint32_t> by_name_;
};

// One polled batch on its way through the consumer. Items point into `batch`, so a Round is
// never copied or moved once filled (it lives behind a unique_ptr).
struct Round {
  std::vector<BrokerMessage> batch;
  std::vector<Item> items;
  std::vector<std::string_view> partitions;  // distinct, in order of first appearance
  std::vector<Completion> completions;
  bool store_failed = false;
  bool broker_failed = false;
  std::chrono::milliseconds handback_delay{0};
};

}  // namespace

struct Consumer::Impl {
  Impl(Store& s, Broker& b, MessageHandler h, ConsumerOptions o)
      : store(s),
        broker(b),
        handler(std::move(h)),
        options(std::move(o)),
        clock(options.clock != nullptr ? *options.clock : Clock::System()),
        keys(s, ReceiverOptions{.scope = options.scope,
                                .keep_leases = false,  // it runs no handler
                                .fingerprint = options.fingerprint,
                                .key_source = options.key_source,
                                .max_key_bytes = options.max_key_bytes,
                                .clock = &clock}),
        rng(std::random_device{}()) {
    if (options.busy_timeout.count() <= 0)
      options.busy_timeout = options.lease + milliseconds(1000);
    if (options.batch_size == 0) options.batch_size = 1;
    if (options.max_attempts == 0) options.max_attempts = 1;
    options.jitter = std::clamp(options.jitter, 0.0, 1.0);
    if (options.registry != nullptr) {
      metrics.emplace(*options.registry, options.scope);
      own.emplace(*options.registry, options.name);
    }
    if (options.keep_leases) keeper.emplace(options.lease / 8);
  }

  Store& store;
  Broker& broker;
  MessageHandler handler;
  ConsumerOptions options;
  Clock& clock;
  Receiver keys;  // key extraction and validation only, exactly as the receiver does it
  std::optional<Metrics> metrics;
  std::optional<ConsumerMetrics> own;
  std::mt19937_64 rng;
  std::vector<Header> header_scratch;  // Classify's, on the consumer's thread
  // keep_leases: holds the batch while a handler runs (ExtendIfDue from its thread).
  std::optional<core::LeaseKeeper> keeper;

  std::atomic<bool> stop{false};
  std::mutex stop_mu;
  std::condition_variable stop_cv;

  mutable std::mutex counts_mu;
  ConsumerCounts counts;

  // ---- helpers ----

  void Count(std::uint64_t ConsumerCounts::*field, Counter* ConsumerMetrics::*counter,
             std::uint64_t n = 1) {
    if (n == 0) return;
    {
      std::lock_guard lock(counts_mu);
      counts.*field += n;
    }
    if (own) (*own.*counter)->Inc(n);
  }

  // A key this consumer held was taken over by another worker (SPEC §2's LeaseLost).
  void CountLeaseLost() {
    if (metrics) metrics->lease_lost->Inc();
    std::lock_guard lock(counts_mu);
    ++counts.lease_lost;
  }

  void CountStoreError() {
    if (metrics) metrics->store_errors->Inc();
    std::lock_guard lock(counts_mu);
    ++counts.store_errors;
  }

  // Sleeps `d` (cut short by Stop() on the system clock).
  void Sleep(milliseconds d) {
    if (d.count() <= 0) return;
    if (options.clock != nullptr) {
      options.clock->SleepFor(d);
      return;
    }
    std::unique_lock lock(stop_mu);
    stop_cv.wait_for(lock, d, [&] { return stop.load(); });
  }

  // The delay before retry number `n` (1, 2, ...): backoff * 2^(n-1), capped, with jitter.
  milliseconds Backoff(std::uint32_t n, std::mt19937_64& random) {
    double d = static_cast<double>(options.backoff.count());
    for (std::uint32_t i = 1; i < n && d < static_cast<double>(options.max_backoff.count()); ++i) {
      d *= 2;
    }
    d = std::min(d, static_cast<double>(options.max_backoff.count()));
    std::uniform_real_distribution<double> factor(1.0 - options.jitter, 1.0);
    return milliseconds(static_cast<std::int64_t>(d * factor(random)));
  }

  Result<BeginAnswer> BeginOne(const Item& item) {
    BeginRequest req{.scope = options.scope,
                     .key = item.key,
                     .fingerprint = item.fingerprint,
                     .lease = options.lease};
    return core::TimedBegin(store, req, metrics ? &*metrics : nullptr);
  }

  // Takes the key, fingerprint or poison reason of a message.
  void Classify(Item& item) {
    const BrokerMessage& m = *item.message;
    // The receiver's KeyOf reads headers as string_view pairs; one buffer serves every message.
    std::vector<Header>& headers = header_scratch;
    headers.clear();
    for (const auto& [name, value] : m.headers) headers.emplace_back(name, value);
    Message msg{.payload = m.payload, .headers = headers};
    auto fp = core::FingerprintFor(options.fingerprint, m.payload);
    if (!fp) {
      item.poison_reason = "bad_payload";
      item.poison_error = fp.error().message();
      return;
    }
    item.fingerprint = *fp;
    Receiver::KeyFault fault = Receiver::KeyFault::kBadKey;
    auto key = keys.KeyOf(msg, item.key_storage, &fault);
    if (!key) {
      item.poison_reason = PoisonReason(fault);
      item.poison_error = key.error().message();
      return;
    }
    item.key = *key;
  }

  // Publishes to the DLQ; false (counted) when the broker did not confirm.
  bool DeadLetter(const Item& item, std::string_view reason, std::uint32_t attempts,
                  std::string_view error) {
    DeadLetterInfo info{
        .reason = reason, .attempts = attempts, .last_error = error, .key = item.key};
    Status s = broker.DeadLetter(*item.message, info);
    if (!s.ok()) {
      Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
      return false;
    }
    if (metrics) metrics->dlq_sends->Inc();
    Count(&ConsumerCounts::dead_lettered, &ConsumerMetrics::dead_lettered);
    return true;
  }

  // Runs the handler of an Acquired item with retries; records what to complete.
  Ran Execute(std::vector<Item>& items, std::size_t index, std::vector<Completion>& completions,
              Timestamp& leases_from) {
    Item& item = items[index];
    const Acquired acquired = *item.acquired;
    std::uint32_t attempt = acquired.attempt;
    std::uint32_t retry = 0;
    for (;;) {
      ExtendIfDue(items, leases_from);
      // The token is stale: running again would race the worker that took the key over.
      if (item.lease_lost) return Ran::kLeaseLost;
      HandlerContext ctx{.scope = options.scope,
                         .key = item.key,
                         .attempt = attempt,
                         .token = acquired.token,
                         .payload = item.message->payload};
      HandlerVerdict verdict;
      std::optional<core::Stopwatch> sw;
      if (metrics) sw.emplace();
      try {
        // The keeper's thread owns `items` and `leases_from` while the handler runs (the Hold
        // hands them back, with what it changed, when it is destroyed).
        std::optional<core::LeaseKeeper::Hold> held;
        // One pointer captured: the function fits std::function's own storage (no allocation).
        struct Lent {
          Impl* self;
          std::vector<Item>* items;
          Timestamp* leases_from;
          Timestamp until;  // keep_leases_for: no extension past it
        } lent{this, &items, &leases_from, KeepUntil()};
        if (keeper) {
          held.emplace(*keeper, [l = &lent] {
            if (l->self->clock.Now() < l->until) l->self->ExtendIfDue(*l->items, *l->leases_from);
          });
        }
        verdict = handler(ctx, *item.message);
      } catch (const std::exception& e) {
        verdict = {Verdict::kRetryable, std::string("handler threw: ") + e.what()};
      } catch (...) {
        verdict = {Verdict::kRetryable, "handler threw a non-standard exception"};
      }
      if (sw) metrics->handler_seconds->ObserveDuration(sw->Elapsed());
      // Taken over while the handler ran (the store did not answer the keeper in time): the
      // handler's effect happened, but the key and the message are the new holder's now.
      if (item.lease_lost) return Ran::kLeaseLost;

      if (verdict.verdict == Verdict::kSuccess) {
        completions.emplace_back(index, Outcome::kSuccess, std::move(verdict.detail));
        item.executed = true;
        return Ran::kSettled;
      }
      std::string_view reason;
      if (verdict.verdict == Verdict::kPermanent) {
        reason = "permanent";
      } else if (attempt >= options.max_attempts) {
        reason = "attempts_exhausted";
      }
      if (!reason.empty()) {
        if (!DeadLetter(item, reason, attempt, verdict.detail)) return Ran::kUnsettled;
        completions.push_back({index, Outcome::kFailure,
                               "dead-lettered: " + std::string(reason) + ": " + verdict.detail});
        item.executed = true;
        return Ran::kSettled;
      }
      if (stop.load()) return Ran::kUnsettled;
      ++retry;
      Count(&ConsumerCounts::retries, &ConsumerMetrics::retries);
      SleepHolding(Backoff(retry, rng), items, leases_from);
      ++attempt;
    }
  }

  // Leases of the keys this batch holds are pushed forward when half of the lease is gone, so
  // a long batch (retries, Busy waits) does not lose them to another worker; the unsettled
  // messages are touched with them. True when it was due. A key whose lease was lost anyway
  // is marked: its message belongs to the worker that took it over.
  // When a handler call starting now stops being kept (keep_leases_for), max for never.
  Timestamp KeepUntil() const {
    const milliseconds limit = options.keep_leases_for;
    if (limit.count() <= 0) return Timestamp::max();  // no clock read per call when unset
    const Timestamp now = clock.Now();
    return limit >= Timestamp::max() - now ? Timestamp::max() : now + limit;
  }

  bool ExtendIfDue(std::vector<Item>& items, Timestamp& leases_from) {
    const Timestamp now = clock.Now();
    if (now - leases_from < options.lease / 2) return false;
    for (Item& item : items) {
      if (!item.acquired || item.lease_lost) continue;
      auto r = store.Extend(options.scope, item.key, item.acquired->token, options.lease);
      if (!r && metrics) metrics->store_errors->Inc();
      if (r && *r == WriteAnswer::kLeaseLost) {
        item.lease_lost = true;
        CountLeaseLost();
      }
    }
    TouchOpen(items);
    leases_from = now;
    return true;
  }

  // Sleeps `d` (a retry's backoff, a Busy key's) while the batch keeps what it holds: its
  // messages are touched, and the sleep is cut where its leases are due for an extension. A
  // wait may be longer than half the lease (or than the lease: busy_timeout); without this,
  // another worker would take the batch's keys over, and the broker hand its messages to
  // another consumer.
  void SleepHolding(milliseconds d, std::vector<Item>& items, Timestamp& leases_from) {
    if (!ExtendIfDue(items, leases_from)) TouchOpen(items);
    const Timestamp end = clock.Now() + d;
    for (Timestamp now = clock.Now(); now < end && !stop.load(); now = clock.Now()) {
      const Timestamp due = std::max(leases_from + options.lease / 2, now + milliseconds(1));
      Sleep(std::chrono::duration_cast<milliseconds>(std::min(end, due) - now));
      ExtendIfDue(items, leases_from);
    }
  }

  // Restarts the broker's redelivery timer (JetStream's ack_wait) of every message of the
  // batch not settled yet, in batch order. Touching only a message being retried would make
  // the broker, if this process dies, redeliver it after the later messages of its partition,
  // which another consumer would then run first.
  void TouchOpen(const std::vector<Item>& items) {
    std::vector<const BrokerMessage*> open;
    for (const Item& item : items) {
      if (item.fate == Fate::kOpen) open.push_back(item.message);
    }
    (void)broker.Touch(open);
  }

  // Begins again, with backoff, a key another worker holds, until it is decided or busy_timeout
  // passes (then nullopt). The rest of the batch is held meanwhile (SleepHolding).
  std::optional<Result<BeginAnswer>> WaitWhileBusy(std::vector<Item>& items, const Item& item,
                                                   Timestamp lease_deadline,
                                                   Timestamp& leases_from) {
    const Timestamp until = clock.Now() + options.busy_timeout;
    std::uint32_t n = 0;
    while (!stop.load()) {
      const Timestamp now = clock.Now();
      if (now >= until) break;
      milliseconds d = Backoff(++n, rng);
      if (lease_deadline > now)
        d = std::min(
            d, std::chrono::duration_cast<milliseconds>(lease_deadline - now + milliseconds(5)));
      d = std::min(d, std::chrono::duration_cast<milliseconds>(until - now));
      SleepHolding(std::max(d, milliseconds(1)), items, leases_from);
      auto answer = BeginOne(item);
      if (!answer) return answer;
      if (const auto* busy = std::get_if<Busy>(&*answer)) {
        lease_deadline = busy->lease_deadline;
        continue;
      }
      return answer;
    }
    return std::nullopt;
  }

  // ---- one round ----

  // Polls a batch, or nullptr when nothing came.
  Result<std::unique_ptr<Round>> PollRound(milliseconds wait) {
    auto polled = broker.Poll(options.batch_size, wait);
    if (!polled) {
      Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
      return polled.error();
    }
    if (polled->empty()) return std::unique_ptr<Round>();
    auto round = std::make_unique<Round>();
    round->batch = std::move(*polled);
    Count(&ConsumerCounts::received, &ConsumerMetrics::received, round->batch.size());
    if (own) own->batches->Inc();
    round->items.resize(round->batch.size());
    round->completions.reserve(round->batch.size());
    PartitionIndex index(round->partitions);
    for (std::size_t i = 0; i < round->batch.size(); ++i) {
      Item& item = round->items[i];
      item.message = &round->batch[i];
      item.partition = index.Of(item.message->partition);
      Classify(item);
    }
    return round;
  }

  // In-batch duplicates follow their first occurrence; the others get one BeginRequest each.
  std::vector<BeginRequest> Requests(Round& r) {
    absl::flat_hash_map<std::string_view, int> first_of;
    first_of.reserve(r.items.size());
    std::vector<BeginRequest> requests;
    requests.reserve(r.items.size());
    for (std::size_t i = 0; i < r.items.size(); ++i) {
      Item& item = r.items[i];
      if (!item.poison_reason.empty()) continue;
      auto [it, inserted] = first_of.try_emplace(item.key, static_cast<int>(i));
      if (!inserted) {
        item.first = it->second;
        const Item& first = r.items[static_cast<std::size_t>(it->second)];
        item.conflict =
            item.fingerprint && first.fingerprint && *item.fingerprint != *first.fingerprint;
        continue;
      }
      item.begin_index = static_cast<int>(requests.size());
      requests.push_back({.scope = options.scope,
                          .key = item.key,
                          .fingerprint = item.fingerprint,
                          .lease = options.lease});
    }
    return requests;
  }

  std::vector<Result<BeginAnswer>> BeginAll(Round& r, std::span<const BeginRequest> requests) {
    std::vector<Result<BeginAnswer>> answers;
    if (requests.empty()) return answers;
    core::Stopwatch sw;
    answers = store.BeginBatch(requests);
    NoteBegins(r, answers, sw.Elapsed());
    return answers;
  }

  // What the store answered to begins started with Store::StartBatch, and how long it took
  // (the metric's latency: until the store answered, not until the consumer looked).
  struct StartedBegins {
    std::vector<Result<BeginAnswer>> answers;
    std::chrono::nanoseconds took{0};
  };

  // Starts the begins without waiting for them, where the store can (StartBatch), so that a
  // durable store's sync runs while the previous batch is acknowledged; nullopt when the store
  // only answers through BeginBatch (from then on, it is not asked again) or there is nothing
  // to begin.
  std::optional<std::future<StartedBegins>> StartBegins(std::span<const BeginRequest> requests) {
    if (requests.empty() || !store_starts_batches) return std::nullopt;
    // Shared with the callback, which the store may call on its own thread.
    auto promise = std::make_shared<std::promise<StartedBegins>>();
    std::future<StartedBegins> answered = promise->get_future();
    const bool accepted =
        store.StartBatch(requests, {}, [promise, sw = core::Stopwatch()](BatchAnswers answers) {
          promise->set_value({std::move(answers.begins), sw.Elapsed()});
        });
    if (!accepted) {
      store_starts_batches = false;
      return std::nullopt;
    }
    return answered;
  }

  std::vector<Result<BeginAnswer>> AwaitBegins(Round& r, std::future<StartedBegins>& answered) {
    StartedBegins got = answered.get();
    NoteBegins(r, got.answers, got.took);
    return std::move(got.answers);
  }

  void NoteBegins(Round& r, const std::vector<Result<BeginAnswer>>& answers,
                  std::chrono::nanoseconds took) {
    if (metrics) {
      metrics->store_begin_seconds->ObserveDuration(took);
      for (const auto& a : answers) CountBegin(*metrics, a);
    }
    for (Item& item : r.items) {
      if (item.begin_index < 0) continue;
      const auto& a = answers[static_cast<std::size_t>(item.begin_index)];
      if (a && std::holds_alternative<Acquired>(*a)) item.acquired = std::get<Acquired>(*a);
    }
  }

  // Runs the handlers, partition by partition, in broker order. `leases_from`: when the begins
  // were sent, which is when the leases they acquired started.
  void SettleAll(Round& r, std::vector<Result<BeginAnswer>>& answers, Timestamp leases_from) {
    // The items partition by partition (in order of first appearance), each in batch order: a
    // counting sort by partition index.
    std::vector<std::size_t> start(r.partitions.size() + 1, 0);
    for (const Item& item : r.items) ++start[item.partition + 1];
    for (std::size_t p = 1; p < start.size(); ++p) start[p] += start[p - 1];
    std::vector<std::size_t> order(r.items.size());
    {
      std::vector<std::size_t> next(start.begin(), start.end() - 1);
      for (std::size_t i = 0; i < r.items.size(); ++i) order[next[r.items[i].partition]++] = i;
    }
    for (std::size_t p = 0; p < r.partitions.size(); ++p) {
      bool stopped = false;
      for (std::size_t k = start[p]; k < start[p + 1]; ++k) {
        const std::size_t i = order[k];
        Item& item = r.items[i];
        if (item.fate == Fate::kReturned) {
          stopped = true;
          continue;
        }
        if (stopped || stop.load()) {
          item.fate = Fate::kHandedBack;
          stopped = true;
          continue;
        }
        if (!Settle(r, i, answers, leases_from)) {
          item.fate = Fate::kHandedBack;
          stopped = true;
        }
      }
    }
  }

  Result<std::size_t> RunOnce(bool pipelined) {
    // With a batch still completing, poll briefly: nothing there means "finish it now".
    const milliseconds wait = tail ? std::min(options.poll_wait, kTailPollWait) : options.poll_wait;
    auto polled = PollRound(wait);
    if (!polled || *polled == nullptr) {
      Status tail_status = FinishTail(nullptr);
      if (!polled) return polled.error();
      if (!tail_status.ok()) return tail_status;
      return std::size_t{0};
    }
    Round& r = **polled;
    std::vector<BeginRequest> requests = Requests(r);
    // A key the previous batch is still completing would answer Busy: let it land first.
    if (tail && SharesKeys(*tail, r)) WaitTail();
    // The previous batch is acknowledged (its completions were stored meanwhile) while this
    // one's begins are on their way to the disk, where the store can start them.
    std::vector<Result<BeginAnswer>> answers;
    Status tail_status;
    // Taken before the begins, not after FinishTail, which may wait for the previous batch's
    // completions for long while these leases already run.
    const Timestamp leases_from = clock.Now();
    if (std::optional<std::future<StartedBegins>> started = StartBegins(requests)) {
      tail_status = FinishTail(&r);
      answers = AwaitBegins(r, *started);
    } else {
      answers = BeginAll(r, requests);
      tail_status = FinishTail(&r);
    }
    SettleAll(r, answers, leases_from);
    if (pipelined) {
      StartTail(std::move(*polled));
      if (!tail_status.ok()) return tail_status;
      return r.items.size();
    }
    StoreCompletions(r, rng);
    Status s = Finish(r, nullptr);
    if (!tail_status.ok()) return tail_status;
    if (!s.ok()) return s;
    return r.items.size();
  }

  // Decides one message. False: hand it (and the rest of its partition) back.
  bool Settle(Round& r, std::size_t i, std::vector<Result<BeginAnswer>>& answers,
              Timestamp& leases_from) {
    Item& item = r.items[i];
    if (!item.poison_reason.empty()) {
      if (!DeadLetter(item, item.poison_reason, 0, item.poison_error)) {
        r.broker_failed = true;
        return false;
      }
      Count(&ConsumerCounts::poison, &ConsumerMetrics::poison);
      item.fate = Fate::kSettled;
      return true;
    }
    if (item.first >= 0) {
      // A copy with another payload than the first is a conflict whatever becomes of the first
      // (SPEC §2); a copy with the same payload is decided after the batch's completions, by
      // the first (Finish).
      return item.conflict ? SettleConflict(r, item) : true;
    }
    Result<BeginAnswer> answer = std::move(answers[static_cast<std::size_t>(item.begin_index)]);
    if (answer) {
      if (const auto* busy = std::get_if<Busy>(&*answer)) {
        auto decided = WaitWhileBusy(r.items, item, busy->lease_deadline, leases_from);
        if (!decided) {
          r.handback_delay = std::max(r.handback_delay, options.backoff);
          return false;
        }
        answer = std::move(*decided);
      }
    }
    if (!answer) {
      CountStoreError();
      r.store_failed = true;
      return false;
    }
    return std::visit(
        [&](const auto& a) -> bool {
          using T = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<T, Acquired>) {
            item.acquired = a;
            switch (Execute(r.items, i, r.completions, leases_from)) {
              case Ran::kSettled:
                item.fate = Fate::kSettled;
                return true;
              case Ran::kLeaseLost:
                r.handback_delay = std::max(r.handback_delay, options.backoff);
                return false;
              case Ran::kUnsettled:
                r.broker_failed = r.broker_failed || !stop.load();
                return false;
            }
            return false;
          } else if constexpr (std::is_same_v<T, Conflict>) {
            return SettleConflict(r, item);
          } else if constexpr (std::is_same_v<T, Busy>) {
            return false;  // WaitWhileBusy only returns other answers
          } else {
            // Replay (or Stale, which plain keys never answer): settled without the handler.
            Count(&ConsumerCounts::replayed, &ConsumerMetrics::replayed);
            item.fate = Fate::kSettled;
            return true;
          }
        },
        *answer);
  }

  // The key was used for a message with another payload: dead-lettered, then acknowledged.
  bool SettleConflict(Round& r, Item& item) {
    if (!DeadLetter(item, "conflict", 0,
                    "the key was used before for a message with another payload")) {
      r.broker_failed = true;
      return false;
    }
    item.fate = Fate::kSettled;
    return true;
  }

  // One CompleteBatch for every key the handler (or the DLQ) finished, retried a few times
  // for the ones the store could not answer; those are handed back, still IN_PROGRESS. Runs on
  // the completer thread when pipelined (hence its own random source).
  void StoreCompletions(Round& r, std::mt19937_64& random) {
    std::vector<std::size_t> pending(r.completions.size());
    for (std::size_t c = 0; c < r.completions.size(); ++c) pending[c] = c;
    constexpr int kTries = 3;
    for (int attempt = 0; attempt < kTries && !pending.empty(); ++attempt) {
      if (attempt > 0) Sleep(Backoff(static_cast<std::uint32_t>(attempt), random));
      std::vector<CompleteRequest> reqs;
      reqs.reserve(pending.size());
      for (std::size_t c : pending) {
        const Completion& done = r.completions[c];
        const Item& item = r.items[done.item];
        reqs.push_back({.scope = options.scope,
                        .key = item.key,
                        .token = item.acquired->token,
                        .outcome = done.outcome,
                        .response = done.response,
                        .retention = done.outcome == Outcome::kSuccess
                                         ? options.retention
                                         : options.failure_retention});
      }
      core::Stopwatch sw;
      auto results = store.CompleteBatch(reqs);
      if (metrics) metrics->store_complete_seconds->ObserveDuration(sw.Elapsed());
      std::vector<std::size_t> again;
      std::uint64_t executed = 0;
      for (std::size_t k = 0; k < results.size(); ++k) {
        const std::size_t c = pending[k];
        Item& item = r.items[r.completions[c].item];
        if (!results[k]) {
          again.push_back(c);
          continue;
        }
        if (*results[k] == WriteAnswer::kLeaseLost) {
          // The effect happened; a newer worker owns the key's outcome now.
          if (!item.lease_lost) CountLeaseLost();
        } else if (metrics) {
          (r.completions[c].outcome == Outcome::kSuccess ? metrics->complete_success
                                                         : metrics->complete_failure)
              ->Inc();
        }
        if (r.completions[c].outcome == Outcome::kSuccess) ++executed;
        item.acquired.reset();
      }
      Count(&ConsumerCounts::executed, &ConsumerMetrics::executed, executed);
      pending = std::move(again);
    }
    for (std::size_t c : pending) {
      CountStoreError();
      r.items[r.completions[c].item].fate = Fate::kHandedBack;
      r.store_failed = true;
    }
  }

  // Acknowledges, per partition, the settled messages before the first one that is not; hands
  // back that one and the rest of its partition -- together with every message of that
  // partition in `next`, the batch polled meanwhile when pipelined, which is then not run --
  // and releases keys acquired but never run.
  Status Finish(Round& r, Round* next) {
    // An in-batch duplicate follows its first occurrence (a conflicting one was settled alone).
    for (Item& item : r.items) {
      if (item.first < 0 || item.conflict) continue;
      const Item& first = r.items[static_cast<std::size_t>(item.first)];
      if (first.fate == Fate::kSettled && !first.acquired) {
        item.fate = Fate::kSettled;
        Count(&ConsumerCounts::replayed, &ConsumerMetrics::replayed);
      } else if (item.fate != Fate::kReturned) {
        item.fate = Fate::kHandedBack;
      }
    }
    std::vector<const BrokerMessage*> ack;
    ack.reserve(r.items.size());
    // By partition index: whether the partition was cut, and what of it goes back.
    std::vector<char> cut(r.partitions.size(), 0);
    std::vector<std::vector<const BrokerMessage*>> back(r.partitions.size());
    std::vector<std::uint32_t> back_order;
    for (Item& item : r.items) {
      char& partition_cut = cut[item.partition];
      if (!partition_cut && item.fate != Fate::kSettled) partition_cut = 1;
      if (item.fate == Fate::kReturned) {
        // handed back already, with the previous batch's messages of its partition
      } else if (partition_cut) {
        if (back[item.partition].empty()) back_order.push_back(item.partition);
        back[item.partition].push_back(item.message);
      } else {
        ack.push_back(item.message);
      }
      // A key this batch acquired but did not run: free it so the redelivery runs at once.
      // (One whose lease was lost is the new holder's to finish.)
      if (item.acquired && !item.executed && !item.lease_lost) {
        auto rel = store.Release(options.scope, item.key, item.acquired->token);
        if (rel && *rel == WriteAnswer::kApplied && metrics) metrics->releases->Inc();
        item.acquired.reset();
      }
    }
    if (next != nullptr && !back_order.empty()) {
      absl::flat_hash_map<std::string_view, std::uint32_t> cut_partition;
      for (std::uint32_t p : back_order) cut_partition.emplace(r.partitions[p], p);
      for (Item& later : next->items) {
        auto it = cut_partition.find(later.message->partition);
        if (it == cut_partition.end()) continue;
        back[it->second].push_back(later.message);
        later.fate = Fate::kReturned;
      }
    }
    milliseconds delay = r.handback_delay;
    if (r.store_failed) delay = std::max(delay, options.backoff);
    std::size_t handed_back = 0;
    for (std::uint32_t partition : back_order) {
      const auto& msgs = back[partition];
      handed_back += msgs.size();
      if (!broker.Redeliver(msgs, delay).ok()) {
        Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
        r.broker_failed = true;
      }
    }
    Count(&ConsumerCounts::redelivered, &ConsumerMetrics::redelivered, handed_back);
    if (!ack.empty() && !broker.Acknowledge(ack).ok()) {
      // Not lost: the broker delivers them again and the store answers Replay.
      Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
      r.broker_failed = true;
    }
    if (r.store_failed) return UnavailableError("consumer " + options.name + ": the store failed");
    if (r.broker_failed && !stop.load()) {
      return UnavailableError("consumer " + options.name + ": the broker failed");
    }
    return OkStatus();
  }

  // ---- pipelining: the previous batch completes while the next one is polled and begun ----

  static constexpr milliseconds kTailPollWait{10};

  std::unique_ptr<Round> tail;  // handlers done, completions being stored by the completer
  std::thread completer;
  std::mutex tail_mu;
  std::condition_variable tail_cv;
  bool tail_stored = true;           // the completer finished the tail's CompleteBatch
  bool store_starts_batches = true;  // until the store's StartBatch declines
  bool completer_quit = false;
  std::mt19937_64 completer_rng{std::random_device{}()};

  void StartTail(std::unique_ptr<Round> r) {
    if (!completer.joinable()) completer = std::thread([this] { CompleterLoop(); });
    std::lock_guard lock(tail_mu);
    tail = std::move(r);
    tail_stored = false;
    tail_cv.notify_all();
  }

  void CompleterLoop() {
    std::unique_lock lock(tail_mu);
    for (;;) {
      tail_cv.wait(lock, [&] { return completer_quit || !tail_stored; });
      if (!tail_stored) {
        Round* r = tail.get();
        lock.unlock();
        StoreCompletions(*r, completer_rng);
        lock.lock();
        tail_stored = true;
        tail_cv.notify_all();
        continue;
      }
      if (completer_quit) return;
    }
  }

  void WaitTail() {
    std::unique_lock lock(tail_mu);
    tail_cv.wait(lock, [&] { return tail_stored; });
  }

  static bool SharesKeys(const Round& a, const Round& b) {
    absl::flat_hash_set<std::string_view> keys;
    keys.reserve(a.items.size());
    for (const Item& item : a.items) {
      if (!item.key.empty()) keys.insert(item.key);
    }
    for (const Item& item : b.items) {
      if (!item.key.empty() && keys.count(item.key) > 0) return true;
    }
    return false;
  }

  // Waits for the tail's completions, then acknowledges or hands back its messages.
  Status FinishTail(Round* next) {
    if (!tail) return OkStatus();
    WaitTail();
    Status s = Finish(*tail, next);
    std::lock_guard lock(tail_mu);
    tail.reset();
    return s;
  }

  // The previous batch completed and acknowledged, and the broker's answers to the
  // acknowledgements in: nothing of what this consumer did is left in flight.
  Status Drain() {
    Status s = FinishTail(nullptr);
    if (Status settled = broker.Settle(); !settled.ok()) {
      Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
      if (s.ok()) s = std::move(settled);
    }
    return s;
  }

  void StopCompleter() {
    {
      std::lock_guard lock(tail_mu);
      completer_quit = true;
      tail_cv.notify_all();
    }
    if (completer.joinable()) completer.join();
  }

  void Run() {
    std::uint32_t failures = 0;
    while (!stop.load()) {
      auto r = RunOnce(options.pipeline);
      if (r) {
        failures = 0;
        continue;
      }
      Sleep(Backoff(++failures, rng));
    }
    (void)Drain();
  }
};

Consumer::Consumer(Store& store, Broker& broker, MessageHandler handler, ConsumerOptions options)
    : impl_(std::make_unique<Impl>(store, broker, std::move(handler), std::move(options))) {}

Consumer::~Consumer() {
  (void)impl_->Drain();
  impl_->StopCompleter();
}

Result<std::size_t> Consumer::RunOnce() { return impl_->RunOnce(impl_->options.pipeline); }

Status Consumer::Flush() { return impl_->Drain(); }

void Consumer::Run() { impl_->Run(); }

void Consumer::Stop() {
  {
    std::lock_guard lock(impl_->stop_mu);
    impl_->stop.store(true);
  }
  impl_->stop_cv.notify_all();
}

bool Consumer::stopping() const { return impl_->stop.load(); }

ConsumerCounts Consumer::counts() const {
  std::lock_guard lock(impl_->counts_mu);
  return impl_->counts;
}

const ConsumerOptions& Consumer::options() const { return impl_->options; }

}  // namespace idem
