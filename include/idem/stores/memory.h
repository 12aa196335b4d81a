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
  // attempt+1) before it is reclaimed as abandoned.
  std::chrono::milliseconds abandoned_retention{24 * 3600 * 1000};
  // Number of independently locked shards (rounded up to a power of two); 0: automatic.
  std::size_t shards = 0;
  // How often the background reaper sweeps expired records; 0 disables the thread
  // (Purge() still reclaims on demand).
  std::chrono::milliseconds reclaim_interval{1000};
};

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options = {});

}  // namespace idem

#endif  // IDEM_STORES_MEMORY_H_
