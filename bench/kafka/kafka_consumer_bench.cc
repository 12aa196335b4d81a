// End-to-end consumption rate from Kafka: idem's Consumer (the Kafka adapter, the core and a
// store) against a plain librdkafka consumer doing the same polling and committing without any
// deduplication. All in one run, on one in-process mock cluster, over the same messages.
//
//   kafka_consumer_bench [--messages 120000] [--payload 100] [--partitions 4] [--batch 256]
//                        [--rounds 5] [--settle 0] [--pipeline 1]
//                        [--only plain|adapter|memory|log]
//
// librdkafka 2.0's mock cluster keeps about 5 MB per partition and drops older messages (about
// 35 000 of these per partition), hence 120 000 over 4 partitions; the bench refuses to run when
// the topic lost messages.
//
// The topic is filled once (unique keys in the Idempotency-Key header, round robin over the
// partitions). Then each round reads it from the beginning with a fresh group, once per
// contender, interleaved:
//   (a) plain: a librdkafka consumer in the same group settings as the adapter (cooperative-
//       sticky, no auto commit), the same poll pattern (wait for the first message, then take
//       what is already there up to the batch size), reading each message's payload and key
//       header, and one commit per batch of each partition's next offset, sent without
//       waiting and answered before the next one goes (as the adapter commits);
//   (b) idem::Consumer + MemoryStore, no-op handler;
//   (c) idem::Consumer + log store (sync=always, a temporary directory), no-op handler;
//   (b) and (c) with ConsumerOptions::pipeline (--pipeline 0: without), as idemd consume runs.
// The clock of a run starts once its first batch is done (the group join, which takes the mock
// three seconds, is not measured; --settle MS waits that much longer, for librdkafka to fetch
// everything first, so that only the consumers are compared) and stops when every message was
// consumed. Prints the median rate of each and the ratios b/a and c/a.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/consumers/kafka.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::size_t messages = 120'000;
  std::size_t payload = 100;
  int partitions = 4;
  std::size_t batch = 256;
  int rounds = 5;
  // After the first batch, wait this long before the clock starts, so that librdkafka has
  // fetched every partition and the clock measures the consumers alone, not the mock's fetch
  // path. 0 (the default): measure while fetching, end to end.
  std::chrono::milliseconds settle{0};
  bool pipeline = true;  // ConsumerOptions::pipeline for (b) and (c), as idemd consume runs Kafka
  std::string only;      // plain, adapter, memory or log: run that one alone (for perf)
};

bool Runs(const Flags& flags, const char* what) { return flags.only.empty() || flags.only == what; }

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "kafka_consumer_bench: %s\n", message.c_str());
  std::exit(1);
}

// For every contender: librdkafka 2.0 compares queued.min.messages (100 000 per partition by
// default) with everything in the consumer queue, not the partition's share, and past it stops
// fetching for a whole second: with 120 000 messages that second would be most of every run.
constexpr const char* kQueuedMinMessages = "10000000";

std::string GroupName(const char* what, int round) {
  static int counter = 0;
  return std::string("bench-") + what + "-" + std::to_string(round) + "-" +
         std::to_string(++counter);
}

// Messages per second over the measured part of a run.
struct Run {
  std::size_t measured = 0;  // messages consumed after the clock started
  double busy = 0;           // seconds, without the polls that came back empty
  double wall = 0;           // seconds
  double rate() const { return busy > 0 ? static_cast<double>(measured) / busy : 0; }
  double wall_rate() const { return wall > 0 ? static_cast<double>(measured) / wall : 0; }
};

