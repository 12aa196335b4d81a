// What each broker adapter's recycle test expects of the deliveries it polls into the messages
// the consumer handed back (Broker::Recycle), after fuller ones: nothing of the earlier messages
// may show. Header-only: it uses GoogleTest's macros, and idem_testing links no GoogleTest.
#ifndef IDEM_TESTS_SUPPORT_RECYCLED_DELIVERIES_H_
#define IDEM_TESTS_SUPPORT_RECYCLED_DELIVERIES_H_

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <string_view>
#include <vector>

#include "idem/consumer.h"

namespace idem::testing {

// `m` holds three first deliveries of `partition`: payloads[0] with the one header
// {Idempotency-Key, key}, payloads[1] and payloads[2] without headers.
inline void ExpectOnlyTheNextDeliveries(const std::vector<BrokerMessage>& m,
                                        std::string_view partition,
                                        const std::array<std::string_view, 3>& payloads,
                                        std::string_view key) {
  ASSERT_EQ(m.size(), 3u);
  for (const BrokerMessage& d : m) {
    EXPECT_EQ(d.partition, partition);
    EXPECT_EQ(d.deliveries, 1u);
  }
  EXPECT_EQ(m[0].payload, payloads[0]);
  EXPECT_THAT(m[0].headers, ::testing::ElementsAre(::testing::Pair("Idempotency-Key", key)));
  EXPECT_EQ(m[1].payload, payloads[1]);
  EXPECT_TRUE(m[1].headers.empty());
  EXPECT_EQ(m[2].payload, payloads[2]);
  EXPECT_TRUE(m[2].headers.empty());
}

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_RECYCLED_DELIVERIES_H_
