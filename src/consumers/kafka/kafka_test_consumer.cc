// kafka_test_consumer BOOTSTRAP GROUP TOPIC COUNT ACK: a consumer process for kafka_test to
// kill. Polls until COUNT messages arrived, acknowledges the first ACK of them, prints
// "polled COUNT" once that commit is answered, and waits to be killed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "consumers/kafka/kafka_test_cluster.h"
#include "idem/consumers/kafka.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: kafka_test_consumer BOOTSTRAP GROUP TOPIC COUNT ACK\n");
    return 2;
  }
  const std::size_t count = std::stoul(argv[4]);
  const std::size_t ack = std::stoul(argv[5]);
  auto broker =
      idem::kafka::OpenKafkaConsumer(idem::kafka::testing::TestConfig(argv[1], argv[2], {argv[3]}));
  if (!broker) {
    std::fprintf(stderr, "%s\n", broker.error().ToString().c_str());
    return 1;
  }
  auto got = idem::kafka::testing::PollAtLeast(**broker, count, std::chrono::seconds(30));
  if (!got || got->size() < count) {
    std::fprintf(stderr, "polled %zu of %zu: %s\n", got ? got->size() : 0, count,
                 got ? "timeout" : got.error().ToString().c_str());
    return 1;
  }
  std::vector<const idem::BrokerMessage*> acked;
  for (std::size_t i = 0; i < ack && i < got->size(); ++i) acked.push_back(&(*got)[i]);
  idem::Status s = (*broker)->Acknowledge(acked);
  if (s.ok()) s = (*broker)->Settle();  // the commit answered before "polled" is printed
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("polled %zu\n", got->size());
  std::fflush(stdout);
  for (;;) pause();
}
