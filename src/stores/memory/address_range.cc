#include "stores/memory/address_range.h"

#include <sys/mman.h>

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

void ReleaseAddressRange(const AddressRange& range) {
  if (range.base != nullptr) munmap(range.base, range.bytes);
}

}  // namespace idem::memory_internal
