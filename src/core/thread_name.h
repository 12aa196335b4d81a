// Names the calling thread, so that `top -H`, `ps -L`, perf and gdb show which of idem's
// background threads is which. Linux keeps at most 15 bytes; longer names are cut.
#ifndef IDEM_CORE_THREAD_NAME_H_
#define IDEM_CORE_THREAD_NAME_H_

#include <pthread.h>

#include <cstring>

namespace idem::core {

inline void NameThisThread(const char* name) {
  char cut[16];
  std::strncpy(cut, name, sizeof(cut) - 1);
  cut[sizeof(cut) - 1] = '\0';
  pthread_setname_np(pthread_self(), cut);  // best effort: a name is only a label
}

}  // namespace idem::core

#endif  // IDEM_CORE_THREAD_NAME_H_
