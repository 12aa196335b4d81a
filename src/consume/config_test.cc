// idemd consume's configuration: every option read, defaults, and errors that name the file,
// line and option.
#include "consume/config.h"

#include <gtest/gtest.h>

#include <string>

namespace idem::consume {
namespace {

using std::chrono::milliseconds;

constexpr std::string_view kMinimal = R"(
[[consumer]]
name = "payments"
broker = "kafka"
url = "127.0.0.1:9092"
topics = ["payments"]
group = "billing"
dlq = "payments.dlq"
handler = "http://127.0.0.1:9000/charges"
)";

std::string ErrorOf(std::string_view toml) {
  auto c = ParseConsumeConfig(toml, "c.toml");
  if (c) return "<parsed>";
  return c.error().message();
}

TEST(ConsumeConfigTest, MinimalKafkaConsumerGetsTheDefaults) {
  auto c = ParseConsumeConfig(kMinimal, "c.toml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->store, "log:./idemd-consume-data");
  EXPECT_EQ(c->admin.port, 9091);
  ASSERT_EQ(c->consumers.size(), 1u);
  const ConsumerConfig& k = c->consumers[0];
  EXPECT_EQ(k.broker, BrokerKind::kKafka);
  EXPECT_EQ(k.scope, "payments");
  EXPECT_EQ(k.consumer_name, "payments");
  EXPECT_EQ(k.key.kind, KeySource::Kind::kHeader);
  EXPECT_EQ(k.key.name, "Idempotency-Key");
  EXPECT_EQ(k.batch, 256u);
  EXPECT_EQ(k.max_attempts, 5u);
  EXPECT_EQ(k.lease, milliseconds(30'000));
  EXPECT_EQ(k.pipeline, true);
}

// Every broker is pipelined unless the config says otherwise; NATS too since its adapter
// orders what a crash left pending (docs/nats.md).
TEST(ConsumeConfigTest, EveryBrokerIsPipelinedByDefault) {
  for (std::string_view broker : {"kafka", "nats", "redis"}) {
    std::string toml(kMinimal);
    toml.replace(toml.find("\"kafka\""), 7, "\"" + std::string(broker) + "\"");
    if (broker == "nats") toml += "stream = \"PAYMENTS\"\n";
    auto c = ParseConsumeConfig(toml, "c.toml");
    ASSERT_TRUE(c.has_value()) << broker << ": " << c.error().message();
    EXPECT_EQ(c->consumers[0].pipeline, true) << broker;
  }
}

TEST(ConsumeConfigTest, EveryOptionIsRead) {
  auto c = ParseConsumeConfig(R"(
store = "memory:"
admin = "127.0.0.1:0"
log_level = "warn"

[[consumer]]
name = "orders"
broker = "nats"
url = "nats://127.0.0.1:4222"
stream = "ORDERS"
topics = ["orders.>"]
group = "idem-orders"
dlq = "orders.dlq"
ack_wait = "5s"
handler = "http://127.0.0.1:9000/orders"
handler_timeout = "2s"
key_header = "X-Key"
attempt_header = "X-Attempt"
permanent_statuses = ["4xx", 501]
forward_headers = ["traceparent"]
scope = "orders-v2"
key = "json:/order/id"
fingerprint = "json"
batch = 50
poll_wait = "20ms"
lease = "10s"
retention = "1h"
failure_retention = "2h"
max_attempts = 7
backoff = "50ms"
max_backoff = "2s"
busy_timeout = "3s"
pipeline = false

[[consumer]]
name = "streams"
broker = "redis"
url = "redis://127.0.0.1:6379"
topics = ["a", "b"]
group = "g"
dlq = "dead"
consumer_name = "host-1"
payload_field = "body"
claim_idle = "1m"
handler = "http://127.0.0.1:9000/"
properties = { ignored = "only kafka reads these" }
)",
                              "c.toml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  EXPECT_EQ(c->store, "memory:");
  EXPECT_EQ(c->log_level, "warn");
  ASSERT_EQ(c->consumers.size(), 2u);
  const ConsumerConfig& n = c->consumers[0];
  EXPECT_EQ(n.broker, BrokerKind::kNats);
  EXPECT_EQ(n.stream, "ORDERS");
  EXPECT_EQ(n.dlq_stream, "ORDERS_DLQ");
  EXPECT_EQ(n.ack_wait, milliseconds(5000));
  EXPECT_EQ(n.key_header, "X-Key");
  EXPECT_EQ(n.attempt_header, "X-Attempt");
  ASSERT_EQ(n.permanent_statuses.size(), 2u);
  EXPECT_TRUE(n.permanent_statuses[0].Contains(429));
  EXPECT_TRUE(n.permanent_statuses[1].Contains(501));
  EXPECT_EQ(n.forward_headers, std::vector<std::string>{"traceparent"});
  EXPECT_EQ(n.scope, "orders-v2");
  EXPECT_EQ(n.key.kind, KeySource::Kind::kJsonPointer);
  EXPECT_EQ(n.key.name, "/order/id");
  EXPECT_EQ(n.fingerprint, FingerprintMode::kJson);
  EXPECT_EQ(n.batch, 50u);
  EXPECT_EQ(n.poll_wait, milliseconds(20));
  EXPECT_EQ(n.retention, milliseconds(3'600'000));
  EXPECT_EQ(n.failure_retention, milliseconds(7'200'000));
  EXPECT_EQ(n.max_attempts, 7u);
  EXPECT_EQ(n.backoff, milliseconds(50));
  EXPECT_EQ(n.max_backoff, milliseconds(2000));
  EXPECT_EQ(n.busy_timeout, milliseconds(3000));
  EXPECT_EQ(n.pipeline, false);
  EXPECT_EQ(c->consumers[1].pipeline, true);  // redis: on by default
  const ConsumerConfig& r = c->consumers[1];
  EXPECT_EQ(r.broker, BrokerKind::kRedis);
  EXPECT_EQ(r.topics, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.consumer_name, "host-1");
  EXPECT_EQ(r.payload_field, "body");
  EXPECT_EQ(r.claim_idle, milliseconds(60'000));
  ASSERT_EQ(r.properties.size(), 1u);
}

TEST(ConsumeConfigTest, KafkaPropertiesKeepTheirOrderAndTypes) {
  auto c = ParseConsumeConfig(std::string(kMinimal) + R"(session_timeout = "3s"
properties = { "fetch.wait.max.ms" = 10, "enable.partition.eof" = false, "client.rack" = "r1" }
)",
                              "c.toml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  const auto& p = c->consumers[0].properties;
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], (std::pair<std::string, std::string>{"fetch.wait.max.ms", "10"}));
  EXPECT_EQ(p[1], (std::pair<std::string, std::string>{"enable.partition.eof", "false"}));
  EXPECT_EQ(c->consumers[0].session_timeout, milliseconds(3000));
}

// Leases are extended while a handler call runs (ConsumerOptions::keep_leases), so a lease
// shorter than handler_timeout is no longer refused.
TEST(ConsumeConfigTest, ALeaseMayBeShorterThanTheHandlerTimeout) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "lease = \"5s\"\nhandler_timeout = \"1m\"\n"),
            "<parsed>");
}

TEST(ConsumeConfigTest, ErrorsNameTheFileLineAndOption) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "batch = 0\n"),
            "c.toml:10: consumer.batch: 0 is not within 1..100000");
  // A stopping consumer finishes its current poll; a lease or retention above what the stores
  // take would fail every message.
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "poll_wait = \"11s\"\n"),
            "c.toml:10: consumer.poll_wait: 11s is above the maximum, 10s (a consumer stopping "
            "finishes its current poll)");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "retention = \"200000d\"\n"),
            "c.toml:10: consumer.retention: \"200000d\" is above the longest duration idem "
            "accepts, 10 years");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "colour = \"red\"\n"),
            "c.toml:10: consumer.colour: unknown option");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "key = \"body\"\n"),
            "c.toml:10: consumer.key: \"body\" is not a key source (write \"header:NAME\", "
            "\"json:/pointer\" or \"fingerprint\")");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "permanent_statuses = [\"2xx\"]\n"),
            "c.toml:10: consumer.permanent_statuses: a 1xx or 2xx status cannot be a failure");
  EXPECT_EQ(ErrorOf("batch = 5\n" + std::string(kMinimal)),
            "c.toml:1: batch: unknown option (consumer options go in a [[consumer]] table)");
  EXPECT_EQ(ErrorOf("store = \"mysql://x\"\n" + std::string(kMinimal)).substr(0, 15),
            "c.toml:1: store");
  EXPECT_EQ(ErrorOf("store = \"memory:\"\n"), "c.toml: no [[consumer]] table: nothing to consume");
  EXPECT_EQ(ErrorOf("[[consumer]\n").substr(0, 9), "c.toml:1:");
  EXPECT_NE(ErrorOf("[[consumer]]\nname = \"x\"\nbroker = \"rabbit\"\n")
                .find("\"rabbit\" is not a broker (kafka, nats or redis)"),
            std::string::npos);
  EXPECT_EQ(ErrorOf(R"([[consumer]]
name = "x"
broker = "redis"
url = "redis://h:1"
group = "g"
handler = "http://h:1/"
topics = ["s"]
)"),
            "c.toml:1: consumer.dlq: missing (poison and failing messages go there)");
  EXPECT_EQ(ErrorOf(R"([[consumer]]
name = "x"
broker = "nats"
url = "nats://h:1"
group = "g"
dlq = "d"
handler = "http://h:1/"
)"),
            "c.toml:1: consumer.stream: missing (the JetStream stream)");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "\n" + std::string(kMinimal)),
            "c.toml:12: consumer.name: \"payments\" is used by two consumers");
  std::string https(kMinimal);
  https.replace(https.find("http://"), 7, "https://");
  EXPECT_NE(ErrorOf(https).find("c.toml:9: consumer.handler: \"https://127.0.0.1:9000/charges\": "
                                "https is not supported"),
            std::string::npos)
      << ErrorOf(https);
}

