// The consumer core (include/idem/consumer.h). Placeholder until the core lands.
#include "idem/consumer.h"

namespace idem {

std::vector<std::pair<std::string, std::string>> DeadLetterHeaders(const BrokerMessage& message,
                                                                   const DeadLetterInfo& info) {
  auto headers = message.headers;
  headers.emplace_back(kDlqReasonHeader, info.reason);
  headers.emplace_back(kDlqAttemptsHeader, std::to_string(info.attempts));
  headers.emplace_back(kDlqErrorHeader, info.last_error);
  headers.emplace_back(kDlqKeyHeader, info.key);
  headers.emplace_back(kDlqSourceHeader, message.partition + "@" + message.position);
  return headers;
}

Status Broker::Touch(std::span<const BrokerMessage* const>) { return {}; }

}  // namespace idem