// Times a run from the end of its first non-empty round (the group join is not measured), and
// also without the rounds whose poll came back empty (fetch stalls: none since
// kQueuedMinMessages, but a stall of the mock would swamp runs this short). The same rule for
// every contender.
class Meter {
 public:
  explicit Meter(std::chrono::milliseconds settle) : settle_(settle) {}
  // After each poll-process-commit round that began at `began` and consumed n messages.
  void Round(std::size_t n, Clock::time_point began) {
    if (!started_) {
      if (n > 0) {
        started_ = true;
        // Let librdkafka fetch the rest meanwhile: then the clock measures the consumer.
        std::this_thread::sleep_for(settle_);
        start_ = Clock::now();
      }
      return;
    }
    const Clock::time_point now = Clock::now();
    measured_ += n;
    if (n == 0) idle_ += now - began;
  }
  Run Result() const {
    const auto wall = Clock::now() - start_;
    return {measured_, std::chrono::duration<double>(wall - idle_).count(),
            std::chrono::duration<double>(wall).count()};
  }

 private:
  std::chrono::milliseconds settle_;
  bool started_ = false;
  Clock::time_point start_{};
  Clock::duration idle_{};
  std::size_t measured_ = 0;
};

// ---- (a) the plain consumer ----

void Rebalance(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
               void*) {
  rd_kafka_error_t* error = err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS
                                ? rd_kafka_incremental_assign(rk, parts)
                                : rd_kafka_incremental_unassign(rk, parts);
  if (error != nullptr) rd_kafka_error_destroy(error);
}

// Takes (and frees) the answer to a commit sent with rd_kafka_commit_queue.
void AwaitPlainCommit(rd_kafka_queue_t*& replies) {
  rd_kafka_event_t* answer = rd_kafka_queue_poll(replies, 30'000);
  if (answer == nullptr || rd_kafka_event_error(answer) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    Die("plain commit failed");
  }
  rd_kafka_event_destroy(answer);
  rd_kafka_queue_destroy(replies);
  replies = nullptr;
}

Run Plain(const std::string& bootstrap, const std::string& topic, const Flags& flags, int round) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  const std::string group = GroupName("plain", round);
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"bootstrap.servers", bootstrap},
      {"group.id", group},
      {"session.timeout.ms", "45000"},
      {"heartbeat.interval.ms", "3000"},
      {"enable.auto.commit", "false"},
      {"enable.auto.offset.store", "false"},
      {"partition.assignment.strategy", "cooperative-sticky"},
      {"auto.offset.reset", "earliest"},
      {"queued.min.messages", kQueuedMinMessages},
  };
  for (const auto& [name, value] : settings) {
    if (rd_kafka_conf_set(conf, name.c_str(), value.c_str(), err, sizeof err)) Die(err);
  }
  rd_kafka_conf_set_rebalance_cb(conf, &Rebalance);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (rk == nullptr) Die(err);
  rd_kafka_poll_set_consumer(rk);
  rd_kafka_queue_t* queue = rd_kafka_queue_get_consumer(rk);
  rd_kafka_topic_partition_list_t* subscription = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(subscription, topic.c_str(), RD_KAFKA_PARTITION_UA);
  if (rd_kafka_subscribe(rk, subscription)) Die("subscribe failed");
  rd_kafka_topic_partition_list_destroy(subscription);

  std::vector<rd_kafka_message_t*> drain(flags.batch);
  std::vector<std::int64_t> next(static_cast<std::size_t>(flags.partitions), -1);
  std::size_t consumed = 0;
  std::uint64_t checksum = 0;  // so that reading the payload and key is not optimised away
  rd_kafka_queue_t* in_flight = nullptr;  // the reply queue of the commit in flight
  Meter meter(flags.settle);
  while (consumed < flags.messages) {
    const Clock::time_point began = Clock::now();
    rd_kafka_message_t* first = rd_kafka_consumer_poll(rk, 100);
    if (first == nullptr) {
      meter.Round(0, began);
      continue;
    }
    const std::size_t before = consumed;
    std::size_t n = 1;
    drain[0] = first;
    while (n < flags.batch) {
      ssize_t got = rd_kafka_consume_batch_queue(queue, 0, drain.data() + n, flags.batch - n);
      if (got <= 0) break;
      n += static_cast<std::size_t>(got);
    }
    std::fill(next.begin(), next.end(), -1);
    for (std::size_t i = 0; i < n; ++i) {
      rd_kafka_message_t* m = drain[i];
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_headers_t* headers = nullptr;
        const void* key = nullptr;
        std::size_t key_size = 0;
        if (rd_kafka_message_headers(m, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR) {
          rd_kafka_header_get_last(headers, "Idempotency-Key", &key, &key_size);
        }
        checksum +=
            m->len + key_size + (m->len > 0 ? static_cast<const unsigned char*>(m->payload)[0] : 0);
        next[static_cast<std::size_t>(m->partition)] = m->offset + 1;
        ++consumed;
      }
      rd_kafka_message_destroy(m);
    }
    rd_kafka_topic_partition_list_t* commit = rd_kafka_topic_partition_list_new(flags.partitions);
    for (std::size_t p = 0; p < next.size(); ++p) {
      if (next[p] >= 0) {
        rd_kafka_topic_partition_list_add(commit, topic.c_str(), static_cast<std::int32_t>(p))
            ->offset = next[p];
      }
    }
    // As the adapter commits: one commit in flight, sent without waiting; its answer is taken
    // before the next one goes.
    if (in_flight != nullptr) AwaitPlainCommit(in_flight);
    if (commit->cnt > 0) {
      in_flight = rd_kafka_queue_new(rk);
      if (rd_kafka_commit_queue(rk, commit, in_flight, nullptr, nullptr) !=
          RD_KAFKA_RESP_ERR_NO_ERROR) {
        Die("plain commit failed");
      }
    }
    rd_kafka_topic_partition_list_destroy(commit);
    meter.Round(consumed - before, began);
  }
  if (in_flight != nullptr) AwaitPlainCommit(in_flight);
  const Run run = meter.Result();
  rd_kafka_queue_destroy(queue);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  if (checksum == 0) Die("read nothing");
  return run;
}

