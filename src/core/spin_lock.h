// A test-and-test-and-set lock: taking it is one atomic exchange and releasing it a plain
// store, for critical sections of a few hundred nanoseconds. Waiters back off, then yield, then
// nap: a holder that has not let go after ~50 us of that is most likely descheduled (more
// runnable threads than cores), and a waiter that kept spinning or yielding would keep its core
// busy the whole time, a core the holder may be waiting for (lock-holder preemption). A napping
// waiter leaves its core free.
#ifndef IDEM_CORE_SPIN_LOCK_H_
#define IDEM_CORE_SPIN_LOCK_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace idem::core {

class SpinLock {
 public:
  void lock() {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    LockSlow();
  }
  bool try_lock() {
    return !locked_.load(std::memory_order_relaxed) &&
           !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

  // Rounds of the longest spin that yield before the waiter naps, and how long a nap is (the
  // kernel's timer slack, 50 us by default, comes on top).
  static constexpr int kYieldsBeforeNap = 16;
  static constexpr std::chrono::microseconds kNap{50};

 private:
  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  void LockSlow() {
    constexpr int kMaxSpins = 64;
    int yields = 0;
    for (int spins = 1;; spins = std::min(spins * 2, kMaxSpins)) {
      for (int i = 0; i < spins; ++i) Pause();
      if (try_lock()) return;
      if (spins < kMaxSpins) continue;
      if (yields < kYieldsBeforeNap) {
        ++yields;
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kNap);
      }
    }
  }
  std::atomic<bool> locked_{false};
};

}  // namespace idem::core

#endif  // IDEM_CORE_SPIN_LOCK_H_
