// What the Kafka adapter, its producer and the topic reader share: owning handles for
// librdkafka objects, configuration that names the property it refuses, and header copies.
#ifndef IDEM_CONSUMERS_KAFKA_RDKAFKA_HANDLES_H_
#define IDEM_CONSUMERS_KAFKA_RDKAFKA_HANDLES_H_

#include <librdkafka/rdkafka.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/consumers/kafka.h"
#include "idem/status.h"

namespace idem::kafka::internal {

struct HandleDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
struct ListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* list) const {
    rd_kafka_topic_partition_list_destroy(list);
  }
};
struct HeadersDeleter {
  void operator()(rd_kafka_headers_t* headers) const { rd_kafka_headers_destroy(headers); }
};
struct QueueDeleter {
  void operator()(rd_kafka_queue_t* queue) const { rd_kafka_queue_destroy(queue); }
};
struct MetadataDeleter {
  void operator()(const rd_kafka_metadata_t* md) const { rd_kafka_metadata_destroy(md); }
};
struct ErrorDeleter {
  void operator()(rd_kafka_error_t* error) const { rd_kafka_error_destroy(error); }
};
struct EventDeleter {
  void operator()(rd_kafka_event_t* event) const { rd_kafka_event_destroy(event); }
};

using Handle = std::unique_ptr<rd_kafka_t, HandleDeleter>;
using Conf = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using PartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, ListDeleter>;
using HeaderList = std::unique_ptr<rd_kafka_headers_t, HeadersDeleter>;
using Queue = std::unique_ptr<rd_kafka_queue_t, QueueDeleter>;
using Metadata = std::unique_ptr<const rd_kafka_metadata_t, MetadataDeleter>;
using Error = std::unique_ptr<rd_kafka_error_t, ErrorDeleter>;
using Event = std::unique_ptr<rd_kafka_event_t, EventDeleter>;

using Properties = std::vector<std::pair<std::string, std::string>>;

// kInvalidArgument naming the property when librdkafka refuses it.
Status Set(rd_kafka_conf_t* conf, std::string_view name, std::string_view value);
Status SetAll(rd_kafka_conf_t* conf, const Properties& properties);

// Creates the handle; kInvalidArgument with librdkafka's reason (which names the property).
// Takes the configuration in every case.
Result<Handle> NewHandle(rd_kafka_type_t type, Conf conf);

// The message's headers, in order (a header without a value has an empty one).
Headers CopyHeaders(const rd_kafka_message_t* message);
// The same into `out`, whose strings' storage is used again where it is large enough.
void CopyHeadersInto(const rd_kafka_message_t* message, Headers& out);
HeaderList NewHeaderList(const Headers& headers);

int TimeoutMs(std::chrono::milliseconds timeout);

}  // namespace idem::kafka::internal

#endif  // IDEM_CONSUMERS_KAFKA_RDKAFKA_HANDLES_H_
