// The Redis Streams broker: an idem::Broker that reads one or more streams as one consumer of a
// consumer group (XREADGROUP), acknowledges with XACK and dead-letters with XADD to a stream.
// Link idem::redis_streams (it brings hiredis; idem::idem does not).
//
//   auto broker = idem::redis_streams::OpenRedisStreamsConsumer(
//       {.url = "redis://127.0.0.1:6379", .streams = {"orders"}, .group = "billing",
//        .consumer = "billing-1", .dlq_stream = "orders.dlq"});
//   idem::Consumer consumer(*store, **broker, handler, {.scope = "billing"});
//
// Messages: partition = the stream's name, position = the entry id ("1700000000000-0"),
// payload = the value of `payload_field`, headers = every other field in entry order.
// deliveries = Redis's delivery count for entries read back from the pending list or claimed
// (XPENDING), 1 for new entries, one more for each Redeliver.
//
// Poll serves, per stream, older entries before newer ones: first entries handed back with
// Redeliver once their delay is over, then this consumer's own pending entries (after a
// restart or a reconnect: XREADGROUP ... 0, which is why `consumer` must be a stable name), then
// entries of other consumers of the group left pending longer than `claim_idle` (XAUTOCLAIM,
// every `claim_interval`), then new entries (XREADGROUP ... >). A stream that has entries
// waiting out a Redeliver delay delivers nothing newer until they are delivered again.
//
// Redeliver keeps the entries pending in Redis (so a crash loses none: the restarted consumer
// reads them back from its pending list) and holds them in memory until their delay is over.
// Touch resets the idle time of the messages (XCLAIM ... JUSTID) so that no other consumer
// claims them; entries the broker holds (handed back, or read ahead) are touched with them, and
// by Poll every `claim_interval`.
//
// Pipelining: a Poll that returns a full batch already asks for the next two (read-ahead), and
// Acknowledge sends its XACKs without waiting for their answers, which a later call reads. So
// Redis reads the next batches and acknowledges the last one while the consumer works. Entries
// read ahead are pending on this consumer like delivered ones (up to two batches more).
//
// Failures: a connection that breaks, a server that does not answer within `timeout`, or an
// error reply gives kUnavailable; the next call reconnects (and creates the group again when
// `create_group`) and reads this consumer's pending list again. An XACK that fails after
// Acknowledge returned fails the next call instead, and its entries are delivered again (the
// store answers Replay). A reply that was lost may have taken effect: an XACK that seemed to
// fail may have happened, a dead letter may be published twice (the DLQ key header says so).
//
// One consumer thread uses the broker (Poll, Acknowledge, Redeliver, DeadLetter, Touch);
// Health may be called from any thread at the same time (it has its own connection).
#ifndef IDEM_CONSUMERS_REDIS_STREAMS_H_
#define IDEM_CONSUMERS_REDIS_STREAMS_H_

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/consumer.h"
#include "idem/status.h"

namespace idem::redis_streams {

struct RedisStreamsConfig {
  // redis://[[user]:password@]host[:port][/db]; the port defaults to 6379. One node: streams
  // are read together with one XREADGROUP, which a Redis Cluster allows only in one slot.
  std::string url{};
  std::vector<std::string> streams{};  // one or more, each read in entry order
  std::string group{};                 // the consumer group
  // This consumer's name in the group. Keep it stable across restarts: a restarted process
  // finds its own pending entries under it. Two live processes must not share it.
  std::string consumer{};
  std::string dlq_stream{};  // dead letters are XADDed here
  std::string payload_field = "payload";
  // XGROUP CREATE stream group 0 MKSTREAM when the group is missing (the group then reads each
  // stream from its start). false: a missing group is kFailedPrecondition at open.
  bool create_group = true;
  // An entry pending on another consumer this long is taken over (XAUTOCLAIM min-idle-time).
  std::chrono::milliseconds claim_idle{30'000};
  // How often Poll looks for such entries.
  std::chrono::milliseconds claim_interval{5'000};
  // Connecting, and each command (a blocking read: its wait plus this).
  std::chrono::milliseconds timeout{5'000};
};

// Checks the config (kInvalidArgument naming the option), connects and prepares the group
// (kUnavailable when the server cannot be reached; kFailedPrecondition when the group is
// missing and create_group is false).
Result<std::unique_ptr<Broker>> OpenRedisStreamsConsumer(const RedisStreamsConfig& config);

// ---- For tests, benchmarks and tools: one connection per call. ----

using Fields = std::vector<std::pair<std::string, std::string>>;

struct StreamEntry {
  std::string payload{};
  Fields headers{};  // further fields, after payload_field
};

// XADD stream * payload_field payload headers...; the new entry's id.
Result<std::string> Publish(std::string_view url, std::string_view stream, std::string_view payload,
                            const Fields& headers = {}, std::string_view payload_field = "payload");

// The same for many entries, pipelined (in order); ok once every XADD was answered.
Status Publish(std::string_view url, std::string_view stream, std::span<const StreamEntry> entries,
               std::string_view payload_field = "payload");

// Every entry of the stream (XRANGE - +) as a BrokerMessage as the consumer would make it
// (deliveries 1, handle 0). Empty when the stream does not exist.
Result<std::vector<BrokerMessage>> ReadStream(std::string_view url, std::string_view stream,
                                              std::string_view payload_field = "payload");

}  // namespace idem::redis_streams

#endif  // IDEM_CONSUMERS_REDIS_STREAMS_H_
