// Producer and ReadTopic (include/idem/consumers/kafka.h): the tools tests and benchmarks use to
// fill topics and read dead letters back.
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "consumers/kafka/rdkafka_handles.h"
#include "idem/consumers/kafka.h"

namespace idem::kafka {

using internal::Conf;
using internal::Handle;
using internal::Metadata;
using internal::PartitionList;
using internal::Set;
using internal::TimeoutMs;
using SteadyClock = std::chrono::steady_clock;

struct Producer::Impl {
  Handle rk;
  std::mutex mu;
  std::string first_error;  // guarded by mu; since the last Flush

  static void Delivered(rd_kafka_t*, const rd_kafka_message_t* message, void* opaque) {
    if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR) return;
    auto* impl = static_cast<Impl*>(opaque);
    std::lock_guard lock(impl->mu);
    if (impl->first_error.empty()) {
      impl->first_error = std::string("kafka: delivery to ") + rd_kafka_topic_name(message->rkt) +
                          " failed: " + rd_kafka_err2str(message->err);
    }
  }
};

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Producer::Producer(Producer&&) noexcept = default;
Producer& Producer::operator=(Producer&&) noexcept = default;
Producer::~Producer() {
  if (impl_ != nullptr && impl_->rk != nullptr) rd_kafka_flush(impl_->rk.get(), 10'000);
}

Result<Producer> Producer::Open(
    const std::string& brokers,
    const std::vector<std::pair<std::string, std::string>>& properties) {
  if (brokers.empty()) return InvalidArgumentError("kafka: brokers (bootstrap.servers) is empty");
  auto impl = std::make_unique<Impl>();
  Conf conf(rd_kafka_conf_new());
  const internal::Properties settings = {
      {"bootstrap.servers", brokers},
      {"enable.idempotence", "true"},
      {"linger.ms", "5"},
      {"queue.buffering.max.messages", "1000000"},
  };
  for (const auto& [name, value] : settings) {
    if (Status s = Set(conf.get(), name, value); !s.ok()) return s;
  }
  if (Status s = internal::SetAll(conf.get(), properties); !s.ok()) return s;
  rd_kafka_conf_set_dr_msg_cb(conf.get(), &Impl::Delivered);
  rd_kafka_conf_set_opaque(conf.get(), impl.get());
  auto rk = internal::NewHandle(RD_KAFKA_PRODUCER, std::move(conf));
  if (!rk) return rk.error();
  impl->rk = std::move(*rk);
  return Producer(std::move(impl));
}

Status Producer::Publish(std::string_view topic, std::int32_t partition, std::string_view key,
                         std::string_view payload, const Headers& headers) {
  const std::string topic_name(topic);
  internal::HeaderList list = internal::NewHeaderList(headers);
  rd_kafka_resp_err_t err =
      rd_kafka_producev(impl_->rk.get(), RD_KAFKA_V_TOPIC(topic_name.c_str()),
                        RD_KAFKA_V_PARTITION(partition < 0 ? RD_KAFKA_PARTITION_UA : partition),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_VALUE(const_cast<char*>(payload.data()), payload.size()),
                        RD_KAFKA_V_KEY(key.empty() ? nullptr : key.data(), key.size()),
                        RD_KAFKA_V_HEADERS(list.get()), RD_KAFKA_V_END);
  // Serve delivery reports as we go, so that a long run of publishes does not pile them up.
  rd_kafka_poll(impl_->rk.get(), 0);
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    (void)list.release();  // librdkafka owns them now
    return {};
  }
  std::string message = "kafka: publish to " + topic_name + ": " + rd_kafka_err2str(err);
  if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) return ResourceExhaustedError(std::move(message));
  if (err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC || err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION) {
    return InvalidArgumentError(std::move(message));
  }
  return UnavailableError(std::move(message));
}

Status Producer::Flush(std::chrono::milliseconds timeout) {
  rd_kafka_resp_err_t err = rd_kafka_flush(impl_->rk.get(), TimeoutMs(timeout));
  std::lock_guard lock(impl_->mu);
  if (!impl_->first_error.empty()) return UnavailableError(std::exchange(impl_->first_error, {}));
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError(std::string("kafka: flush: ") + rd_kafka_err2str(err) + ", " +
                            std::to_string(rd_kafka_outq_len(impl_->rk.get())) +
                            " messages still queued");
  }
  return {};
}

