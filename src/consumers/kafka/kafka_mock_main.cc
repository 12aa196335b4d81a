// idem-kafka-mock: librdkafka's mock cluster as a process of its own, for tests that kill a
// consumer process while the cluster lives on.
//
//   idem-kafka-mock [--brokers N] --topic NAME:PARTITIONS [--topic ...]
//
// Prints "bootstrap HOST:PORT[,HOST:PORT...]" once the topics exist, then serves until SIGTERM
// or SIGINT. SIGUSR1 makes the next OffsetCommit request fail (every partition answers
// OFFSET_METADATA_TOO_LARGE, an error librdkafka reports rather than retries) and prints
// "commit error armed", so a test can see how a consumer handles a failed commit. Everything
// else goes to stderr. Exit 2 on bad arguments.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <signal.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr std::string_view kUsage =
    "usage: idem-kafka-mock [--brokers N] --topic NAME:PARTITIONS [--topic ...]\n";

// The Kafka protocol's ApiKey of OffsetCommit (librdkafka names it only in a private header).
constexpr std::int16_t kOffsetCommitApiKey = 8;

bool ParseInt(std::string_view text, int& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "idem-kafka-mock: %s\n%s", message.c_str(), std::string(kUsage).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int brokers = 1;
  std::vector<std::pair<std::string, int>> topics;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(std::string(kUsage).c_str(), stdout);
      return 0;
    }
    if (i + 1 >= argc) return Fail("missing value after " + std::string(arg));
    std::string_view value = argv[++i];
    if (arg == "--brokers") {
      if (!ParseInt(value, brokers) || brokers < 1) return Fail("--brokers needs a number >= 1");
    } else if (arg == "--topic") {
      auto colon = value.rfind(':');
      int partitions = 0;
      if (colon == std::string_view::npos || colon == 0 ||
          !ParseInt(value.substr(colon + 1), partitions) || partitions < 1) {
        return Fail("--topic needs NAME:PARTITIONS, got '" + std::string(value) + "'");
      }
      topics.emplace_back(std::string(value.substr(0, colon)), partitions);
    } else {
      return Fail("unknown argument " + std::string(arg));
    }
  }

  // Block the signals before librdkafka starts its threads, so that only sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The mock cluster needs a handle for its own bookkeeping; this one produces nothing.
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err) != RD_KAFKA_CONF_OK) {
    return Fail(err);
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) {
    std::fprintf(stderr, "idem-kafka-mock: cannot create a handle: %s\n", err);
    return 1;
  }
  rd_kafka_mock_cluster_t* cluster = rd_kafka_mock_cluster_new(rk, brokers);
  if (cluster == nullptr) {
    std::fprintf(stderr, "idem-kafka-mock: cannot create the mock cluster\n");
    rd_kafka_destroy(rk);
    return 1;
  }
  for (const auto& [name, partitions] : topics) {
    rd_kafka_resp_err_t e =
        rd_kafka_mock_topic_create(cluster, name.c_str(), partitions, brokers < 3 ? brokers : 3);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
      std::fprintf(stderr, "idem-kafka-mock: cannot create topic %s: %s\n", name.c_str(),
                   rd_kafka_err2str(e));
      rd_kafka_mock_cluster_destroy(cluster);
      rd_kafka_destroy(rk);
      return 1;
    }
  }
  std::printf("bootstrap %s\n", rd_kafka_mock_cluster_bootstraps(cluster));
  std::fflush(stdout);

  for (int signal = 0; sigwait(&signals, &signal) == 0 && signal == SIGUSR1;) {
    rd_kafka_mock_push_request_errors(cluster, kOffsetCommitApiKey, 1,
                                      RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE);
    std::printf("commit error armed\n");
    std::fflush(stdout);
  }
  rd_kafka_mock_cluster_destroy(cluster);
  rd_kafka_destroy(rk);
  return 0;
}
