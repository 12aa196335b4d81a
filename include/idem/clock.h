// Clock: how idem reads time and waits (leveldb's Env, reduced to time).
// Tests inject a fake clock and never sleep to wait for an expiry.
#ifndef IDEM_CLOCK_H_
#define IDEM_CLOCK_H_

#include <chrono>

namespace idem {

// Wall-clock milliseconds since the Unix epoch: what stores persist and compare.
using Timestamp = std::chrono::sys_time<std::chrono::milliseconds>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Timestamp Now() const = 0;
  // Blocks the caller for about `d`. Bounded waits (the receiver's Busy wait policy) use this,
  // so a fake clock can advance time instead of sleeping. One wait does not: a kCoalesce
  // follower waits for the first execution of its key on a condition variable, for up to
  // busy_wait of real time, so that it wakes the moment that execution ends.
  virtual void SleepFor(std::chrono::milliseconds d) const = 0;

  // The process-wide system clock: wall-clock time at the kernel tick's resolution (a few
  // milliseconds; leases and retention should be much longer than that). Thread-safe.
  static Clock& System();
};

}  // namespace idem

#endif  // IDEM_CLOCK_H_