// ---- the adapter alone: Poll and Acknowledge, no core, no store (to tell their costs apart) ----

Run Adapter(const std::string& bootstrap, const std::string& topic, const Flags& flags, int round) {
  idem::kafka::KafkaConsumerConfig config;
  config.brokers = bootstrap;
  config.group = GroupName("adapter", round);
  config.topics = {topic};
  config.properties = {{"queued.min.messages", kQueuedMinMessages}};
  auto broker = idem::kafka::OpenKafkaConsumer(config);
  if (!broker) Die(broker.error().ToString());
  std::size_t consumed = 0;
  Meter meter(flags.settle);
  std::vector<const idem::BrokerMessage*> settled;
  while (consumed < flags.messages) {
    const Clock::time_point began = Clock::now();
    auto batch = (*broker)->Poll(flags.batch, std::chrono::milliseconds(100));
    if (!batch) Die(batch.error().ToString());
    if (batch->empty()) {
      meter.Round(0, began);
      continue;
    }
    settled.clear();
    for (const auto& m : *batch) settled.push_back(&m);
    if (idem::Status s = (*broker)->Acknowledge(settled); !s.ok()) Die(s.ToString());
    consumed += batch->size();
    meter.Round(batch->size(), began);
  }
  return meter.Result();
}

// ---- (b), (c) idem's Consumer ----

