// Small helpers shared by the consumer tests (the core's, each broker adapter's, end to end).
#ifndef IDEM_TESTS_SUPPORT_CONSUMER_HELPERS_H_
#define IDEM_TESTS_SUPPORT_CONSUMER_HELPERS_H_

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/consumer.h"

namespace idem::testing {

// The value of the first header called exactly `name`, or "<missing>".
std::string HeaderOf(const std::vector<std::pair<std::string, std::string>>& headers,
                     std::string_view name);

// Consumer::RunOnce until done() holds (true) or `timeout` passes (false).
bool RunUntil(Consumer& consumer, std::chrono::milliseconds timeout,
              const std::function<bool()>& done);

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_CONSUMER_HELPERS_H_
