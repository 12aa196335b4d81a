#include "consumers/kafka/kafka_test_cluster.h"

#include <librdkafka/rdkafka.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>

namespace idem::kafka::testing {

Result<MockCluster> MockCluster::Start(const std::vector<std::string>& topics, int brokers) {
  std::vector<std::string> args = {"--brokers", std::to_string(brokers)};
  for (const std::string& t : topics) {
    args.push_back("--topic");
    args.push_back(t);
  }
  auto process = idem::testing::ChildProcess::Spawn(IDEM_KAFKA_MOCK, args);
  if (!process) return process.error();
  auto line = process->WaitForLine("bootstrap ", std::chrono::seconds(20));
  if (!line) return line.error();
  std::string bootstrap = line->substr(std::string_view("bootstrap ").size());
  return MockCluster(std::move(*process), std::move(bootstrap));
}

std::string UniqueName(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

KafkaConsumerConfig TestConfig(const std::string& bootstrap, const std::string& group,
                               const std::vector<std::string>& topics,
                               const std::string& dlq_topic) {
  KafkaConsumerConfig config;
  config.brokers = bootstrap;
  config.group = group;
  config.topics = topics;
  config.dlq_topic = dlq_topic;
  config.client_id = group;
  config.session_timeout = std::chrono::milliseconds(3000);
  // Quick metadata and reconnects against the local mock.
  config.properties = {{"topic.metadata.refresh.interval.ms", "1000"},
                       {"reconnect.backoff.ms", "10"},
                       {"reconnect.backoff.max.ms", "200"}};
  // IDEM_KAFKA_DEBUG=cgrp,fetch,...: librdkafka's debug log on stderr, to see a slow test.
  if (const char* debug = std::getenv("IDEM_KAFKA_DEBUG"); debug != nullptr && *debug != 0) {
    config.properties.emplace_back("debug", debug);
  }
  return config;
}

Result<std::vector<BrokerMessage>> PollAtLeast(Broker& broker, std::size_t count,
                                               std::chrono::milliseconds timeout,
                                               std::size_t batch) {
  std::vector<BrokerMessage> all;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (all.size() < count && std::chrono::steady_clock::now() < deadline) {
    auto got = broker.Poll(batch, std::chrono::milliseconds(100));
    if (!got) return got.error();
    for (auto& m : *got) all.push_back(std::move(m));
  }
  return all;
}

Result<std::int64_t> CommittedOffset(const std::string& bootstrap, const std::string& group,
                                     const std::string& topic, std::int32_t partition) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err) ||
      rd_kafka_conf_set(conf, "group.id", group.c_str(), err, sizeof err)) {
    rd_kafka_conf_destroy(conf);
    return InvalidArgumentError(err);
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    return InvalidArgumentError(err);
  }
  rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(list, topic.c_str(), partition);
  rd_kafka_resp_err_t e = rd_kafka_committed(rk, list, 10'000);
  std::int64_t offset = list->elems[0].offset;
  rd_kafka_resp_err_t pe = list->elems[0].err;
  rd_kafka_topic_partition_list_destroy(list);
  rd_kafka_destroy(rk);
  if (e != RD_KAFKA_RESP_ERR_NO_ERROR) return UnavailableError(rd_kafka_err2str(e));
  if (pe != RD_KAFKA_RESP_ERR_NO_ERROR) return UnavailableError(rd_kafka_err2str(pe));
  return offset;
}

Status PublishNumbered(Producer& producer, const std::string& topic, std::int32_t partition,
                       const std::string& prefix, int count) {
  for (int i = 0; i < count; ++i) {
    std::string id = prefix + "-" + std::to_string(i);
    if (Status s = producer.Publish(topic, partition, "", id, {{"Idempotency-Key", id}}); !s.ok()) {
      return s;
    }
  }
  return producer.Flush(std::chrono::seconds(20));
}

}  // namespace idem::kafka::testing
