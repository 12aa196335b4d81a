#include "consumers/kafka/rdkafka_handles.h"

#include <algorithm>
#include <climits>

#include "core/spare_messages.h"

#ifdef IDEM_KAFKA_TSAN_SHIM
extern "C" const int idem_kafka_tsan_shim;  // tsan_c11_threads.cc
#endif

namespace idem::kafka::internal {

Status Set(rd_kafka_conf_t* conf, std::string_view name, std::string_view value) {
  char err[512];
  std::string n(name);
  std::string v(value);
  if (rd_kafka_conf_set(conf, n.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
    return InvalidArgumentError("kafka property '" + n + "': " + err);
  }
  return {};
}

Status SetAll(rd_kafka_conf_t* conf, const Properties& properties) {
  for (const auto& [name, value] : properties) {
    if (Status s = Set(conf, name, value); !s.ok()) return s;
  }
  return {};
}

Result<Handle> NewHandle(rd_kafka_type_t type, Conf conf) {
#ifdef IDEM_KAFKA_TSAN_SHIM
  // Links the TSan shim into every program that creates a handle through the adapter.
  (void)*static_cast<const volatile int*>(&idem_kafka_tsan_shim);
#endif
  char err[512];
  // rd_kafka_new owns the configuration only when it succeeds.
  rd_kafka_t* rk = rd_kafka_new(type, conf.get(), err, sizeof err);
  if (rk == nullptr) return InvalidArgumentError(std::string("kafka configuration: ") + err);
  (void)conf.release();
  return Handle(rk);
}

Headers CopyHeaders(const rd_kafka_message_t* message) {
  Headers out;
  CopyHeadersInto(message, out);
  return out;
}

void CopyHeadersInto(const rd_kafka_message_t* message, Headers& out) {
  std::size_t n = 0;
  rd_kafka_headers_t* headers = nullptr;  // owned by the message
  if (rd_kafka_message_headers(message, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    const char* name = nullptr;
    const void* value = nullptr;
    size_t size = 0;
    for (; rd_kafka_header_get_all(headers, n, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
         ++n) {
      idem::internal::SetHeader(out, n, name,
                                value == nullptr
                                    ? std::string_view()
                                    : std::string_view(static_cast<const char*>(value), size));
    }
  }
  out.resize(n);
}

HeaderList NewHeaderList(const Headers& headers) {
  HeaderList list(rd_kafka_headers_new(headers.size()));
  for (const auto& [name, value] : headers) {
    rd_kafka_header_add(list.get(), name.data(), static_cast<ssize_t>(name.size()), value.data(),
                        static_cast<ssize_t>(value.size()));
  }
  return list;
}

int TimeoutMs(std::chrono::milliseconds timeout) {
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(timeout.count(), 0, INT_MAX));
}

}  // namespace idem::kafka::internal
