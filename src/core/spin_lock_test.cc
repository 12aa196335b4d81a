#include "core/spin_lock.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace idem::core {
namespace {

using namespace std::chrono_literals;

std::chrono::nanoseconds ThreadCpuTime() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

TEST(SpinLockTest, KeepsOutEveryOtherThread) {
  SpinLock mu;
  std::int64_t counter = 0;  // not atomic: only the lock keeps the increments whole
  constexpr int kThreads = 4;
  constexpr int kEach = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard g(mu);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, std::int64_t{kThreads} * kEach);
}

TEST(SpinLockTest, TryLockFailsWhileHeld) {
  SpinLock mu;
  ASSERT_TRUE(mu.try_lock());
  std::thread other([&] { EXPECT_FALSE(mu.try_lock()); });
  other.join();
  mu.unlock();
  EXPECT_TRUE(mu.try_lock());
  mu.unlock();
}

// A holder that does not let go (here it sleeps; in production it was descheduled) is waited
// for asleep: the waiter leaves its core to others instead of spinning or yielding through it.
// Spinning and yielding, it used all of its wait's time on a core.
TEST(SpinLockTest, AWaiterForALongHeldLockLeavesItsCoreFree) {
  SpinLock mu;
  mu.lock();
  std::atomic<bool> waiting{false};
  std::chrono::nanoseconds cpu{}, wall{};
  std::thread waiter([&] {
    const auto cpu0 = ThreadCpuTime();
    const auto wall0 = std::chrono::steady_clock::now();
    waiting = true;
    mu.lock();
    cpu = ThreadCpuTime() - cpu0;
    wall = std::chrono::steady_clock::now() - wall0;
    mu.unlock();
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(200ms);
  mu.unlock();
  waiter.join();
  EXPECT_GE(wall, 200ms);
  // Naps of 50 us cost a few us of CPU each; 25 % leaves room for slow (sanitized) builds.
  EXPECT_LT(cpu.count(), wall.count() / 4) << "cpu " << cpu.count() << " ns of " << wall.count();
}

}  // namespace
}  // namespace idem::core