Run Idem(const std::string& bootstrap, const std::string& topic, const Flags& flags, int round,
         idem::Store& store, const char* what) {
  idem::kafka::KafkaConsumerConfig config;
  config.brokers = bootstrap;
  config.group = GroupName(what, round);
  config.topics = {topic};
  config.properties = {{"queued.min.messages", kQueuedMinMessages}};
  auto broker = idem::kafka::OpenKafkaConsumer(config);
  if (!broker) Die(broker.error().ToString());
  idem::ConsumerOptions options;
  options.name = what;
  options.scope = config.group;  // a fresh scope: every key is new
  options.batch_size = flags.batch;
  options.poll_wait = std::chrono::milliseconds(100);
  options.pipeline = flags.pipeline;
  idem::Consumer consumer(
      store, **broker,
      [](const idem::HandlerContext&, const idem::BrokerMessage&) {
        return idem::HandlerVerdict{};
      },
      options);
  std::size_t consumed = 0;
  Meter meter(flags.settle);
  while (consumed < flags.messages) {
    const Clock::time_point began = Clock::now();
    auto n = consumer.RunOnce();
    if (!n) Die(std::string(what) + ": " + n.error().ToString());
    consumed += *n;
    meter.Round(*n, began);
  }
  // Pipelined, the last batch is still completing: its time counts too.
  if (idem::Status s = consumer.Flush(); !s.ok()) Die(std::string(what) + ": " + s.ToString());
  const Run run = meter.Result();
  const idem::ConsumerCounts counts = consumer.counts();
  if (counts.executed != flags.messages) {
    std::fprintf(stderr, "kafka_consumer_bench: %s executed %llu of %zu messages\n", what,
                 static_cast<unsigned long long>(counts.executed), flags.messages);
  }
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--only") {
      flags.only = argv[i + 1];
      continue;
    }
    const long v = std::atol(argv[i + 1]);
    if (v <= 0 &&
        !((flag == "--settle" || flag == "--pipeline") && std::string(argv[i + 1]) == "0")) {
      Die("bad value for " + flag);
    }
    if (flag == "--messages") {
      flags.messages = static_cast<std::size_t>(v);
    } else if (flag == "--payload") {
      flags.payload = static_cast<std::size_t>(v);
    } else if (flag == "--partitions") {
      flags.partitions = static_cast<int>(v);
    } else if (flag == "--batch") {
      flags.batch = static_cast<std::size_t>(v);
    } else if (flag == "--pipeline") {
      flags.pipeline = v != 0;
    } else if (flag == "--settle") {
      flags.settle = std::chrono::milliseconds(v);
    } else if (flag == "--rounds") {
      flags.rounds = static_cast<int>(v);
    } else {
      Die("unknown flag " + flag);
    }
  }

  // The mock cluster lives in this process, on librdkafka's threads.
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
  rd_kafka_t* mock_handle = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (mock_handle == nullptr) Die(err);
  rd_kafka_mock_cluster_t* cluster = rd_kafka_mock_cluster_new(mock_handle, 1);
  if (cluster == nullptr) Die("cannot create the mock cluster");
  const std::string topic = "bench";
  if (rd_kafka_mock_topic_create(cluster, topic.c_str(), flags.partitions, 1)) {
    Die("cannot create the topic");
  }
  const std::string bootstrap = rd_kafka_mock_cluster_bootstraps(cluster);

  {
    auto producer = idem::kafka::Producer::Open(bootstrap, {{"linger.ms", "20"}});
    if (!producer) Die(producer.error().ToString());
    std::string payload(flags.payload, 'x');
    for (std::size_t i = 0; i < flags.messages; ++i) {
      const std::string key = "key-" + std::to_string(i);
      std::memcpy(payload.data(), key.data(), std::min(key.size(), payload.size()));
      const auto partition =
          static_cast<std::int32_t>(i % static_cast<std::size_t>(flags.partitions));
      idem::Status s;
      while ((s = producer->Publish(topic, partition, "", payload, {{"Idempotency-Key", key}}))
                 .code() == idem::StatusCode::kResourceExhausted) {
        if (idem::Status f = producer->Flush(std::chrono::seconds(60)); !f.ok()) {
          Die(f.ToString());
        }
      }
      if (!s.ok()) Die(s.ToString());
    }
    if (idem::Status s = producer->Flush(std::chrono::seconds(120)); !s.ok()) Die(s.ToString());
  }
  // Every message must still be there (the mock keeps a bounded log per partition).
  rd_kafka_conf_t* probe_conf = rd_kafka_conf_new();
  if (rd_kafka_conf_set(probe_conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err)) {
    Die(err);
  }
  rd_kafka_t* probe = rd_kafka_new(RD_KAFKA_CONSUMER, probe_conf, err, sizeof err);
  if (probe == nullptr) Die(err);
  for (int p = 0; p < flags.partitions; ++p) {
    std::int64_t low = 0, high = 0;
    if (rd_kafka_query_watermark_offsets(probe, topic.c_str(), p, &low, &high, 10'000)) {
      Die("cannot read the watermarks");
    }
    if (low != 0) {
      Die("the mock cluster dropped the first " + std::to_string(low) + " messages of partition " +
          std::to_string(p) + " (of " + std::to_string(high) + "): fewer --messages");
    }
  }
  rd_kafka_destroy(probe);
  std::printf(
      "kafka_consumer_bench: %zu messages of %zu bytes over %d partitions, batch %zu, "
      "%d rounds (medians), settle %lld ms, pipeline %d, mock cluster in process\n",
      flags.messages, flags.payload, flags.partitions, flags.batch, flags.rounds,
      static_cast<long long>(flags.settle.count()), flags.pipeline ? 1 : 0);
  std::fflush(stdout);

  std::vector<double> plain, adapter, memory, log;
  std::vector<double> plain_wall, adapter_wall, memory_wall, log_wall;
  for (int round = 1; round <= flags.rounds; ++round) {
    Run a = Runs(flags, "plain") ? Plain(bootstrap, topic, flags, round) : Run{};
    plain.push_back(a.rate());
    plain_wall.push_back(a.wall_rate());
    Run adapter_only = Runs(flags, "adapter") ? Adapter(bootstrap, topic, flags, round) : Run{};
    adapter.push_back(adapter_only.rate());
    adapter_wall.push_back(adapter_only.wall_rate());

    auto memory_store = idem::NewMemoryStore();
    Run b = Runs(flags, "memory") ? Idem(bootstrap, topic, flags, round, *memory_store, "memory")
                                  : Run{};
    memory.push_back(b.rate());
    memory_wall.push_back(b.wall_rate());

    char dir_template[] = "/tmp/idem-kafka-bench.XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (dir == nullptr) Die("mkdtemp failed");
    Run c;
    {
      idem::LogStoreOptions options;
      options.dir = dir;
      options.sync = idem::SyncMode::kAlways;
      auto log_store = idem::OpenLogStore(options);
      if (!log_store) Die(log_store.error().ToString());
      if (Runs(flags, "log")) c = Idem(bootstrap, topic, flags, round, **log_store, "log");
    }
    std::filesystem::remove_all(dir);
    log.push_back(c.rate());
    log_wall.push_back(c.wall_rate());
    std::printf("round %d: plain %.0f, adapter %.0f, idem+memory %.0f, idem+log %.0f msg/s\n",
                round, a.rate(), adapter_only.rate(), b.rate(), c.rate());
    std::fflush(stdout);
  }
  const double a = Median(plain), b = Median(memory), c = Median(log);
  std::printf("medians, msg/s (without empty polls; with them in brackets):\n");
  std::printf("(a) plain librdkafka consumer      %9.0f  [%9.0f]\n", a, Median(plain_wall));
  std::printf("    idem Kafka adapter alone       %9.0f  [%9.0f]  /a %.2f  (Poll+Acknowledge)\n",
              Median(adapter), Median(adapter_wall), Median(adapter) / a);
  std::printf("(b) idem Consumer + MemoryStore    %9.0f  [%9.0f]  b/a %.2f\n", b,
              Median(memory_wall), b / a);
  std::printf("(c) idem Consumer + log store      %9.0f  [%9.0f]  c/a %.2f  (sync=always)\n", c,
              Median(log_wall), c / a);
  rd_kafka_mock_cluster_destroy(cluster);
  rd_kafka_destroy(mock_handle);
  return 0;
}
