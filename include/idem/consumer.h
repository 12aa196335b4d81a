// Consumer: the receiver in front of a message broker (Kafka, NATS JetStream, Redis Streams).
// Brokers deliver at least once; the consumer turns their redeliveries into one execution of
// the handler per key.
//
//   auto broker = idem::kafka::OpenKafkaConsumer({...});     // any idem::Broker
//   idem::Consumer consumer(*store, **broker, handler, {.scope = "payments"});
//   consumer.Run();                                          // until Stop()
//
// One round (RunOnce): poll a batch; take each message's key (poison messages -- no key, a key
// that is not valid, a payload that does not parse when the key is in it -- go straight to the
// dead-letter channel); one BeginBatch for the batch's keys; then, partition by partition and
// in broker order, run the handler for the Acquired messages; one CompleteBatch; then
// acknowledge every message that was settled. Replays are acknowledged without running the
// handler; a key that appears twice in one batch is begun once (a later copy whose fingerprint
// differs from the first's is a conflict: dead-lettered).
//
// Order: messages of one partition are never reordered. A handler that fails with a retryable
// error is retried in place (exponential backoff with jitter) up to max_attempts, then
// dead-lettered; the partition waits meanwhile. A key another worker holds (Busy) is begun
// again with backoff until busy_timeout (by default a little longer than the lease, so a dead
// worker's key is taken over inside it); past it the message and the rest of its partition in
// this batch are handed back to the broker (Broker::Redeliver) and the thread moves on. While
// it retries or waits, the batch's leases are extended and its messages touched; a message whose
// lease was lost anyway is handed back without running its handler again.
//
// Failures: a store that cannot answer, a dead-letter publish that fails -> nothing of the
// affected messages is acknowledged; they are handed back to the broker, and the consumer backs
// off. A crash after a handler ran and before its completion was stored lets a later delivery run
// it again after the lease with attempt > 1 (SPEC §3): pass the key downstream.
//
// Versioned messages (SPEC §5, options.versions): a message that names an entity and a version
// is gated by the entity's versions instead of a key. It is begun on its own when its turn in
// the partition comes (BeginVersioned: there is no batch form), and its completion is stored at
// once, so that the entity's next version -- often the next message -- is not Busy behind it.
// A version at or below the entity's highest applied one is Stale: acknowledged without running
// the handler, and counted. The handler's key is "ENTITY#VERSION". A dead-lettered version counts
// as applied. Entities have no lease extension: a handler's runs and retries for one version
// must end within the lease, or another worker may take the version over.
//
// Dead-lettering publishes the message with its original headers plus idem-dlq-reason,
// idem-dlq-attempts, idem-dlq-error, idem-dlq-key and idem-dlq-source to the broker's DLQ, waits
// for the broker's confirmation, then completes the key with a failure outcome and acknowledges.
// A crash between the publish and the acknowledgement can publish it twice (the key header
// lets a DLQ reader see that).
#ifndef IDEM_CONSUMER_H_
#define IDEM_CONSUMER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/metrics.h"
#include "idem/receiver.h"
#include "idem/record.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {

// One message as the broker delivered it.
struct BrokerMessage {
  std::string partition{};  // order is kept within it: "topic/3", a subject, a stream
  std::string position{};   // the broker's id of this delivery: offset, stream sequence, entry id
  std::string payload{};
  std::vector<std::pair<std::string, std::string>> headers{};
  std::uint32_t deliveries = 1;  // how often the broker delivered it, when it knows (else 1)
  std::uint64_t handle = 0;      // the broker adapter's own reference
};

// Why a message goes to the dead-letter channel.
struct DeadLetterInfo {
  std::string_view reason{};  // "no_key", "bad_key", "bad_payload", "bad_version", "conflict",
                              // "permanent", "attempts_exhausted"
  std::uint32_t attempts = 0;
  std::string_view last_error{};
  std::string_view key{};  // empty when the message had none; "ENTITY#VERSION" for a versioned one
};

// Header (field) names added to a dead-lettered message.
inline constexpr std::string_view kDlqReasonHeader = "idem-dlq-reason";
inline constexpr std::string_view kDlqAttemptsHeader = "idem-dlq-attempts";
inline constexpr std::string_view kDlqErrorHeader = "idem-dlq-error";
inline constexpr std::string_view kDlqKeyHeader = "idem-dlq-key";
inline constexpr std::string_view kDlqSourceHeader = "idem-dlq-source";  // partition@position