// Mistakes that used to pass: no broker (it meant Kafka, which then consumed nothing from a
// NATS or Redis URL), the attempt header named as the key header (the attempt replaced the
// key), a DLQ that is a topic read (a poison message looped forever), a topic twice.
TEST(ConsumeConfigTest, MistakesThatUsedToPassAreErrors) {
  std::string no_broker(kMinimal);
  no_broker.erase(no_broker.find("broker = \"kafka\"\n"),
                  std::string_view("broker = \"kafka\"\n").size());
  EXPECT_EQ(ErrorOf(no_broker), "c.toml:2: consumer.broker: missing (kafka, nats or redis)");
  EXPECT_EQ(
      ErrorOf(std::string(kMinimal) + "attempt_header = \"idempotency-key\"\n"),
      "c.toml:10: consumer.attempt_header: \"idempotency-key\" is key_header too: the attempt "
      "number would replace the key on the handler's request");
  std::string loop(kMinimal);
  loop.replace(loop.find("\"payments.dlq\""), std::string_view("\"payments.dlq\"").size(),
               "\"payments\"");
  EXPECT_EQ(
      ErrorOf(loop),
      "c.toml:8: consumer.dlq: \"payments\" is also one of the topics read: every dead letter "
      "would be consumed again, and a poison message dead-lettered forever");
  std::string twice(kMinimal);
  twice.replace(twice.find("[\"payments\"]"), std::string_view("[\"payments\"]").size(),
                "[\"payments\", \"orders\", \"payments\"]");
  EXPECT_EQ(ErrorOf(twice), "c.toml:6: consumer.topics: \"payments\" is listed twice");
  // A 1 ms session made a heartbeat due every millisecond: the group dropped the consumer.
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "session_timeout = \"999ms\"\n"),
            "c.toml:10: consumer.session_timeout: is below 1s: the group would drop a consumer "
            "between two polls (its heartbeat is a third of it)");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "session_timeout = \"1s\"\n"), "<parsed>");
}

