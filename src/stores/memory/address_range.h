// Address space for a store's arenas: reserved, not committed, so only the pages written
// become resident.
#ifndef IDEM_STORES_MEMORY_ADDRESS_RANGE_H_
#define IDEM_STORES_MEMORY_ADDRESS_RANGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace idem::memory_internal {

// The transparent huge page size this code asks for (x86-64, arm64 with 4 KiB pages).
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

struct AddressRange {
  char* base = nullptr;
  std::size_t bytes = 0;
};

// Reserves the largest range of `max_bytes`, `max_bytes` / 2, ... down to `min_bytes` that the
// system grants (a sanitizer or an address-space limit may refuse the larger ones). Beyond its
// first 2 MiB, which a small store should not pin as a whole huge page, the range is asked to be
// backed by transparent huge pages. Throws std::bad_alloc when even `min_bytes` is refused.
AddressRange ReserveAddressRange(std::size_t max_bytes, std::size_t min_bytes);
void ReleaseAddressRange(const AddressRange& range);

// Makes `bytes` from `p` resident and writable in one call (MADV_POPULATE_WRITE), without
// changing their contents. False where the kernel lacks the advice (before Linux 5.14) or has
// no memory for it now; the pages then fault in when first touched, as they would anyway.
bool PopulateForWrite(char* p, std::size_t bytes);

// Keeps a range's pages resident a little ahead of the part of it in use, so that the fault
// that makes a page resident (for a 2 MiB huge page: clearing it, measured at ~0.4 GB/s on a VM
// whose host takes freed memory back, so ~5 ms) is taken by a caller before it locks a shard,
// not inside the lock, where it stalls every other caller of that shard. Until half of the
// first 2 MiB (small pages, see ReserveAddressRange) is in use nothing is populated, so a small
// store stays small; from then on the `pages_ahead` huge pages after the one in use are
// resident (by default one: at most 4 MiB beyond what is used). Populating never changes a page's
// contents, so it may race with writers of the same pages. Thread-safe; one caller populates at a
// time, the others go on.
class FaultAhead {
 public:
  explicit FaultAhead(AddressRange range) : range_(range) {}

  // `used`: bytes from the range's start that are handed out. Cheap when nothing is to do.
  void Keep(std::size_t used, std::size_t pages_ahead = 1) {
    if (Wants(used, pages_ahead)) Populate(used, pages_ahead);
  }
  // Whether Keep(used, pages_ahead) would populate anything.
  bool Wants(std::size_t used, std::size_t pages_ahead = 1) const {
    return used >= kHugePageBytes / 2 &&
           used + pages_ahead * kHugePageBytes > populated_.load(std::memory_order_relaxed);
  }

  // Bytes populated ahead of use so far (tests).
  std::size_t populated() const { return populated_.load(std::memory_order_relaxed); }

 private:
  void Populate(std::size_t used, std::size_t pages_ahead);

  const AddressRange range_;
  std::atomic<std::size_t> populated_{kHugePageBytes};
  std::atomic<bool> busy_{false};
};

// Takes the next of `limit` runs that `taken` counts (shards share it: lock-free), or nullopt
// once all are taken.
inline std::optional<std::uint32_t> TakeRun(std::atomic<std::uint32_t>& taken,
                                            std::uint32_t limit) {
  std::uint32_t run = taken.load(std::memory_order_relaxed);
  do {
    if (run >= limit) return std::nullopt;
  } while (!taken.compare_exchange_weak(run, run + 1, std::memory_order_relaxed));
  return run;
}

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_ADDRESS_RANGE_H_
