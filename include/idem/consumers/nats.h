// The NATS JetStream broker adapter: an idem::Broker over a durable pull consumer with explicit
// acks. Link idem::nats (it brings libnats; idem::idem does not).
//
//   auto broker = idem::nats::OpenNatsConsumer({.url = "nats://127.0.0.1:4222",
//                                               .stream = "ORDERS", .subjects = {"orders.>"},
//                                               .durable = "idem-orders",
//                                               .dlq_subject = "dlq.orders",
//                                               .dlq_stream = "ORDERS_DLQ"});
//   idem::Consumer consumer(*store, **broker, handler, {.scope = "orders"});
//
// Mapping onto idem::Broker:
//   Poll         one fetch (natsSubscription_Fetch) of up to `max` messages (at most
//                max_ack_pending). partition = the message's subject, position = its stream
//                sequence (decimal), deliveries = the consumer's delivery count, headers copied
//                (libnats keeps no order between header names; the values of one name keep
//                theirs). Nothing within `wait` -> an empty batch. Not connected -> kUnavailable;
//                libnats reconnects by itself and the same Broker polls again once it has (the
//                durable lives on the server). A durable deleted behind the Broker's back is
//                created again (deliver-all: the stream is read from its start, and the store
//                answers Replay for what was done).
//                After a restart (Open finds messages of the durable delivered and not yet
//                acknowledged), those are gathered as they come back and handed out together
//                in stream order, and newer messages are NAKed on arrival (to be looked at again
//                a tenth of ack_wait later) until every one of those came back, or ack_wait +
//                1 s passed (twice that when the server still counts some of them pending
//                then): each subject's order holds across crashes. A subject the consumer
//                hands a message of back is held as after Redeliver, what the restart hold
//                released included.
//   Acknowledge  +ACK each message, then a flush (a round trip to the server), so the acks
//                have reached the server when it returns ok; kUnavailable otherwise.
//   Redeliver    -NAK with the delay, message by message in the order given. JetStream keeps
//                that order among the naked messages; a later message of the subject that was
//                not in the batch may still be delivered before them (max_ack_pending > 1).
//   Touch        +WPI (in progress): resets the ack_wait timer of each message.
//   DeadLetter   a JetStream publish to dlq_subject (stored by dlq_stream) with
//                DeadLetterHeaders() as NATS headers (minus Nats-Expected-*, publish
//                preconditions of the source stream, and minus empty values, e.g. the key
//                of a message that had none: libnats 3.4 cannot read an empty header value
//                back) and the same payload, after its PubAck.
//                Without a Nats-Msg-Id of its own, the dead letter gets "<stream>:<sequence>"
//                as its message id, so a repeat after a crash within the DLQ stream's
//                duplicate window is stored once.
//   Health       ok while the connection is up.
//
// Streams: with create_streams, Open creates `stream` (file storage, `subjects`) and
// `dlq_stream` (file storage, dlq_subject) when they do not exist; existing streams are used
// as they are (Open checks that they exist). The durable consumer is created, or updated to this
// config, with explicit acks, deliver-all, no max_deliver (idem dead-letters by its own count).
// It filters on `subjects` only when the stream holds other subjects too (nats-server 2.9
// delivers about a quarter slower through a filtered consumer); then `subjects` must be one
// subject (2.9 consumers take one filter), else Open fails with kFailedPrecondition.
//
// Thread-safety: one consumer thread calls Poll/Acknowledge/Redeliver/DeadLetter/Touch;
// Health may be called from any thread.
#ifndef IDEM_CONSUMERS_NATS_H_
#define IDEM_CONSUMERS_NATS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/consumer.h"
#include "idem/status.h"

namespace idem::nats {

struct NatsConsumerConfig {
  std::string url = "nats://127.0.0.1:4222";  // one or more, comma separated
  std::string stream{};                       // the stream to consume (required)
  // The stream's subjects when it is created. When the stream exists with more subjects than
  // these, the one subject given is the consumer's filter. Empty: the stream must exist and the
  // consumer reads all of it.
  std::vector<std::string> subjects{};
  std::string durable{};      // the durable consumer's name (required, no '.', '*', '>')
  std::string dlq_subject{};  // where dead letters go (required)
  std::string dlq_stream{};   // the stream that stores dlq_subject (required)
  bool create_streams = true;
  std::chrono::milliseconds ack_wait{30'000};  // unacked this long -> delivered again
  int max_ack_pending = 1000;                  // unacked messages the server lets out at once
  std::chrono::milliseconds connect_timeout{2'000};
  // JetStream API calls (stream and consumer management) and dead-letter PubAcks; also the
  // flush after acks.
  std::chrono::milliseconds request_timeout{5'000};
  std::chrono::milliseconds reconnect_wait{250};  // between reconnect attempts (forever)
  // An empty poll checks this often that the durable still exists, and creates it again if it
  // was deleted (a pull request to a deleted consumer gets no answer at all).
  std::chrono::milliseconds consumer_check_interval{5'000};
  std::string connection_name = "idem";
};

// Connects (retrying for connect_timeout), creates or checks the streams and the durable, and
// binds a pull subscription to it. kInvalidArgument naming the option that is wrong;
// kUnavailable when the server cannot be reached; kFailedPrecondition when a stream is missing
// and create_streams is false, or the server refuses the stream or consumer config.
Result<std::unique_ptr<Broker>> OpenNatsConsumer(const NatsConsumerConfig& config);

// ---- For tests and benchmarks ------------------------------------------------------------

using Headers = std::vector<std::pair<std::string, std::string>>;

// A JetStream publisher. Not thread-safe.
class Publisher {
 public:
  // Connects to `url`. kUnavailable when the server cannot be reached.
  static Result<std::unique_ptr<Publisher>> Open(const std::string& url);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Creates stream `name` (file storage) over `subjects` if it does not exist.
  Status EnsureStream(std::string_view name, const std::vector<std::string>& subjects);
  // Deletes stream `name`; ok if it did not exist.
  Status DeleteStream(std::string_view name);
  // Publishes and waits for the PubAck; the stored sequence.
  Result<std::uint64_t> Publish(std::string_view subject, std::string_view payload,
                                const Headers& headers = {});
  // Publishes without waiting; with 4000 PubAcks outstanding it waits (up to 10 s) for some...
  Status PublishAsync(std::string_view subject, std::string_view payload,
                      const Headers& headers = {});
  // ...then waits until every PubAck of those came: kUnavailable when one failed or `timeout`
  // passed.
  Status WaitPublished(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit Publisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One message as stored in a stream.
struct StoredMessage {
  std::string subject;
  std::uint64_t sequence = 0;
  std::string payload;
  Headers headers;
};

// Every message in `stream`, in sequence order (by direct reads, no consumer created).
Result<std::vector<StoredMessage>> ReadStream(const std::string& url, std::string_view stream);

}  // namespace idem::nats

#endif  // IDEM_CONSUMERS_NATS_H_