// The original headers plus the idem-dlq-* ones, for adapters that publish a dead letter.
std::vector<std::pair<std::string, std::string>> DeadLetterHeaders(const BrokerMessage& message,
                                                                   const DeadLetterInfo& info);

// A subscription on one broker, used by one consumer thread. Adapters: src/consumers/*.
class Broker {
 public:
  virtual ~Broker() = default;
  Broker() = default;
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  virtual std::string_view Name() const = 0;  // "kafka", "nats", "redis"

  // Up to `max` messages, waiting at most `wait` for the first one; messages of one partition
  // in broker order. An empty batch when nothing came. kUnavailable when the broker cannot be
  // reached (the consumer backs off and polls again).
  virtual Result<std::vector<BrokerMessage>> Poll(std::size_t max,
                                                  std::chrono::milliseconds wait) = 0;

  // The messages are settled: never deliver them again (Kafka: commit the offsets; JetStream:
  // ack; Redis: XACK). All come from earlier Polls of this broker.
  // An adapter may send the acknowledgement and return before the broker answered (Kafka:
  // the commit's round trip overlaps the next batch); a failure then shows in a later call.
  // Never before the messages are settled: acknowledging is what the consumer does last.
  virtual Status Acknowledge(std::span<const BrokerMessage* const> messages) = 0;

  // Waits until every earlier acknowledgement was answered by the broker (and sends again
  // what failed); the error of one that failed. The consumer calls it from Flush() and when it
  // stops. Default: nothing to wait for (the adapter acknowledges synchronously).
  virtual Status Settle();

  // Hand the messages back unsettled: deliver them again, no sooner than `delay`, in their
  // order, and never lose them across a crash. The consumer passes a message together with
  // every later message of its partition from the same batch.
  virtual Status Redeliver(std::span<const BrokerMessage* const> messages,
                           std::chrono::milliseconds delay) = 0;

  // Publishes the message to the dead-letter channel with DeadLetterHeaders(message, info) and
  // returns once the broker confirmed it.
  virtual Status DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) = 0;

  // The handler of these messages is still working (a long handler, a retry): keep them from
  // being redelivered to another consumer (JetStream: +WPI). Default: nothing to do. While a
  // handler runs it is called from the consumer's lease keeper thread (keep_leases), never at
  // the same time as another call the consumer makes.
  virtual Status Touch(std::span<const BrokerMessage* const> messages);

  // The consumer is done with a batch an earlier Poll returned: it made its last call about each
  // of its messages (Acknowledge or Redeliver; a failed one leaves them to the broker's own
  // redelivery), and nothing refers to them any more. An adapter may keep them to fill in its
  // next Polls, so that their strings' storage is used again instead of allocated for every
  // message (bound what it keeps). Default: the batch is freed.
  virtual void Recycle(std::vector<BrokerMessage> batch);

  // ok when the broker is reachable (for /readyz).
  virtual Status Health() = 0;
};

enum class Verdict : std::uint8_t {
  kSuccess,    // done: the key is completed with the response
  kRetryable,  // try again (backoff), up to max_attempts, then dead-letter
  kPermanent,  // dead-letter now
};
std::string_view VerdictName(Verdict v);  // "success", "retryable", "permanent"

struct HandlerVerdict {
  Verdict verdict = Verdict::kSuccess;
  std::string detail{};  // the response for kSuccess, the error otherwise
};

// The handler gets the key, attempt and token (HandlerContext) and the whole message. A handler
// that throws is a kRetryable failure with the exception's message.
using MessageHandler = std::function<HandlerVerdict(const HandlerContext&, const BrokerMessage&)>;

// Where versioned messages name their entity and version: a header or a JSON pointer each
// (KeySource::Header, KeySource::JsonPointer; the other kinds read nothing).
struct VersionSources {
  KeySource entity = KeySource::Header("Entity-Id");
  KeySource version = KeySource::Header("Entity-Version");
};

