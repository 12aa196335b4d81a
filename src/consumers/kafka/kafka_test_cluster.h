// Test support for the Kafka adapter: idem-kafka-mock as a child process, and a few direct
// librdkafka reads the adapter does not offer (committed offsets).
#ifndef IDEM_CONSUMERS_KAFKA_KAFKA_TEST_CLUSTER_H_
#define IDEM_CONSUMERS_KAFKA_KAFKA_TEST_CLUSTER_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "idem/consumer.h"
#include "idem/consumers/kafka.h"
#include "idem/status.h"
#include "tests/support/process.h"

namespace idem::kafka::testing {

// A mock cluster in its own process (so a consumer process can die while it lives on).
class MockCluster {
 public:
  // topics: "NAME:PARTITIONS".
  static Result<MockCluster> Start(const std::vector<std::string>& topics, int brokers = 1);
  const std::string& bootstrap() const { return bootstrap_; }
  idem::testing::ChildProcess& process() { return process_; }

 private:
  MockCluster(idem::testing::ChildProcess process, std::string bootstrap)
      : process_(std::move(process)), bootstrap_(std::move(bootstrap)) {}
  idem::testing::ChildProcess process_;
  std::string bootstrap_;
};

// A unique name for a group or topic, so that tests never share state.
std::string UniqueName(const std::string& prefix);

// Settings that keep the mock's group protocol quick (session.timeout.ms=3000).
KafkaConsumerConfig TestConfig(const std::string& bootstrap, const std::string& group,
                               const std::vector<std::string>& topics,
                               const std::string& dlq_topic = {});

// Polls until `count` messages arrived in total or `timeout` passed; ASSERT on the size.
Result<std::vector<BrokerMessage>> PollAtLeast(Broker& broker, std::size_t count,
                                               std::chrono::milliseconds timeout,
                                               std::size_t batch = 64);

// The group's committed offset of topic/partition (-1001, RD_KAFKA_OFFSET_INVALID: none).
Result<std::int64_t> CommittedOffset(const std::string& bootstrap, const std::string& group,
                                     const std::string& topic, std::int32_t partition);

// Publishes `count` messages to topic/partition with payload "<prefix>-<i>", header
// Idempotency-Key "<prefix>-<i>" and no Kafka key; flushes.
Status PublishNumbered(Producer& producer, const std::string& topic, std::int32_t partition,
                       const std::string& prefix, int count);

}  // namespace idem::kafka::testing

#endif  // IDEM_CONSUMERS_KAFKA_KAFKA_TEST_CLUSTER_H_
