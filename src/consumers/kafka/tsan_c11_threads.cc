// Built only under ThreadSanitizer (IDEM_SANITIZE=thread), into every program that links
// idem::kafka and into idem-kafka-mock.
//
// librdkafka uses C11 threads (threads.h). glibc implements those on its internal pthread
// functions, which ThreadSanitizer does not intercept: it never learns of librdkafka's threads
// (and crashes at their first allocation) nor of its mutexes and condition variables. These
// definitions take the place of glibc's for librdkafka (the program's symbols come first) and
// go through the pthread functions ThreadSanitizer intercepts. glibc's C11 types are the
// pthread ones under another name, as its own implementation assumes. It also tells TSan to
// leave out races inside librdkafka (below).
#include <errno.h>
#include <pthread.h>
#include <threads.h>

#include <cstdint>
#include <new>

namespace {

int FromPthread(int rc) {
  switch (rc) {
    case 0:
      return thrd_success;
    case ETIMEDOUT:
      return thrd_timedout;
    case EBUSY:
      return thrd_busy;
    case ENOMEM:
      return thrd_nomem;
    default:
      return thrd_error;
  }
}

pthread_mutex_t* Mutex(mtx_t* m) { return reinterpret_cast<pthread_mutex_t*>(m); }
pthread_cond_t* Cond(cnd_t* c) { return reinterpret_cast<pthread_cond_t*>(c); }

struct Start {
  thrd_start_t func;
  void* arg;
};

void* Trampoline(void* p) {
  const Start start = *static_cast<Start*>(p);
  delete static_cast<Start*>(p);
  return reinterpret_cast<void*>(static_cast<std::intptr_t>(start.func(start.arg)));
}

}  // namespace

static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t));
static_assert(sizeof(cnd_t) == sizeof(pthread_cond_t));
static_assert(sizeof(once_flag) == sizeof(pthread_once_t));
static_assert(sizeof(thrd_t) == sizeof(pthread_t));

extern "C" {

// Referenced by internal::NewHandle, so that the linker takes this file along with the adapter.
extern const int idem_kafka_tsan_shim = 1;

int thrd_create(thrd_t* thr, thrd_start_t func, void* arg) {
  auto* start = new (std::nothrow) Start{func, arg};
  if (start == nullptr) return thrd_nomem;
  pthread_t id;
  const int rc = pthread_create(&id, nullptr, &Trampoline, start);
  if (rc != 0) {
    delete start;
    return FromPthread(rc);
  }
  *thr = id;
  return thrd_success;
}

int thrd_join(thrd_t thr, int* res) {
  void* value = nullptr;
  const int rc = pthread_join(thr, &value);
  if (rc == 0 && res != nullptr) {
    *res = static_cast<int>(reinterpret_cast<std::intptr_t>(value));
  }
  return FromPthread(rc);
}

int thrd_detach(thrd_t thr) { return FromPthread(pthread_detach(thr)); }

int mtx_init(mtx_t* m, int type) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  if ((type & mtx_recursive) != 0) pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  const int rc = pthread_mutex_init(Mutex(m), &attr);
  pthread_mutexattr_destroy(&attr);
  return FromPthread(rc);
}
int mtx_lock(mtx_t* m) { return FromPthread(pthread_mutex_lock(Mutex(m))); }
int mtx_trylock(mtx_t* m) { return FromPthread(pthread_mutex_trylock(Mutex(m))); }
int mtx_unlock(mtx_t* m) { return FromPthread(pthread_mutex_unlock(Mutex(m))); }
void mtx_destroy(mtx_t* m) { pthread_mutex_destroy(Mutex(m)); }

int cnd_init(cnd_t* c) { return FromPthread(pthread_cond_init(Cond(c), nullptr)); }
int cnd_signal(cnd_t* c) { return FromPthread(pthread_cond_signal(Cond(c))); }
int cnd_broadcast(cnd_t* c) { return FromPthread(pthread_cond_broadcast(Cond(c))); }
int cnd_wait(cnd_t* c, mtx_t* m) { return FromPthread(pthread_cond_wait(Cond(c), Mutex(m))); }
int cnd_timedwait(cnd_t* __restrict c, mtx_t* __restrict m,
                  const struct timespec* __restrict deadline) {
  return FromPthread(pthread_cond_timedwait(Cond(c), Mutex(m), deadline));
}
void cnd_destroy(cnd_t* c) { pthread_cond_destroy(Cond(c)); }

void call_once(once_flag* flag, void (*func)(void)) {
  pthread_once(reinterpret_cast<pthread_once_t*>(flag), func);
}

}  // extern "C"

// librdkafka is not instrumented: it orders its threads with atomics (reference counts) that
// ThreadSanitizer does not see, so it reports races between two of librdkafka's own
// intercepted calls (pthread_rwlock_destroy after a reader let go). Those are left out; races
// in idem's code are not.
extern "C" const char* __tsan_default_suppressions() {
  return "race:librdkafka.so\n"
         "deadlock:librdkafka.so\n";
}
