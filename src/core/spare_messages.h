// SpareMessages: the messages a consumer handed back (Broker::Recycle), kept by a broker adapter
// to fill in with its next deliveries. Their strings keep their storage, so a delivery of a
// usual size allocates nothing, and a finished batch frees nothing.
//
// At most kMaxMessages are kept, each holding at most kMaxBytes: a large message's storage is
// freed, not kept for small ones. Not thread-safe: an adapter's Poll and Recycle run on its
// consumer's thread.
#ifndef IDEM_CORE_SPARE_MESSAGES_H_
#define IDEM_CORE_SPARE_MESSAGES_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/consumer.h"

namespace idem::internal {

class SpareMessages {
 public:
  static constexpr std::size_t kMaxMessages = 4096;
  static constexpr std::size_t kMaxBytes = 16 << 10;

  // Keeps what fits of `batch`.
  void Keep(std::vector<BrokerMessage> batch) {
    for (BrokerMessage& m : batch) {
      if (spare_.size() >= kMaxMessages) break;
      std::size_t held = m.payload.capacity() + m.position.capacity() + m.partition.capacity();
      for (const auto& [name, value] : m.headers) held += name.capacity() + value.capacity();
      if (held <= kMaxBytes) spare_.push_back(std::move(m));
    }
  }

  // A message to fill in: a new one, or a kept one with its storage but nothing of its earlier
  // delivery. Its strings are empty, deliveries 1, handle 0; its headers keep their count for
  // SetHeader, each with an empty name and value, so an adapter that fills fewer of them than
  // it resizes away, or stops half way (a cut-off read), leaves no earlier delivery's
  // Idempotency-Key behind: an empty name matches no key header.
  BrokerMessage Take() {
    if (spare_.empty()) return BrokerMessage{};
    BrokerMessage m = std::move(spare_.back());
    spare_.pop_back();
    m.partition.clear();
    m.position.clear();
    m.payload.clear();
    for (auto& [name, value] : m.headers) {
      name.clear();
      value.clear();
    }
    m.deliveries = 1;
    m.handle = 0;
    return m;
  }

  std::size_t size() const { return spare_.size(); }

 private:
  std::vector<BrokerMessage> spare_;
};

// Filling a message's headers in place, keeping their strings' storage: SetHeader for i = 0,
// 1, ... in order, then resize the list to the count set.
inline void SetHeader(std::vector<std::pair<std::string, std::string>>& headers, std::size_t i,
                      std::string_view name, std::string_view value) {
  if (i == headers.size()) headers.emplace_back();
  headers[i].first.assign(name);
  headers[i].second.assign(value);
}

}  // namespace idem::internal

#endif  // IDEM_CORE_SPARE_MESSAGES_H_
