// Address space for a store's arenas: reserved, not committed, so only the pages written
// become resident.
#ifndef IDEM_STORES_MEMORY_ADDRESS_RANGE_H_
#define IDEM_STORES_MEMORY_ADDRESS_RANGE_H_

#include <cstddef>

namespace idem::memory_internal {

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

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_ADDRESS_RANGE_H_
