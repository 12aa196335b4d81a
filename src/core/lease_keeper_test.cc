#include "core/lease_keeper.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace idem::core {
namespace {

using namespace std::chrono_literals;

// Waits up to 10 s for `done`; false if it never held.
template <typename F>
bool Eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(LeaseKeeperTest, CallsAHoldsFunctionEveryPeriodUntilTheHoldIsGone) {
  LeaseKeeper keeper(1ms);
  std::atomic<int> calls{0};
  auto hold = std::make_unique<LeaseKeeper::Hold>(keeper, [&] { ++calls; });
  EXPECT_TRUE(Eventually([&] { return calls.load() >= 3; }));
  hold.reset();
  const int after = calls.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.load(), after);
}

// A function stuck in a slow store call holds up only its own Hold's destructor: other
// handlers still take and drop holds (they would wait for the store otherwise), and the stuck
// Hold is not destroyed under its running function.
TEST(LeaseKeeperTest, AStuckFunctionBlocksOnlyItsOwnHold) {
  LeaseKeeper keeper(1ms);
  std::promise<void> entered;
  std::atomic<bool> release{false};
  std::atomic<int> calls{0};
  auto stuck = std::make_unique<LeaseKeeper::Hold>(keeper, [&] {
    if (calls++ == 0) {
      entered.set_value();
      while (!release.load()) std::this_thread::sleep_for(1ms);
    }
  });
  entered.get_future().wait();

  std::atomic<int> other_calls{0};
  auto other =
      std::async(std::launch::async, [&] { LeaseKeeper::Hold h(keeper, [&] { ++other_calls; }); });
  EXPECT_EQ(other.wait_for(5s), std::future_status::ready);

  std::atomic<bool> destroyed{false};
  std::thread dropper([&] {
    stuck.reset();
    destroyed = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(destroyed.load());  // its function is still running
  release = true;
  dropper.join();
  EXPECT_TRUE(destroyed.load());
  const int after = calls.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.load(), after);
}

// Many handlers taking and dropping holds at once: no function is called once its Hold's
// destructor has returned (and, under ASan and TSan, none touches a dead frame or races).
TEST(LeaseKeeperTest, NoFunctionIsCalledAfterItsHoldIsGone) {
  LeaseKeeper keeper(1ms);
  std::atomic<long> calls{0}, late_calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        auto gone = std::make_shared<std::atomic<bool>>(false);
        long mine = 0;
        {
          LeaseKeeper::Hold h(keeper, [&, gone] {
            if (gone->load()) ++late_calls;
            ++mine;
            ++calls;
          });
          if ((i + t) % 10 == 0) std::this_thread::sleep_for(2ms);
        }
        gone->store(true);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(late_calls.load(), 0);
  EXPECT_GT(calls.load(), 0);
}

}  // namespace
}  // namespace idem::core
