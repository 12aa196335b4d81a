// The consumer core (include/idem/consumer.h): one poll-begin-handle-complete-acknowledge round
// over any Broker, with per-partition order, retries, Busy waits and the dead-letter channel.
#include "idem/consumer.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <exception>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"

#include "core/lease_keeper.h"
#include "core/machine.h"
#include "core/receiver_parts.h"
#include "core/thread_name.h"
#include "idem/fingerprint.h"

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

void Broker::Recycle(std::vector<BrokerMessage>) {}

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
    stale = messages("stale");
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
  Counter* stale;
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
  // A versioned message (options.versions): its entity (a view into the message or into
  // entity_storage) and version, and `key` views version_key, "ENTITY#VERSION". Version 0: the
  // message is gated by its key.
  std::string_view entity{};
  std::string entity_storage{};
  std::uint64_t version = 0;
  std::string version_key{};
  int first = -1;                      // index of the earlier item of this batch with the same key
  bool conflict = false;               // ... whose fingerprint differs from this one's
  int begin_index = -1;                // into the batch's begin requests and answers
  std::optional<Acquired> acquired{};  // held by this consumer, not completed yet
  bool executed = false;               // the handler ran (or the DLQ got it): complete it
  bool lease_lost = false;             // another worker took the key over: never run it here
  bool busy_uncounted = false;         // answered Busy, not waited out yet (CountAnswer)
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
  bool refused = false;  // the store refused the handler's outcome: this is what is stored instead
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
  // What Finish decided (Cut) and then did (Acknowledge): the messages to acknowledge, and by
  // partition index those to hand back, partitions in order of their first such message.
  std::vector<const BrokerMessage*> ack;
  std::vector<std::vector<const BrokerMessage*>> back;
  std::vector<std::uint32_t> back_order;
  // Keys to free in Acknowledge: its own acquired but not run, and those of later batches' items
  // that go back with it (pipelined).
  std::vector<Item*> release;
  bool store_failed = false;
  bool broker_failed = false;
  std::chrono::milliseconds handback_delay{0};
};

