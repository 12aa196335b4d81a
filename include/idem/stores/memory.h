// The memory store: sharded, thread-safe, compact; records live as long as the process.
// Its home is tests, caches and single-process users.
#ifndef IDEM_STORES_MEMORY_H_
#define IDEM_STORES_MEMORY_H_

#include <chrono>
#include <cstddef>
#include <memory>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/store.h"

namespace idem {

struct MemoryStoreOptions {
  Clock* clock = nullptr;  // nullptr: Clock::System(). Must outlive the store.
  std::size_t max_key_bytes = kDefaultMaxKeyBytes;  // at most 65535: larger values are capped
  // An IN_PROGRESS record whose lease ran out stays this long (for a takeover with
  // attempt+1) before it is reclaimed as abandoned. Held to 0 .. 10 years (the longest lease
  // or retention any store accepts).
  std::chrono::milliseconds abandoned_retention{24 * 3600 * 1000};
  // Number of independently locked shards (rounded up to a power of two); 0: automatic.
  std::size_t shards = 0;
  // How often the background reaper sweeps expired records; 0 disables the thread
  // (Purge() still reclaims on demand).
  std::chrono::milliseconds reclaim_interval{1000};
  // Who makes ready, ahead of use, the memory a growing store needs: the pages its new records
  // and responses will use (a 2 MiB huge page takes ~5 ms to clear on a VM whose host reclaims
  // freed memory) and a growing shard's next index table. false: the caller that first needs
  // them, outside the shard lock, so that it stalls only itself. true: a store thread of its
  // own, so that no caller waits unless that thread falls behind; for callers whose latency
  // matters more than a second thread's CPU, such as an event loop serving many connections
  // (idemd's gateway sets it). On two busy cores the default was measured faster.
  bool prepare_on_own_thread = false;
};

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options = {});

}  // namespace idem

#endif  // IDEM_STORES_MEMORY_H_