Result<std::vector<TopicMessage>> ReadTopic(const std::string& brokers, const std::string& topic,
                                            std::chrono::milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  auto left = [&] {
    return std::max(
        std::chrono::milliseconds(1),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()));
  };
  Conf conf(rd_kafka_conf_new());
  // A group id that nobody shares: the reader assigns partitions itself and commits nothing.
  const internal::Properties settings = {
      {"bootstrap.servers", brokers},
      {"group.id", "idem-read-topic"},
      {"enable.auto.commit", "false"},
      {"enable.partition.eof", "false"},
  };
  for (const auto& [name, value] : settings) {
    if (Status s = Set(conf.get(), name, value); !s.ok()) return s;
  }
  auto rk = internal::NewHandle(RD_KAFKA_CONSUMER, std::move(conf));
  if (!rk) return rk.error();
  rd_kafka_t* handle = rk->get();

  rd_kafka_topic_t* rkt = rd_kafka_topic_new(handle, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err = rd_kafka_metadata(handle, 0, rkt, &md, TimeoutMs(left()));
  rd_kafka_topic_destroy(rkt);
  Metadata metadata(md);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError("kafka: metadata of " + topic + ": " + rd_kafka_err2str(err));
  }
  if (md->topic_cnt != 1 || md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError("kafka: topic " + topic + ": " +
                            rd_kafka_err2str(md->topic_cnt == 1
                                                 ? md->topics[0].err
                                                 : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC));
  }

  // Read each partition up to its high watermark as it is now.
  PartitionList assignment(rd_kafka_topic_partition_list_new(md->topics[0].partition_cnt));
  std::vector<std::int64_t> end(static_cast<std::size_t>(md->topics[0].partition_cnt), 0);
  std::size_t open = 0;
  for (int i = 0; i < md->topics[0].partition_cnt; ++i) {
    const std::int32_t p = md->topics[0].partitions[i].id;
    std::int64_t low = 0;
    std::int64_t high = 0;
    err =
        rd_kafka_query_watermark_offsets(handle, topic.c_str(), p, &low, &high, TimeoutMs(left()));
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return UnavailableError("kafka: watermarks of " + topic + "/" + std::to_string(p) + ": " +
                              rd_kafka_err2str(err));
    }
    if (static_cast<std::size_t>(p) >= end.size()) end.resize(static_cast<std::size_t>(p) + 1);
    end[static_cast<std::size_t>(p)] = high;
    if (high > low) {
      rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), p)->offset = low;
      ++open;
    }
  }
  std::vector<TopicMessage> out;
  if (open > 0) {
    if (err = rd_kafka_assign(handle, assignment.get()); err) {
      return UnavailableError("kafka: assign " + topic + ": " + rd_kafka_err2str(err));
    }
  }
  while (open > 0) {
    if (SteadyClock::now() >= deadline) {
      return UnavailableError("kafka: reading " + topic + " took longer than " +
                              std::to_string(timeout.count()) + " ms");
    }
    rd_kafka_message_t* m =
        rd_kafka_consumer_poll(handle, TimeoutMs(std::min(left(), std::chrono::milliseconds(100))));
    if (m == nullptr) continue;
    std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> owned(
        m, &rd_kafka_message_destroy);
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF || m->err == RD_KAFKA_RESP_ERR__TRANSPORT) {
        continue;
      }
      return UnavailableError("kafka: reading " + topic + ": " + rd_kafka_message_errstr(m));
    }
    const auto p = static_cast<std::size_t>(m->partition);
    if (p >= end.size() || m->offset >= end[p]) continue;
    TopicMessage& t = out.emplace_back();
    t.topic = topic;
    t.partition = m->partition;
    t.offset = m->offset;
    if (m->key != nullptr) t.key.emplace(static_cast<const char*>(m->key), m->key_len);
    if (m->payload != nullptr) t.payload.assign(static_cast<const char*>(m->payload), m->len);
    t.headers = internal::CopyHeaders(m);
    if (m->offset == end[p] - 1) --open;
  }
  rd_kafka_consumer_close(handle);
  std::stable_sort(out.begin(), out.end(), [](const TopicMessage& a, const TopicMessage& b) {
    return a.partition != b.partition ? a.partition < b.partition : a.offset < b.offset;
  });
  return out;
}

}  // namespace idem::kafka