// A finished Round's messages go back to the broker they came from (Broker::Recycle), which
// may fill its next batches with them. Rounds are finished in the order they were polled, and
// a Round's messages are referred to only by it and by the Rounds polled before it.
struct RecycleRound {
  Broker* broker;
  void operator()(Round* r) const {
    broker->Recycle(std::move(r->batch));
    delete r;
  }
};
using RoundPtr = std::unique_ptr<Round, RecycleRound>;

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
    // Checked once: a retention the store refuses would fail every completion (and be taken for
    // a refused outcome, stored as a failure in its place).
    for (Status c : {core::CheckLease(options.lease), core::CheckRetention(options.retention)}) {
      if (!c.ok() && options_status.ok())
        options_status = InvalidArgumentError("consumer options: " + c.message());
    }
    if (Status c = core::CheckRetention(options.failure_retention);
        !c.ok() && options_status.ok()) {
      options_status = InvalidArgumentError("consumer options: failure_" + c.message());
    }
    if (options.busy_timeout.count() <= 0 && options_status.ok())  // lease + 1 s: no overflow
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
  Status options_status;  // not ok: every round fails with it (a lease or retention out of range)
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

  // Counts one answer of a Begin in the metrics (core::CountBeginAnswer: a Busy is waited out,
  // so the delivery counts the answer the wait ends with, or one busy when it gives up:
  // WaitOutBusyAnswer, Acknowledge) and a failed one in counts().
  void CountAnswer(const Result<BeginAnswer>& answer) {
    core::CountBeginAnswer(metrics ? &*metrics : nullptr, answer, /*polls_on_busy=*/true);
    CountFailedBegin(answer);
  }
  // counts()'s side of a Begin's answer: a store error, unless the store refused the request's
  // input (kInvalidArgument), as CountBegin counts it.
  void CountFailedBegin(const Result<BeginAnswer>& answer) {
    if (answer || answer.error().code() == StatusCode::kInvalidArgument) return;
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

  // A Begin of the item alone, timed and counted as CountAnswer counts.
  Result<BeginAnswer> BeginOne(const Item& item) {
    Metrics* m = metrics ? &*metrics : nullptr;
    Result<BeginAnswer> answer = [&] {
      if (item.version != 0) {
        const VersionedBeginRequest req{.scope = options.scope,
                                        .entity = item.entity,
                                        .version = item.version,
                                        .lease = options.lease};
        return core::TimedBegin(store, req, m, /*polls_on_busy=*/true);
      }
      const BeginRequest req{.scope = options.scope,
                             .key = item.key,
                             .fingerprint = item.fingerprint,
                             .lease = options.lease};
      return core::TimedBegin(store, req, m, /*polls_on_busy=*/true);
    }();
    CountFailedBegin(answer);
    return answer;
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
    if (options.versions && ClassifyVersioned(item)) return;
    Receiver::KeyFault fault = Receiver::KeyFault::kBadKey;
    auto key = keys.KeyOf(msg, item.key_storage, &fault);
    if (!key) {
      item.poison_reason = PoisonReason(fault);
      item.poison_error = key.error().message();
      return;
    }
    item.key = *key;
  }

  // A header or JSON pointer's value in `m`; nullopt when the message does not have it.
  static Result<std::optional<std::string_view>> FieldOf(const KeySource& source,
                                                         const BrokerMessage& m,
                                                         std::string& storage) {
    using Field = std::optional<std::string_view>;
    switch (source.kind) {
      case KeySource::Kind::kHeader:
        for (const auto& [name, value] : m.headers) {
          if (absl::EqualsIgnoreCase(name, source.name)) return Field(value);
        }
        return Field();
      case KeySource::Kind::kJsonPointer: {
        auto text = JsonPointerText(m.payload, source.name);
        if (!text) {
          if (text.error().code() == StatusCode::kNotFound) return Field();
          return text.error();
        }
        storage = std::move(*text);
        return Field(storage);
      }
      case KeySource::Kind::kExplicit:
      case KeySource::Kind::kFingerprint:
        break;
    }
    return Field();
  }

  // Takes the entity and version of a message (options.versions). False: it names neither, and
  // is gated by its key. True: it is a versioned message, or poison.
  bool ClassifyVersioned(Item& item) {
    const BrokerMessage& m = *item.message;
    auto poison = [&](std::string_view reason, std::string error) {
      item.poison_reason = reason;
      item.poison_error = std::move(error);
      return true;
    };
    std::string version_storage;
    auto entity = FieldOf(options.versions->entity, m, item.entity_storage);
    auto version = FieldOf(options.versions->version, m, version_storage);
    for (const auto* field : {&entity, &version}) {
      if (*field) continue;
      const std::string& why = field->error().message();
      if (why.starts_with("invalid JSON")) return poison("bad_payload", "payload: " + why);
      return poison("bad_version", std::string(field == &entity ? "entity: " : "version: ") + why);
    }
    if (!entity->has_value() && !version->has_value()) return false;
    if (!entity->has_value() || !version->has_value()) {
      return poison("bad_version", entity->has_value()
                                       ? "the message names an entity but no version"
                                       : "the message names a version but no entity");
    }
    if (Status valid = ValidateKey(**entity, options.max_key_bytes); !valid.ok()) {
      return poison("bad_version", "entity: " + valid.message());
    }
    const std::string_view text = **version;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || text[0] < '0' || text[0] > '9' || ec != std::errc() ||
        end != text.data() + text.size() || v == 0) {
      return poison("bad_version", "version \"" + std::string(text.substr(0, 64)) +
                                       "\" is not a whole number from 1 to " +
                                       std::to_string(std::numeric_limits<std::uint64_t>::max()));
    }
    item.entity = **entity;
    item.version = v;
    item.version_key = std::string(item.entity) + "#" + std::to_string(v);
    item.key = item.version_key;
    return true;
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
        completions.push_back({index, Outcome::kSuccess, std::move(verdict.detail)});
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
      SleepHolding(Backoff(retry, rng), items, leases_from);
      // Stop() cuts the backoff short: the retry is not run then (it would run at once, and
      // could even dead-letter the message while the consumer stops).
      if (stop.load()) return Ran::kUnsettled;
      Count(&ConsumerCounts::retries, &ConsumerMetrics::retries);
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
    // One ExtendBatch for the whole batch: one round trip to a shared store, one group commit
    // for the log store (not one per key).
    std::vector<ExtendRequest> requests;
    std::vector<Item*> extended;
    for (Item& item : items) {
      // (Entities have no Extend.)
      if (!item.acquired || item.lease_lost || item.version != 0) continue;
      requests.push_back({.scope = options.scope,
                          .key = item.key,
                          .token = item.acquired->token,
                          .lease = options.lease});
      extended.push_back(&item);
    }
    if (!requests.empty()) {
      core::Stopwatch sw;
      std::vector<Result<WriteAnswer>> answers = store.ExtendBatch(requests);
      if (metrics) metrics->store_extend_seconds->ObserveDuration(sw.Elapsed());
      for (std::size_t i = 0; i < extended.size() && i < answers.size(); ++i) {
        const Result<WriteAnswer>& r = answers[i];
        if (!r) CountStoreError();
        if (r && *r == WriteAnswer::kLeaseLost) {
          extended[i]->lease_lost = true;
          CountLeaseLost();
        }
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
  // Pipelined, the batch polled behind the one running is touched after it, in order: its
  // messages wait unbegun meanwhile, and would otherwise be redelivered (or claimed by another
  // consumer) before the running batch's.
  void TouchOpen(const std::vector<Item>& items) {
    std::vector<const BrokerMessage*> open;
    for (const Item& item : items) {
      if (item.fate == Fate::kOpen) open.push_back(item.message);
    }
    if (polled_behind != nullptr) {
      for (const Item& item : polled_behind->items) {
        if (item.fate == Fate::kOpen) open.push_back(item.message);
      }
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

  // An empty RoundPtr, whose deleter (for what is moved into it) recycles to this broker.
  RoundPtr NoRound() { return RoundPtr(nullptr, RecycleRound{&broker}); }

  // Polls a batch, or nullptr when nothing came.
  Result<RoundPtr> PollRound(milliseconds wait) {
    auto polled = broker.Poll(options.batch_size, wait);
    if (!polled) {
      Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
      return polled.error();
    }
    if (polled->empty()) return NoRound();
    RoundPtr round(new Round, RecycleRound{&broker});
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
      // Poison is dead-lettered unbegun; a message handed back already (pipelined: with an
      // earlier batch's messages of its partition) is not begun at all; a versioned one is
      // begun on its own, in its turn (SettleVersioned).
      if (!item.poison_reason.empty() || item.fate == Fate::kReturned || item.version != 0) {
        continue;
      }
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

  void NoteBegins(Round& r, const std::vector<Result<BeginAnswer>>& answers,
                  std::chrono::nanoseconds took) {
    if (metrics) metrics->store_begin_seconds->ObserveDuration(took);
    for (const auto& a : answers) CountAnswer(a);
    for (Item& item : r.items) {
      if (item.begin_index < 0) continue;
      const auto& a = answers[static_cast<std::size_t>(item.begin_index)];
      if (a && std::holds_alternative<Acquired>(*a)) item.acquired = std::get<Acquired>(*a);
      if (a && std::holds_alternative<Busy>(*a)) item.busy_uncounted = true;
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
    if (!options_status.ok()) return options_status;
    if (pipelined) return RunPipelined();
    auto polled = PollRound(options.poll_wait);
    if (!polled) return polled.error();
    if (*polled == nullptr) return std::size_t{0};
    Round& r = **polled;
    std::vector<BeginRequest> requests = Requests(r);
    const Timestamp leases_from = clock.Now();
    std::vector<Result<BeginAnswer>> answers = BeginAll(r, requests);
    SettleAll(r, answers, leases_from);
    StoreCompletions(r, rng);
    Status s = Finish(r, {});
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
    if (item.version != 0) return SettleVersioned(r, i, leases_from);
    if (item.first >= 0) {
      // A copy with another payload than the first is a conflict whatever becomes of the first
      // (SPEC §2); a copy with the same payload is decided after the batch's completions, by
      // the first (Finish).
      if (!item.conflict) return true;
      // Decided here without a Begin of its own: the store would have answered Conflict.
      if (metrics) metrics->begin_conflict->Inc();
      return SettleConflict(r, item);
    }
    Result<BeginAnswer> answer = std::move(answers[static_cast<std::size_t>(item.begin_index)]);
    if (!WaitOutBusyAnswer(r, item, answer, leases_from)) return false;
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

  // A Busy `answer` is begun again until decided (WaitWhileBusy). False, with the round told
  // why: still busy at busy_timeout, or the store failed; the item goes back.
  // Every answer was counted when it came (CountAnswer), but a Busy: counted here, once, when
  // the wait gives up.
  bool WaitOutBusyAnswer(Round& r, Item& item, Result<BeginAnswer>& answer,
                         Timestamp& leases_from) {
    if (answer) {
      if (const auto* busy = std::get_if<Busy>(&*answer)) {
        item.busy_uncounted = false;
        auto decided = WaitWhileBusy(r.items, item, busy->lease_deadline, leases_from);
        if (!decided) {
          core::CountBusy(metrics ? &*metrics : nullptr);
          r.handback_delay = std::max(r.handback_delay, options.backoff);
          return false;
        }
        answer = std::move(*decided);
      }
    }
    if (!answer) {
      r.store_failed = true;
      return false;
    }
    return true;
  }

  // A versioned message, in its turn: begun, run and completed (or Stale) before the next
  // message of its partition, which may be the entity's next version. False: hand it back.
  bool SettleVersioned(Round& r, std::size_t i, Timestamp& leases_from) {
    Item& item = r.items[i];
    Result<BeginAnswer> answer = BeginOne(item);
    if (!WaitOutBusyAnswer(r, item, answer, leases_from)) return false;
    const auto* acquired = std::get_if<Acquired>(&*answer);
    if (acquired == nullptr) {  // Stale: a version at or below the applied one
      Count(&ConsumerCounts::stale, &ConsumerMetrics::stale);
      item.fate = Fate::kSettled;
      return true;
    }
    item.acquired = *acquired;
    std::vector<Completion> done;
    switch (Execute(r.items, i, done, leases_from)) {
      case Ran::kSettled:
        break;
      case Ran::kLeaseLost:
        r.handback_delay = std::max(r.handback_delay, options.backoff);
        return false;
      case Ran::kUnsettled:  // Acknowledge releases the version
        r.broker_failed = r.broker_failed || !stop.load();
        return false;
    }
    if (!CompleteVersion(item, done.front().outcome)) {
      // Still in progress under this token: a redelivery takes it over after the lease.
      r.store_failed = true;
      return false;
    }
    item.fate = Fate::kSettled;
    return true;
  }

  // Stores a versioned message's completion, tried as often as StoreCompletions tries a batch's;
  // a dead-lettered version counts as applied too. False (counted) when the store never answered.
  bool CompleteVersion(Item& item, Outcome outcome) {
    constexpr int kTries = 3;
    for (int attempt = 0; attempt < kTries; ++attempt) {
      if (attempt > 0) Sleep(Backoff(static_cast<std::uint32_t>(attempt), rng));
      core::Stopwatch sw;
      auto answer = store.CompleteVersioned({.scope = options.scope,
                                             .entity = item.entity,
                                             .token = item.acquired->token,
                                             .retention = options.retention});
      if (metrics) metrics->store_complete_seconds->ObserveDuration(sw.Elapsed());
      if (!answer) {
        CountStoreError();  // each failed call, as the receiver counts them
        continue;
      }
      if (*answer == WriteAnswer::kLeaseLost) {
        CountLeaseLost();
      } else if (metrics) {
        (outcome == Outcome::kSuccess ? metrics->complete_success : metrics->complete_failure)
            ->Inc();
      }
      if (outcome == Outcome::kSuccess)
        Count(&ConsumerCounts::executed, &ConsumerMetrics::executed);
      item.acquired.reset();
      return true;
    }
    return false;
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

  // The store's requests for `r`'s completions number `which` (indices into r.completions).
  std::vector<CompleteRequest> CompletionRequests(const Round& r,
                                                  std::span<const std::size_t> which) const {
    std::vector<CompleteRequest> reqs;
    reqs.reserve(which.size());
    for (std::size_t c : which) {
      const Completion& done = r.completions[c];
      const Item& item = r.items[done.item];
      reqs.push_back({.scope = options.scope,
                      .key = item.key,
                      .token = item.acquired->token,
                      .outcome = done.outcome,
                      .response = done.response,
                      .retention = done.outcome == Outcome::kSuccess ? options.retention
                                                                     : options.failure_retention});
    }
    return reqs;
  }
  std::vector<CompleteRequest> CompletionRequests(const Round& r) const {
    std::vector<std::size_t> all(r.completions.size());
    for (std::size_t c = 0; c < all.size(); ++c) all[c] = c;
    return CompletionRequests(r, all);
  }

  // Stores every completion the handlers (or the DLQ) left in `r`, retried a few times for the
  // ones the store could not answer; those are handed back, still IN_PROGRESS. `first`: the
  // answers to the first try, when it was made already (pipelined, in the batch with the next
  // batch's begins). Runs on the consumer's thread (hence `random`: rng is not shared).
  void StoreCompletions(Round& r, std::mt19937_64& random,
                        std::optional<std::vector<Result<WriteAnswer>>> first = std::nullopt) {
    std::vector<std::size_t> pending(r.completions.size());
    for (std::size_t c = 0; c < r.completions.size(); ++c) pending[c] = c;
    constexpr int kTries = 3;
    int tries = kTries;
    for (int attempt = 0; attempt < tries && !pending.empty(); ++attempt) {
      std::vector<Result<WriteAnswer>> results;
      if (attempt == 0 && first) {
        results = std::move(*first);
      } else {
        if (attempt > 0) Sleep(Backoff(static_cast<std::uint32_t>(attempt), random));
        core::Stopwatch sw;
        results = store.CompleteBatch(CompletionRequests(r, pending));
        if (metrics) metrics->store_complete_seconds->ObserveDuration(sw.Elapsed());
      }
      std::vector<std::size_t> again;
      std::uint64_t executed = 0;
      for (std::size_t k = 0; k < pending.size(); ++k) {
        const std::size_t c = pending[k];
        Item& item = r.items[r.completions[c].item];
        if (k >= results.size() || !results[k]) {
          Completion& done = r.completions[c];
          // Each failed answer of each try is a store error, as the receiver counts them; a
          // refusal (a response over the store's limit) is the outcome's fault, not the store's.
          const bool refused =
              k < results.size() && results[k].error().code() == StatusCode::kInvalidArgument;
          if (!refused) CountStoreError();
          if (refused && !done.refused) {
            // The store will never take this outcome (a response over its limit), and handing
            // the message back would run the handler again: a failure that says why is stored
            // in its place, for duplicates to replay.
            done.response =
                core::RefusedOutcomeText({done.outcome, done.response}, results[k].error());
            done.outcome = Outcome::kFailure;
            done.refused = true;
            tries = std::max(tries, attempt + 2);  // what replaces it is always tried
          }
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
      r.items[r.completions[c].item].fate = Fate::kHandedBack;
      r.store_failed = true;
    }
  }

  // Acknowledges, per partition, the settled messages before the first one that is not; hands
  // back that one and the rest of its partition -- together with every message of that
  // partition in `later`, the batches polled since when pipelined, which are then not run --
  // and releases keys acquired but never run.
  Status Finish(Round& r, std::initializer_list<Round*> later) {
    Cut(r, later);
    return Acknowledge(r);
  }

  // Finish's first half, which decides and changes nothing at the broker or the store: which
  // messages of `r` are acknowledged and which go back (with those of `later` that follow them).
  void Cut(Round& r, std::initializer_list<Round*> later) {
    // An in-batch duplicate follows its first occurrence (a conflicting one was settled alone).
    for (Item& item : r.items) {
      if (item.first < 0 || item.conflict) continue;
      const Item& first = r.items[static_cast<std::size_t>(item.first)];
      if (first.fate == Fate::kSettled && !first.acquired) {
        item.fate = Fate::kSettled;
        Count(&ConsumerCounts::replayed, &ConsumerMetrics::replayed);
        if (metrics) metrics->coalesced->Inc();  // answered here, without a Begin of its own
      } else if (item.fate != Fate::kReturned) {
        item.fate = Fate::kHandedBack;
      }
    }
    r.ack.clear();
    r.ack.reserve(r.items.size());
    // By partition index: whether the partition was cut, and what of it goes back.
    std::vector<char> cut(r.partitions.size(), 0);
    r.back.assign(r.partitions.size(), {});
    r.back_order.clear();
    for (Item& item : r.items) {
      char& partition_cut = cut[item.partition];
      if (!partition_cut && item.fate != Fate::kSettled) partition_cut = 1;
      if (item.fate == Fate::kReturned) {
        // handed back already, with an earlier batch's messages of its partition
      } else if (partition_cut) {
        if (r.back[item.partition].empty()) r.back_order.push_back(item.partition);
        r.back[item.partition].push_back(item.message);
      } else {
        r.ack.push_back(item.message);
      }
    }
    if (r.back_order.empty()) return;
    absl::flat_hash_map<std::string_view, std::uint32_t> cut_partition;
    for (std::uint32_t p : r.back_order) cut_partition.emplace(r.partitions[p], p);
    for (Round* next : later) {
      if (next == nullptr) continue;
      for (Item& item : next->items) {
        if (item.fate == Fate::kReturned) continue;  // handed back already
        auto it = cut_partition.find(item.message->partition);
        if (it == cut_partition.end()) continue;
        r.back[it->second].push_back(item.message);
        item.fate = Fate::kReturned;
        // Begun but never to run here: its key is freed with this batch's (Acknowledge).
        if (item.acquired && !item.executed && !item.lease_lost) r.release.push_back(&item);
      }
    }
  }

  // Finish's second half, once Cut decided: frees the keys acquired but not run (so their
  // redeliveries run at once), hands back and acknowledges.
  Status Acknowledge(Round& r) {
    for (Item& item : r.items) {
      // (One whose lease was lost is the new holder's to finish.)
      if (item.acquired && !item.executed && !item.lease_lost) r.release.push_back(&item);
      // Handed back before its Busy was waited out: Busy is the answer it ended with.
      if (item.busy_uncounted) core::CountBusy(metrics ? &*metrics : nullptr);
      item.busy_uncounted = false;
    }
    for (Item* item : r.release) {
      const Token token = item->acquired->token;
      core::Stopwatch sw;
      auto rel = item->version != 0 ? store.ReleaseVersioned(options.scope, item->entity, token)
                                    : store.Release(options.scope, item->key, token);
      if (metrics) metrics->store_release_seconds->ObserveDuration(sw.Elapsed());
      if (!rel) {
        CountStoreError();  // the key stays in progress until its lease ends
      } else if (*rel == WriteAnswer::kLeaseLost) {
        CountLeaseLost();
      } else if (metrics) {
        metrics->releases->Inc();
      }
      item->acquired.reset();
    }
    r.release.clear();
    milliseconds delay = r.handback_delay;
    if (r.store_failed) delay = std::max(delay, options.backoff);
    std::size_t handed_back = 0;
    for (std::uint32_t partition : r.back_order) {
      const auto& msgs = r.back[partition];
      handed_back += msgs.size();
      if (!broker.Redeliver(msgs, delay).ok()) {
        Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
        r.broker_failed = true;
      }
    }
    Count(&ConsumerCounts::redelivered, &ConsumerMetrics::redelivered, handed_back);
    if (!r.ack.empty() && !broker.Acknowledge(r.ack).ok()) {
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

  // ---- pipelining ----
  //
  // A pipelined RunOnce polls batch N and moves each batch in flight one step on:
  //   1. poll N;
  //   2. take the answers of the store batch in flight: N-1's begins and N-2's completions,
  //      sent together at the end of the previous round (one group commit), so a durable
  //      store's sync ran while step 1 polled;
  //   3. decide what of N-2 is acknowledged, and what goes back together with every later
  //      message of its partition (in N-1 and N: those are then not run, nor begun) (Cut);
  //   4. run N-1's handlers: never before the completions of N-2 are stored;
  //   5. send N's begins with N-1's completions to the store, from the store thread;
  //   6. acknowledge N-2 and hand back what step 3 chose, while that batch is on its way.
  // A batch's handlers run one round after it was polled, and it is acknowledged one round
  // after that. A poll that brings nothing (and Flush) finishes everything in flight.

  // While something is in flight, poll briefly: nothing there means "finish it now".
  static constexpr milliseconds kInFlightPollWait{10};

  // tail: its handlers ran; its completions are in the store batch.
  // ahead: its begins are in the store batch; its handlers have not run yet.
  RoundPtr tail = NoRound();
  RoundPtr ahead = NoRound();
  Timestamp ahead_begun;  // when its begins were sent: its leases run from then
  // While `ahead` runs: the batch just polled, begun once `ahead` has run (TouchOpen).
  Round* polled_behind = nullptr;

  // The store batch in flight, and the thread that sends it (so that a durable store's CPU
  // work, or a shared store's round trip, overlaps the consumer's next poll too).
  struct StoreBatch {
    std::vector<BeginRequest> begins;
    std::vector<CompleteRequest> completes;
    bool sent = false;      // the consumer gave it to the store thread, answers not taken yet
    bool taken = false;     // the store thread took it
    bool answered = false;  // `answers` and `took` are in
    bool answered_at_once = false;  // on the thread that called StartBatch, before it returned
    BatchAnswers answers;
    std::chrono::nanoseconds took{0};
  };
  std::thread store_thread;
  std::mutex batch_mu;
  // Two conditions, so that a store answering inline (on the consumer's thread) wakes nobody:
  // the store thread waits only for work, the consumer only for answers.
  std::condition_variable work_cv;    // batch sent (or quit): for the store thread
  std::condition_variable answer_cv;  // batch answered: for the consumer
  StoreBatch batch;                   // guarded by batch_mu
  bool store_thread_quit = false;
  // The store answered the last StartBatch before it returned: the next one is called from the
  // consumer's thread (guarded by batch_mu).
  bool answer_inline = false;
  // Until the store's StartBatch declines (then its blocking calls, from the store thread).
  std::atomic<bool> store_starts_batches{true};

  void StoreLoop() {
    std::unique_lock lock(batch_mu);
    for (;;) {
      work_cv.wait(lock, [&] { return store_thread_quit || (batch.sent && !batch.taken); });
      if (store_thread_quit) return;
      batch.taken = true;
      // The consumer leaves the requests alone until the answers are in.
      const std::span<const BeginRequest> begins = batch.begins;
      const std::span<const CompleteRequest> completes = batch.completes;
      lock.unlock();
      RunStoreBatch(begins, completes);
      lock.lock();
    }
  }

  void RunStoreBatch(std::span<const BeginRequest> begins,
                     std::span<const CompleteRequest> completes) {
    const std::thread::id caller = std::this_thread::get_id();
    auto answered = [this, caller, sw = core::Stopwatch()](BatchAnswers answers) {
      std::lock_guard lock(batch_mu);
      batch.answers = std::move(answers);
      batch.took = sw.Elapsed();
      batch.answered = true;
      batch.answered_at_once = std::this_thread::get_id() == caller;
      answer_cv.notify_all();
    };
    if (store_starts_batches.load(std::memory_order_relaxed)) {
      if (store.StartBatch(begins, completes, answered)) {
        // A store that answers inside StartBatch (the memory store) has nothing to overlap:
        // the next batch skips the thread hop. One that answers later (from a durable store's
        // flusher) is called from the store thread again.
        std::lock_guard lock(batch_mu);
        answer_inline = batch.answered && batch.answered_at_once;
        return;
      }
      store_starts_batches.store(false, std::memory_order_relaxed);
      std::lock_guard lock(batch_mu);
      answer_inline = false;  // blocking calls: from the store thread, beside the next poll
    }
    // What StartBatch would answer, from the blocking calls: completions first, so a begin of
    // a key completed in the same batch replays it.
    BatchAnswers answers;
    if (!completes.empty()) answers.completes = store.CompleteBatch(completes);
    if (!begins.empty()) answers.begins = store.BeginBatch(begins);
    answered(std::move(answers));
  }

  void Send(std::vector<BeginRequest> begins, std::vector<CompleteRequest> completes) {
    std::unique_lock lock(batch_mu);
    batch.begins = std::move(begins);
    batch.completes = std::move(completes);
    batch.sent = true;
    batch.taken = false;
    batch.answered = batch.begins.empty() && batch.completes.empty();  // nothing to ask
    batch.answers = {};
    batch.took = {};
    if (batch.answered) return;
    if (answer_inline) {
      batch.taken = true;
      const std::span<const BeginRequest> b = batch.begins;
      const std::span<const CompleteRequest> c = batch.completes;
      lock.unlock();
      RunStoreBatch(b, c);
      return;
    }
    if (!store_thread.joinable())
      store_thread = std::thread([this] {
        core::NameThisThread("idem-cons-store");
        StoreLoop();
      });
    work_cv.notify_all();
  }

  // The answers of the batch sent last; empty ones when none was sent.
  BatchAnswers Await(std::chrono::nanoseconds& took) {
    std::unique_lock lock(batch_mu);
    if (!batch.sent) return {};
    answer_cv.wait(lock, [&] { return batch.answered; });
    batch.sent = false;
    batch.begins.clear();
    batch.completes.clear();
    took = batch.took;
    return std::move(batch.answers);
  }

  Result<std::size_t> RunPipelined() {
    const bool in_flight = tail || ahead;
    auto polled =
        PollRound(in_flight ? std::min(options.poll_wait, kInFlightPollWait) : options.poll_wait);
    if (!polled || *polled == nullptr) {
      Status finished = FinishInFlight();
      if (!polled) return polled.error();
      if (!finished.ok()) return finished;
      return std::size_t{0};
    }
    Round& r = **polled;
    RoundPtr finished = Advance(&r);
    // What of this batch was not handed back is begun, with the completions of the batch that
    // just ran; the finished batch is acknowledged while they are on their way.
    std::vector<BeginRequest> requests = Requests(r);
    std::vector<CompleteRequest> completions;
    if (ahead) completions = CompletionRequests(*ahead);
    const Timestamp begun = clock.Now();
    Send(std::move(requests), std::move(completions));
    tail = std::move(ahead);
    ahead = std::move(*polled);
    ahead_begun = begun;
    if (finished) {
      if (Status s = Acknowledge(*finished); !s.ok()) return s;
    }
    return r.items.size();
  }

  // Takes the store batch's answers, decides what of the tail is acknowledged and what goes
  // back (with it, what of `ahead` and `next` follows what goes back), and runs `ahead`'s
  // handlers. Returns the tail, for Acknowledge.
  RoundPtr Advance(Round* next) {
    if (!tail && !ahead) return NoRound();
    std::chrono::nanoseconds took{0};
    BatchAnswers answers = Await(took);
    // The keys `ahead` holds are known before the tail decides what goes back, so that what of
    // `ahead` goes back with it is freed.
    if (ahead && !answers.begins.empty()) NoteBegins(*ahead, answers.begins, took);
    if (tail) {
      if (metrics && !tail->completions.empty()) {
        metrics->store_complete_seconds->ObserveDuration(took);
      }
      StoreCompletions(*tail, rng, std::move(answers.completes));
      Cut(*tail, {ahead.get(), next});
    }
    if (ahead) {
      polled_behind = next;
      SettleAll(*ahead, answers.begins, ahead_begun);
      polled_behind = nullptr;
    }
    return std::move(tail);
  }

  // Runs, completes and acknowledges everything in flight.
  Status FinishInFlight() {
    Status status;
    if (RoundPtr finished = Advance(nullptr)) status = Acknowledge(*finished);
    if (ahead) {
      Send({}, CompletionRequests(*ahead));
      std::chrono::nanoseconds took{0};
      BatchAnswers answers = Await(took);
      if (metrics && !ahead->completions.empty()) {
        metrics->store_complete_seconds->ObserveDuration(took);
      }
      StoreCompletions(*ahead, rng, std::move(answers.completes));
      Status s = Finish(*ahead, {});
      ahead.reset();
      if (status.ok()) status = std::move(s);
    }
    return status;
  }

  // Nothing of what this consumer did is left in flight, and the broker answered the
  // acknowledgements.
  Status Drain() {
    Status s = FinishInFlight();
    if (Status settled = broker.Settle(); !settled.ok()) {
      Count(&ConsumerCounts::broker_errors, &ConsumerMetrics::broker_errors);
      if (s.ok()) s = std::move(settled);
    }
    return s;
  }

  void StopStoreThread() {
    {
      std::lock_guard lock(batch_mu);
      store_thread_quit = true;
      work_cv.notify_all();
    }
    if (store_thread.joinable()) store_thread.join();
  }

  void Run() {
    if (!options_status.ok()) return;  // RunOnce says why
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
  impl_->StopStoreThread();
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
