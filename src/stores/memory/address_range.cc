#include "stores/memory/address_range.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace idem::memory_internal {

AddressRange ReserveAddressRange(std::size_t max_bytes, std::size_t min_bytes) {
  for (std::size_t bytes = max_bytes; bytes >= min_bytes; bytes /= 2) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    char* base = static_cast<char*>(p);
#ifdef MADV_HUGEPAGE
    // Advisory: without transparent huge pages the range works with small pages.
    if (bytes > kHugePageBytes)
      madvise(base + kHugePageBytes, bytes - kHugePageBytes, MADV_HUGEPAGE);
#endif
    return AddressRange{base, bytes};
  }
  throw std::bad_alloc();
}

bool PopulateForWrite(char* p, std::size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  return madvise(p, bytes, MADV_POPULATE_WRITE) == 0;
#else
  static_cast<void>(p);
  static_cast<void>(bytes);
  return false;
#endif
}

void FaultAhead::Populate(std::size_t used, std::size_t pages_ahead) {
  if (busy_.exchange(true, std::memory_order_acquire)) return;  // another caller is at it
  std::size_t at = populated_.load(std::memory_order_relaxed);
  // Huge pages beyond the one in use: the next caller to cross into one finds it resident.
  const std::size_t want =
      std::min(range_.bytes, (used / kHugePageBytes + 1 + pages_ahead) * kHugePageBytes);
  while (at < want) {
    if (!PopulateForWrite(range_.base + at, kHugePageBytes)) {
      // An older kernel, or no memory now (the writer's own fault reports that as it always
      // did). Either way stop trying, and fault lazily from here on.
      populated_.store(range_.bytes, std::memory_order_relaxed);
      break;
    }
    at += kHugePageBytes;
    populated_.store(at, std::memory_order_relaxed);
  }
  busy_.store(false, std::memory_order_release);
}

void ReleaseAddressRange(const AddressRange& range) {
  if (range.base != nullptr) munmap(range.base, range.bytes);
}

}  // namespace idem::memory_internal