// Problems only the broker's open finds are reported at the consumer's table.
TEST(ConsumeConfigTest, EachConsumerKnowsWhereItIsDefined) {
  auto c = ParseConsumeConfig(
      std::string(kMinimal) + std::string(kMinimal).replace(kMinimal.find("payments"), 8, "second"),
      "c.toml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  ASSERT_EQ(c->consumers.size(), 2u);
  EXPECT_EQ(c->consumers[0].defined_at, "c.toml:2");
  EXPECT_EQ(c->consumers[1].defined_at, "c.toml:11");
}

// A check of one option against another names the line of the option it blames, not the
// [[consumer]] table's.
TEST(ConsumeConfigTest, ACheckAcrossOptionsNamesTheOptionsLine) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "backoff = \"5s\"\nmax_backoff = \"1s\"\n"),
            "c.toml:11: consumer.max_backoff: is below backoff");
}

// Versioned messages: where the entity and version are, both or neither.
TEST(ConsumeConfigTest, EntityAndVersionComeTogether) {
  auto c = ParseConsumeConfig(
      std::string(kMinimal) + "entity = \"header:Account-Id\"\nversion = \"json:/seq\"\n",
      "c.toml");
  ASSERT_TRUE(c.has_value()) << c.error().message();
  const ConsumerConfig& v = c->consumers[0];
  ASSERT_TRUE(v.entity.has_value() && v.version.has_value());
  EXPECT_EQ(v.entity->kind, KeySource::Kind::kHeader);
  EXPECT_EQ(v.entity->name, "Account-Id");
  EXPECT_EQ(v.version->kind, KeySource::Kind::kJsonPointer);
  EXPECT_EQ(v.version->name, "/seq");
  EXPECT_FALSE(ParseConsumeConfig(kMinimal, "c.toml")->consumers[0].entity.has_value());

  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "entity = \"header:Account-Id\"\n"),
            "c.toml:2: consumer.version: missing (a versioned message names an entity and a "
            "version: set both)");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "version = \"fingerprint\"\n"),
            "c.toml:10: consumer.version: \"fingerprint\" is not a field (write \"header:NAME\" "
            "or \"json:/pointer\")");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "entity = \"json:acct\"\n"),
            "c.toml:10: consumer.entity: \"acct\" is not a JSON pointer (it starts with '/')");
}

TEST(ConsumeConfigTest, CommandLine) {
  const char* help[] = {"consume", "--help"};
  auto h = ParseConsumeCommandLine(2, help);
  ASSERT_TRUE(h.has_value());
  EXPECT_FALSE(h->has_value());
  const char* no_config[] = {"consume", "--store", "memory:"};
  auto n = ParseConsumeCommandLine(3, no_config);
  ASSERT_FALSE(n.has_value());
  EXPECT_NE(n.error().message().find("--config FILE is required"), std::string::npos);
  const char* unknown[] = {"consume", "--bogus", "1"};
  auto u = ParseConsumeCommandLine(3, unknown);
  ASSERT_FALSE(u.has_value());
  EXPECT_EQ(u.error().message(), "--bogus: unknown flag; see --help");
  const char* missing[] = {"consume", "--config", "/nonexistent/idemd.toml"};
  auto m = ParseConsumeCommandLine(3, missing);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message().find("/nonexistent/idemd.toml: cannot open"), std::string::npos);
  EXPECT_NE(ConsumeHelpText().find("permanent_statuses"), std::string::npos);
}

}  // namespace
}  // namespace idem::consume