struct ConsumerOptions {
  std::string name = "consumer";  // the `consumer` label of its metrics, and log lines
  std::string scope{};            // store scope of the keys
  KeySource key_source = KeySource::Header("Idempotency-Key");
  FingerprintMode fingerprint = FingerprintMode::kNone;  // kJson: a reused key -> "conflict"
  std::size_t max_key_bytes = kDefaultMaxKeyBytes;       // keys and entities
  // Set: a message that names both an entity and a version is a versioned message (above); one
  // that names neither is gated by its key; one that names only one of them, an entity that is
  // not a valid key, or a version that is not a whole number from 1 to 2^64 - 1 in decimal goes
  // to the dead-letter channel ("bad_version"). A version given as a JSON number is exact up
  // to 2^53; send larger ones as a string.
  std::optional<VersionSources> versions{};
  std::size_t batch_size = 256;
  std::chrono::milliseconds poll_wait{100};
  // The batch's leases are extended once half of the lease is gone: before a handler runs,
  // during retries' and Busy waits, and (keep_leases) while a handler runs.
  std::chrono::milliseconds lease{30'000};
  // A thread of the consumer's own extends the batch's leases and touches its messages while
  // a handler runs (it checks every lease / 8), so a handler may run longer than the lease:
  // its keys are taken over only if this process stops extending them (it died, or the store
  // did not answer). false: one handler call must end within lease / 2, or another worker may
  // take its key over and run it too.
  bool keep_leases = true;
  // 0 (or less): a handler call's leases are kept as long as it runs. Else the keeper stops
  // extending them (and touching the messages) this long after the call began, so a handler
  // that hangs does not hold the batch's keys for the life of the process: once the last
  // extension runs out they are taken over, and the broker redelivers the messages.
  std::chrono::milliseconds keep_leases_for{0};
  std::chrono::milliseconds retention{24 * 3600 * 1000};
  std::chrono::milliseconds failure_retention{24 * 3600 * 1000};  // dead-lettered keys
  std::uint32_t max_attempts = 5;          // handler runs per key (takeovers count) before the DLQ
  std::chrono::milliseconds backoff{100};  // first retry delay; doubles each retry
  std::chrono::milliseconds max_backoff{10'000};
  double jitter = 0.5;  // each delay is scaled by a random factor in [1 - jitter, 1]
  std::chrono::milliseconds busy_timeout{0};  // 0: lease + 1 s
  // Overlap the store with the broker: a batch's begins go to the store together with the
  // previous batch's completions (one StartBatch, from a thread of the consumer's own: one
  // group commit) while the next batch is polled. A batch's handlers then run during the next
  // RunOnce, once the completions before them are stored, and it is acknowledged during the
  // one after (or Flush); what an earlier batch hands back takes the later messages of its
  // partition with it, unrun, so order still holds. docs/consumers.md, "Pipelining".
  bool pipeline = false;
  // Time and waits (backoff, Busy). nullptr: the system clock, and waits that Stop() cuts
  // short; a fake clock's SleepFor lets tests run retries without sleeping.
  Clock* clock = nullptr;
  Registry* registry = nullptr;  // nullptr: not counted
};

// What one consumer did since it started (also in its metrics).
struct ConsumerCounts {
  std::uint64_t received = 0;       // messages polled
  std::uint64_t executed = 0;       // handler succeeded and the key was completed
  std::uint64_t replayed = 0;       // duplicates settled without running the handler
  std::uint64_t stale = 0;          // versioned messages at or below their entity's applied version
  std::uint64_t retries = 0;        // handler runs after a retryable failure
  std::uint64_t dead_lettered = 0;  // published to the DLQ (poison included)
  std::uint64_t poison = 0;         // of those, messages without a usable key or payload
  std::uint64_t redelivered = 0;    // handed back to the broker unsettled
  std::uint64_t store_errors = 0;
  std::uint64_t broker_errors = 0;  // poll, acknowledge, dead-letter or redeliver failed
  std::uint64_t lease_lost = 0;     // keys another worker took over while this one held them
};

class Consumer {
 public:
  // The store, broker and registry must outlive the consumer. The destructor Flush()es.
  Consumer(Store& store, Broker& broker, MessageHandler handler, ConsumerOptions options);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // One poll-process-acknowledge round; the number of messages polled, or the error that
  // stopped the round (nothing unsettled was acknowledged). With options.pipeline the round
  // polls a batch and begins it, runs the previous batch's handlers and acknowledges the one
  // before that; what it leaves in flight is finished by the next rounds, or by Flush().
  // kInvalidArgument when the options' lease or retentions are out of range (above 0, at most
  // 10 years), before anything else.
  Result<std::size_t> RunOnce();
  // Runs, completes and acknowledges what pipelined rounds left in flight, then waits for the
  // broker's answers to the acknowledgements (Broker::Settle); ok when nothing was left.
  Status Flush();
  // Rounds until Stop(), then Flush(); backs off after errors. Returns at once when the options
  // are out of range (RunOnce says why).
  void Run();
  // Ends Run() after its current message; safe from any thread.
  void Stop();
  bool stopping() const;

  ConsumerCounts counts() const;
  const ConsumerOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem

#endif  // IDEM_CONSUMER_H_
