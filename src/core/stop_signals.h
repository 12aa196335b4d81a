// StopSignals: how idemd's two modes (gateway, consume) stop on SIGTERM and SIGINT.
//
// Constructed on the main thread before any other thread starts: it blocks SIGTERM and SIGINT,
// so every thread started afterwards inherits the mask and only Wait() ever takes them, and it
// ignores SIGPIPE (a write to a closed socket is then an error the writer sees, not the end of
// the process).
#ifndef IDEM_CORE_STOP_SIGNALS_H_
#define IDEM_CORE_STOP_SIGNALS_H_

#include <pthread.h>
#include <signal.h>

namespace idem::core {

class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    signal(SIGPIPE, SIG_IGN);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Blocks until SIGTERM or SIGINT arrives; returns which.
  int Wait() const {
    int number = 0;
    sigwait(&set_, &number);
    return number;
  }

 private:
  sigset_t set_;
};

}  // namespace idem::core

#endif  // IDEM_CORE_STOP_SIGNALS_H_
