// A test-and-test-and-set lock: taking it is one atomic exchange and releasing it a plain
// store, for critical sections of a few hundred nanoseconds. Waiters back off, then yield.
#ifndef IDEM_CORE_SPIN_LOCK_H_
#define IDEM_CORE_SPIN_LOCK_H_

#include <algorithm>
#include <atomic>
#include <thread>

namespace idem::core {

class SpinLock {
 public:
  void lock() {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    LockSlow();
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

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
    for (int spins = 1;; spins = std::min(spins * 2, kMaxSpins)) {
      for (int i = 0; i < spins; ++i) Pause();
      if (!locked_.load(std::memory_order_relaxed) &&
          !locked_.exchange(true, std::memory_order_acquire)) {
        return;
      }
      if (spins == kMaxSpins) std::this_thread::yield();
    }
  }
  std::atomic<bool> locked_{false};
};

}  // namespace idem::core

#endif  // IDEM_CORE_SPIN_LOCK_H_
