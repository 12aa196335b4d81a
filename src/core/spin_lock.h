// A test-and-test-and-set lock: taking it is one atomic read-modify-write and releasing it a
// plain store, for critical sections of a few hundred nanoseconds (a batch call's, some tens of
// microseconds). Waiters back off, then yield. A holder that has not let go by then is
// descheduled (more runnable threads than cores), and a yield hands the waiter's core to
// whoever else can run, the holder among them. A waiter naps once one hold has lasted a
// millisecond (the holder asleep or descheduled: waking often for it only burns a core others
// could use, and the naps grow), or once its yields have given the core to no one for a
// millisecond (it is keeping an idle core busy, which could take the holder from the other
// core's queue). Napping after a count of yields instead slept through the holds of an
// oversubscribed store and cut the log store's batch API at 64 callers from ~350 k to ~25 k
// cycles/s (docs/benchmarks.md, session 37); yields alone, beside a process that woke often,
// used 47 % of a core through a 200 ms hold (session 38).
#ifndef IDEM_CORE_SPIN_LOCK_H_
#define IDEM_CORE_SPIN_LOCK_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace idem::core {

class SpinLock {
 public:
  void lock() {
    if (!(word_.fetch_or(kLocked, std::memory_order_acquire) & kLocked)) return;
    LockSlow();
  }
  bool try_lock() {
    return !(word_.load(std::memory_order_relaxed) & kLocked) &&
           !(word_.fetch_or(kLocked, std::memory_order_acquire) & kLocked);
  }
  // Only the holder changes the word while it is locked (a waiter's fetch_or leaves it as it
  // is), so a plain store can free it and count the hold.
  void unlock() {
    word_.store(word_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // How long one hold, or a waiter's yields that gave its core to no one, must last before the
  // waiter naps; how long a yield takes when another thread did run (one that returns sooner
  // ran no one); how long the first nap of a hold is and the longest one (each doubles; the
  // kernel's timer slack, 50 us by default, comes on top).
  static constexpr std::chrono::microseconds kNapAfter{1000};
  static constexpr std::chrono::microseconds kYieldRanAnother{50};
  static constexpr std::chrono::microseconds kNap{50};
  static constexpr std::chrono::microseconds kLongestNap{800};

 private:
  // The low bit: held. The rest: how many holds have ended, so a waiter can tell one long hold
  // from many short ones.
  static constexpr std::uint32_t kLocked = 1;

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
    constexpr Clock::time_point kNever = Clock::time_point::max();
    std::uint32_t hold = word_.load(std::memory_order_relaxed);
    Clock::time_point hold_since = kNever;  // since when `hold` has been seen (not yet)
    // Since when this waiter's yields have run no one else (never: the last one did).
    Clock::time_point idle_since = kNever;
    std::chrono::microseconds nap = kNap;
    for (int spins = 1;; spins = std::min(spins * 2, kMaxSpins)) {
      for (int i = 0; i < spins; ++i) Pause();
      if (try_lock()) return;
      if (spins < kMaxSpins) continue;
      Clock::time_point now = Clock::now();
      if (const std::uint32_t w = word_.load(std::memory_order_relaxed);
          w != hold || hold_since == kNever) {
        hold = w;
        hold_since = now;
        nap = kNap;
      }
      if (now - hold_since >= kNapAfter ||
          (idle_since != kNever && now - idle_since >= kNapAfter)) {
        std::this_thread::sleep_for(nap);
        if (try_lock()) return;
        nap = std::min(nap * 2, kLongestNap);
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
  std::atomic<std::uint32_t> word_{0};
};

}  // namespace idem::core

#endif  // IDEM_CORE_SPIN_LOCK_H_
