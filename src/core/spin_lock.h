// A test-and-test-and-set lock: taking it is one atomic exchange and releasing it a plain
// store, for critical sections of a few hundred nanoseconds (a batch call's, some tens of
// microseconds). Waiters back off, then yield. A holder that has not let go by then is
// descheduled (more runnable threads than cores), and a yield hands the waiter's core to
// whoever else can run, the holder among them. A waiter naps only once its yields have given
// the core to no one for a millisecond: then it is keeping an idle core busy (the holder
// asleep, or runnable on the other core's queue, which an idle core would take it from), and
// a napping waiter leaves its core free. Napping after a count of yields instead slept
// through the holds of an oversubscribed store and cut the log store's batch API at 64
// callers from ~350 k to ~25 k cycles/s (docs/benchmarks.md, session 37).
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

  // How long a waiter's yields must have given its core to no one before it naps; how long a
  // yield takes when another thread did run (one that returns sooner ran no one); how long a
  // nap is (the kernel's timer slack, 50 us by default, comes on top).
  static constexpr std::chrono::microseconds kNapAfter{1000};
  static constexpr std::chrono::microseconds kYieldRanAnother{50};
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
    using Clock = std::chrono::steady_clock;
    constexpr int kMaxSpins = 64;
    // Since when this waiter's yields have run no one else (never: the last one did).
    constexpr Clock::time_point kNever = Clock::time_point::max();
    Clock::time_point idle_since = kNever;
    for (int spins = 1;; spins = std::min(spins * 2, kMaxSpins)) {
      for (int i = 0; i < spins; ++i) Pause();
      if (try_lock()) return;
      if (spins < kMaxSpins) continue;
      Clock::time_point now = Clock::now();
      if (idle_since != kNever && now - idle_since >= kNapAfter) {
        std::this_thread::sleep_for(kNap);
        if (try_lock()) return;
        now = Clock::now();
      }
      // A yield, also after a nap: it tells whether others want the core again.
      std::this_thread::yield();
      if (Clock::now() - now >= kYieldRanAnother) {
        idle_since = kNever;
      } else if (idle_since == kNever) {
        idle_since = now;
      }
    }
  }
  std::atomic<bool> locked_{false};
};

}  // namespace idem::core

#endif  // IDEM_CORE_SPIN_LOCK_H_
