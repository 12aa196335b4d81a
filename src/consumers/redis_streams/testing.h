// Helpers shared by the Redis Streams broker's tests.
#ifndef IDEM_CONSUMERS_REDIS_STREAMS_TESTING_H_
#define IDEM_CONSUMERS_REDIS_STREAMS_TESTING_H_

#include <string>
#include <string_view>

namespace idem::redis_streams::testing {

// redis://IDEM_TEST_REDIS; a test failure (not a skip) when the variable is unset.
std::string SharedUrl();

// A stream (or directory) name no other test or run uses.
std::string Unique(std::string_view what);

// XPENDING's count of entries pending in group `group` of `stream`; -1 when it cannot ask.
long long PendingCount(const std::string& url, const std::string& stream,
                       const std::string& group = "g");

// PendingCount once it is `expected`, or after about two seconds whatever it is then.
// Acknowledge does not wait for the XACK's answer, so another connection may ask first.
long long PendingCountSettled(const std::string& url, const std::string& stream, long long expected,
                              const std::string& group = "g");

}  // namespace idem::redis_streams::testing

#endif  // IDEM_CONSUMERS_REDIS_STREAMS_TESTING_H_
