// The Kafka adapter of the consumer core: an idem::Broker over a librdkafka consumer group.
// Link idem::kafka (it brings librdkafka; idem::idem does not).
//
//   auto broker = idem::kafka::OpenKafkaConsumer(
//       {.brokers = "kafka:9092", .group = "payments", .topics = {"orders"},
//        .dlq_topic = "orders.dlq"});
//   if (!broker) { /* kInvalidArgument: a bad setting, named in the message */ }
//   idem::Consumer consumer(*store, **broker, handler, {.scope = "payments"});
//
// Group: enable.auto.commit=false, enable.auto.offset.store=false, auto.offset.reset=earliest,
// partition.assignment.strategy=cooperative-sticky (incremental rebalances: a consumer keeps
// the partitions it is not asked to give up and keeps working on them).
//
// Messages: partition "topic/N", position the offset in decimal, the Kafka headers in order,
// deliveries 1 (or how often this adapter handed the offset back with Redeliver, plus one).
// The Kafka message key is not a header; the core takes the idempotency key from a header or
// the payload (ConsumerOptions::key_source).
//
// Acknowledge commits, synchronously, offset+1 of the highest acknowledged message of each
// partition. It never commits past a message that Redeliver handed back and that has not been
// acknowledged since: Redeliver seeks the partition back to that offset and pauses it until the
// delay is over (a later Poll resumes it), and an acknowledgement of a later message of that
// partition (which Kafka would deliver again anyway) does not move its commit past it.
// Offsets are only ever committed forwards; a message acknowledged twice is harmless. A commit
// the group refuses (while it rebalances) fails with kUnavailable and stays pending: the next
// Poll or Acknowledge commits it, unless the partition is revoked first (then its new owner
// reads those messages again, and the store answers Replay).
//
// Rebalances: librdkafka calls the adapter's rebalance callback only from inside Poll, so while
// the core runs a batch (handlers, CompleteBatch, Acknowledge all happen between two Polls) no
// partition moves. On a revoke the adapter drops what it buffered of the revoked partitions and
// their state; an Acknowledge or Redeliver of one of their messages afterwards is ignored (the
// new owner reads them again from the last commit, and the store answers Replay or Busy there).
// Callers that keep keys beyond one batch must finish or release in-flight keys of revoked
// partitions before they move, i.e. before their next Poll. With ConsumerOptions::pipeline the
// previous batch is still completing during the Poll that gives its partitions up: its
// acknowledgement comes too late to commit, and the new owner waits (Busy) until its completion
// lands, then answers Replay; effects still happen once. Processing a batch must take less than
// max.poll.interval.ms (default 300 s), or the group evicts the consumer.
//
// DeadLetter produces to dlq_topic the same payload and Kafka key with
// DeadLetterHeaders(message, info) as headers, and waits for the delivery report (a failure,
// or none within 35 s -> kUnavailable; its message.timeout.ms is 30 s). No dlq_topic ->
// kFailedPrecondition. The extra properties apply to its producer too (those only
// a consumer knows are ignored there).
//
// Errors: a fatal librdkafka error, or brokers that cannot be reached by any call ->
// kUnavailable. Partition EOF, a transient broker disconnect (librdkafka reconnects) and
// rebalance notices are not errors.
//
// Not thread-safe: one consumer thread uses a broker (as idem::Broker says), except Health,
// which any thread may call (readiness checks). The Producer below is thread-safe.
#ifndef IDEM_CONSUMERS_KAFKA_H_
#define IDEM_CONSUMERS_KAFKA_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/consumer.h"
#include "idem/status.h"

namespace idem::kafka {

// Below this, a heartbeat (a third of the session) is due every few milliseconds, and the group
// drops a consumer that spends longer than the session between two polls on one batch.
inline constexpr std::chrono::milliseconds kMinSessionTimeout{1000};

struct KafkaConsumerConfig {
  std::string brokers{};              // bootstrap.servers: "host:port,host:port"
  std::string group{};                // group.id; required
  std::vector<std::string> topics{};  // at least one
  std::string dlq_topic{};            // where DeadLetter publishes; empty: DeadLetter fails
  std::string client_id{};            // client.id; empty: librdkafka's default
  std::chrono::milliseconds session_timeout{45'000};  // session.timeout.ms, >= kMinSessionTimeout
  // More librdkafka properties (name, value), applied last, so they override the above
  // (except the four group settings listed at the top, which the adapter relies on).
  std::vector<std::pair<std::string, std::string>> properties{};
};

// A consumer subscribed to config.topics in config.group. kInvalidArgument when a setting is
// missing or librdkafka refuses it (the message names the property). Does not wait for the
// brokers: the first Poll joins the group.
Result<std::unique_ptr<Broker>> OpenKafkaConsumer(const KafkaConsumerConfig& config);

// ---- For tests, benchmarks and tools ----

using Headers = std::vector<std::pair<std::string, std::string>>;

// An idempotent producer (acks=all). Thread-safe.
class Producer {
 public:
  // properties: more librdkafka properties, applied last.
  static Result<Producer> Open(
      const std::string& brokers,
      const std::vector<std::pair<std::string, std::string>>& properties = {});
  Producer(Producer&&) noexcept;
  Producer& operator=(Producer&&) noexcept;
  ~Producer();  // waits up to 10 s for messages still in flight

  // Queues one message; partition -1: by the key's hash (librdkafka's default partitioner).
  // An empty key is sent as no key. kResourceExhausted when the local queue is full (Flush,
  // then publish again), kInvalidArgument for an unknown topic or partition.
  Status Publish(std::string_view topic, std::int32_t partition, std::string_view key,
                 std::string_view payload, const Headers& headers = {});
  // Waits until every queued message is delivered or failed. kUnavailable if one failed since
  // the last Flush (the first failure's error), or if `timeout` ran out first.
  Status Flush(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit Producer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One message as stored in a topic.
struct TopicMessage {
  std::string topic{};
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::optional<std::string> key{};  // nullopt: the message had no key
  std::string payload{};
  Headers headers{};
};

// Every message of `topic`, from the beginning of each partition to its high watermark at the
// time of the call, ordered by partition then offset (no consumer group; nothing committed).
// kUnavailable if that cannot be read within `timeout`.
Result<std::vector<TopicMessage>> ReadTopic(const std::string& brokers, const std::string& topic,
                                            std::chrono::milliseconds timeout);

}  // namespace idem::kafka

#endif  // IDEM_CONSUMERS_KAFKA_H_
