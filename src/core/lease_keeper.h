// LeaseKeeper: keeps the leases of running handlers alive from a background thread.
//
// A lease bounds how long a dead worker's key stays IN_PROGRESS; it must not bound how long a
// live handler may run. While a handler runs, its caller holds its keys with a Hold: until the
// Hold is destroyed, the keeper's thread calls the Hold's function once every `period`, and
// that function extends what is due (Store::Extend) and notes what was lost. If the process
// dies, nothing extends the lease any more, and the key is taken over once it runs out.
//
// Taking and dropping a Hold costs one uncontended mutex each and never wakes the thread (it
// sleeps `period` at a time), so a handler of a microsecond pays nothing more; the function's
// first call comes within one period. The functions run one at a time on the keeper's thread,
// outside its mutex: a function stuck in a slow store call delays the other holds' functions,
// never another handler's start or end. A Hold's destructor waits only for a call of its own
// function that is under way: the function may use what its holder owns until the Hold is
// gone, without locks of its own.
#ifndef IDEM_CORE_LEASE_KEEPER_H_
#define IDEM_CORE_LEASE_KEEPER_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace idem::core {

class LeaseKeeper {
 public:
  // `period`: how often a Hold's function is called (at least 1 ms). Starts the thread (a
  // failure to start it throws here, before any key is held, not when a handler is about to
  // run); it wakes once a period, also when nothing is held.
  explicit LeaseKeeper(std::chrono::milliseconds period);
  ~LeaseKeeper();  // no Hold may outlive it
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  class Hold {
   public:
    Hold(LeaseKeeper& keeper, std::function<void()> keep);
    ~Hold();
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    friend class LeaseKeeper;
    LeaseKeeper& keeper_;
    std::function<void()> keep_;
  };

 private:
  void Loop();

  const std::chrono::milliseconds period_;
  std::mutex mu_;                      // guards everything below
  std::condition_variable cv_;         // the thread sleeps on it
  std::condition_variable called_cv_;  // a Hold's destructor waits on it for `calling_`
  std::vector<Hold*> holds_;
  const Hold* calling_ = nullptr;  // the Hold whose function runs now
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace idem::core

#endif  // IDEM_CORE_LEASE_KEEPER_H_
