// `idemd consume`'s configuration: a TOML file with the store, the admin listener and one
// [[consumer]] table per subscription, then flags that override the top-level options.
//
//   store = "log:/var/lib/idemd-consume"
//   admin = "127.0.0.1:9091"
//
//   [[consumer]]
//   name = "payments"                       # metrics label, default scope
//   broker = "kafka"                        # kafka | nats | redis
//   url = "127.0.0.1:9092"                  # bootstrap list | nats://host:port | redis://host:port
//   topics = ["payments"]                   # Kafka topics | Redis streams | JetStream subjects
//   group = "billing"                       # Kafka group | Redis group | JetStream durable
//   dlq = "payments.dlq"                    # topic | stream | subject
//   handler = "http://127.0.0.1:9000/charges"
//
// The value syntax (durations, status ranges, errors naming FILE:LINE: OPTION) is the gateway's
// (gateway/config_values.h). Every option is in ConsumeHelpText() and docs/consumers.md.
#ifndef IDEM_CONSUME_CONFIG_H_
#define IDEM_CONSUME_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/config.h"
#include "idem/receiver.h"
#include "idem/status.h"

namespace idem::consume {

enum class BrokerKind : std::uint8_t { kKafka, kNats, kRedis };
std::string_view BrokerKindName(BrokerKind k);  // "kafka", "nats", "redis"

struct ConsumerConfig {
  std::string name{};
  // "FILE:LINE" of its [[consumer]] table: problems only the broker's open finds (a JetStream
  // DLQ subject inside the stream, a Redis stream the group does not read) are reported there.
  std::string defined_at{};
  BrokerKind broker = BrokerKind::kKafka;
  std::string url{};
  std::vector<std::string> topics{};
  std::string group{};
  std::string dlq{};
  std::string stream{};                   // nats: the stream (required)
  std::string dlq_stream{};               // nats: the stream of dlq (default: stream + "_DLQ")
  std::string consumer_name{};            // redis: this process's name in the group (default: name)
  std::string payload_field = "payload";  // redis
  std::chrono::milliseconds ack_wait{30'000};                     // nats
  std::chrono::milliseconds claim_idle{30'000};                   // redis
  std::chrono::milliseconds session_timeout{45'000};              // kafka, at least 1 s
  std::vector<std::pair<std::string, std::string>> properties{};  // kafka, librdkafka's own

  // The handler: an HTTP POST of the payload.
  std::string handler{};  // http://host[:port]/path
  std::chrono::milliseconds handler_timeout{10'000};
  std::string key_header = "Idempotency-Key";          // the key, on the handler's request
  std::string attempt_header = "Idempotency-Attempt";  // the attempt number, likewise
  // Statuses that are a permanent failure (dead-letter at once); 2xx is success, anything else
  // (and no answer) is retryable.
  std::vector<gateway::StatusRange> permanent_statuses{
      {400, 400}, {403, 404}, {405, 405}, {410, 410}, {413, 413}, {415, 415}, {422, 422}};
  std::vector<std::string> forward_headers{};  // message headers copied onto the request

  // The gate.
  std::string scope{};  // default: name
  KeySource key = KeySource::Header("Idempotency-Key");
  // Versioned messages (SPEC §5): where a message names its entity and its version (a header
  // or a JSON pointer each); both or neither (ConsumerOptions::versions).
  std::optional<KeySource> entity{};
  std::optional<KeySource> version{};
  FingerprintMode fingerprint = FingerprintMode::kNone;
  std::size_t batch = 256;
  std::chrono::milliseconds poll_wait{100};
  std::chrono::milliseconds lease{30'000};
  std::chrono::milliseconds retention{24 * 3600 * 1000};
  std::chrono::milliseconds failure_retention{24 * 3600 * 1000};
  std::uint32_t max_attempts = 5;
  std::chrono::milliseconds backoff{100};
  std::chrono::milliseconds max_backoff{10'000};
  std::chrono::milliseconds busy_timeout{0};  // 0: lease + 1 s
  // Overlap a batch's completion with the next batch's poll and begin (every broker; the NATS
  // adapter orders what a crash left pending, docs/nats.md).
  bool pipeline = true;
};

struct ConsumeConfig {
  std::string store = "log:./idemd-consume-data";
  gateway::Endpoint admin{"127.0.0.1", 9091};
  std::string log_level = "info";
  std::vector<ConsumerConfig> consumers{};
};

// kInvalidArgument "FILE:LINE: OPTION: what is wrong" (consumer options are named
// "consumer.lease" and so on), "FILE:LINE:COLUMN: TOML syntax error: ...", "FILE: cannot open".
Result<ConsumeConfig> ParseConsumeConfig(std::string_view toml, std::string_view file_name);

// idemd consume --config FILE [--store URL] [--admin HOST:PORT] [--log-level LEVEL] [--help].
// An empty optional: --help was given.
Result<std::optional<ConsumeConfig>> ParseConsumeCommandLine(int argc, const char* const* argv);
std::string ConsumeHelpText();

}  // namespace idem::consume

#endif  // IDEM_CONSUME_CONFIG_H_
