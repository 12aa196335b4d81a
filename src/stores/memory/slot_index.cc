#include "stores/memory/slot_index.h"

#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>

#include "idem/status.h"
#include "stores/memory/address_range.h"

namespace idem::memory_internal {
namespace {

// Tables of at least kMappedBytes are anonymous mappings of their own, so freeing one gives
// its pages back at once (a heap would keep the outgrown tables of a growing index). Tables
// of at least kHugePageBytes are 2 MiB-aligned and asked to be backed by transparent huge
// pages: a probe into an index of a hundred megabytes then costs a cache miss but fewer page
// walks. All tables are 64-byte aligned (Prefetch keeps log2(capacity) in the low bits).
constexpr std::size_t kMappedBytes = std::size_t{64} << 10;

std::size_t PageRounded(std::size_t bytes) {
  static const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// A new table is written all over at once (a growth moves every entry into it, half of its
// slots). Faulting its pages in with one call (PopulateForWrite) is cheaper than a fault per
// page; and a probe reads a slot before it writes one, so a page faulted by that read maps the
// zero page, and the write then faults again and flushes the other cores' TLBs. Advisory: where
// it fails the pages fault in as they are touched.
void* AllocateZeroed(std::size_t bytes) {
  if (bytes < kMappedBytes) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    return p;
  }
  bytes = PageRounded(bytes);
  if (bytes < kHugePageBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    PopulateForWrite(static_cast<char*>(p), bytes);
    return p;
  }
  // Over-map by one huge page, then trim, so the block starts on a 2 MiB boundary.
  const std::size_t span = bytes + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const std::uintptr_t tail = aligned + bytes;
  if (start + span > tail) munmap(reinterpret_cast<void*>(tail), start + span - tail);
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  // Advisory: without transparent huge pages the table still works with small pages.
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  PopulateForWrite(static_cast<char*>(p), bytes);
  return p;
}

// `bytes` must be what AllocateZeroed was given.
void FreeZeroed(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kMappedBytes) {
    std::free(p);
  } else {
    munmap(p, PageRounded(bytes));
  }
}

constexpr std::uint32_t kInitialCapacity = 16;

std::uint64_t MakeEntry(std::uint32_t tag, std::uint32_t slot) {
  return (std::uint64_t{tag} << 32) | (std::uint64_t{slot} + 1);
}

std::uint64_t* NewTable(std::size_t capacity) {
  return static_cast<std::uint64_t*>(AllocateZeroed(capacity * sizeof(std::uint64_t)));
}

// A table with its log2(capacity) in the low bits (tables are 64-byte aligned).
std::uintptr_t Tagged(const std::uint64_t* table, std::size_t capacity) {
  return reinterpret_cast<std::uintptr_t>(table) |
         static_cast<std::uintptr_t>(std::countr_zero(capacity));
}
std::uint64_t* TableOf(std::uintptr_t tagged) {
  return reinterpret_cast<std::uint64_t*>(tagged & ~std::uintptr_t{63});
}
std::size_t CapacityOf(std::uintptr_t tagged) { return std::size_t{1} << (tagged & 63); }

void FreeTagged(std::uintptr_t tagged) {
  if (tagged != 0) FreeZeroed(TableOf(tagged), CapacityOf(tagged) * sizeof(std::uint64_t));
}

}  // namespace

IndexHint::~IndexHint() { FreeTagged(spare_.load(std::memory_order_relaxed)); }

void IndexHint::MakeSpare() {
  // The capacity read here may be outdated by a growth since: Grow then finds a spare of the
  // wrong size and frees it.
  const std::size_t capacity = CapacityOf(table_.load(std::memory_order_relaxed)) * 2;
  const std::uintptr_t current = spare_.load(std::memory_order_relaxed);
  if (current != 0 && CapacityOf(current) == capacity) return;
  FreeTagged(spare_.exchange(Tagged(NewTable(capacity), capacity), std::memory_order_acq_rel));
}

SlotIndex::SlotIndex(IndexHint& hint)
    : entries_(NewTable(kInitialCapacity)), hint_(hint), mask_(kInitialCapacity - 1) {
  Publish();
}

void SlotIndex::Publish() {
  const std::size_t capacity = std::size_t{mask_} + 1;
  IDEM_CHECK((reinterpret_cast<std::uintptr_t>(entries_) & 63) == 0);
  hint_.table_.store(Tagged(entries_, capacity), std::memory_order_relaxed);
  // A spare pays off only for a table that is a mapping of its own (AllocateZeroed).
  spare_at_ = capacity * 2 * sizeof(std::uint64_t) >= kMappedBytes
                  ? static_cast<std::uint32_t>(capacity * 7 / 10)
                  : 0;
}

SlotIndex::~SlotIndex() {
  // A spare goes with the hint, which outlives the index.
  FreeZeroed(entries_, (std::size_t{mask_} + 1) * sizeof(std::uint64_t));
}

std::size_t SlotIndex::bytes() const {
  const std::uintptr_t spare = hint_.spare_.load(std::memory_order_relaxed);
  return (std::size_t{mask_} + 1 + (spare != 0 ? CapacityOf(spare) : 0)) * sizeof(std::uint64_t);
}

void SlotIndex::Place(std::uint64_t entry) {
  std::uint32_t i = static_cast<std::uint32_t>(entry >> 32) & mask_;
  while (entries_[i] != 0) i = (i + 1) & mask_;
  entries_[i] = entry;
}

void SlotIndex::Insert(std::uint32_t tag, std::uint32_t slot) {
  IDEM_CHECK(slot < kNoSlot);
  // Keep at most 80% of the entries in use so probe runs stay short.
  if ((std::uint64_t{size_} + 1) * 5 > (std::uint64_t{mask_} + 1) * 4) Grow();
  Place(MakeEntry(tag, slot));
  if (++size_ == spare_at_) hint_.want_spare_.store(true, std::memory_order_relaxed);
}

void SlotIndex::Erase(std::uint32_t tag, std::uint32_t slot) {
  const std::uint64_t target = MakeEntry(tag, slot);
  std::uint32_t i = tag & mask_;
  while (entries_[i] != target) {
    IDEM_CHECK(entries_[i] != 0);
    i = (i + 1) & mask_;
  }
  // Backward-shift deletion: move up every later entry of the run that may live at `hole`
  // (its home is not cyclically inside (hole, j]), so lookups never meet a false gap.
  std::uint32_t hole = i;
  for (std::uint32_t j = (i + 1) & mask_; entries_[j] != 0; j = (j + 1) & mask_) {
    const std::uint32_t home = static_cast<std::uint32_t>(entries_[j] >> 32) & mask_;
    const bool home_in_gap = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!home_in_gap) {
      entries_[hole] = entries_[j];
      hole = j;
    }
  }
  entries_[hole] = 0;
  --size_;
}

void SlotIndex::Grow() {
  const std::size_t old_capacity = std::size_t{mask_} + 1;
  IDEM_CHECK(old_capacity <= (std::size_t{1} << 31));
  std::uint64_t* old = entries_;
  const std::uintptr_t spare = hint_.spare_.exchange(0, std::memory_order_acq_rel);
  if (spare != 0 && CapacityOf(spare) == old_capacity * 2) {
    entries_ = TableOf(spare);
    ++spares_taken_;
  } else {
    FreeTagged(spare);
    entries_ = NewTable(old_capacity * 2);
  }
  mask_ = static_cast<std::uint32_t>(old_capacity * 2 - 1);
  for (std::size_t i = 0; i < old_capacity; ++i) {
    if (old[i] != 0) Place(old[i]);
  }
  FreeZeroed(old, old_capacity * sizeof(std::uint64_t));
  hint_.want_spare_.store(false, std::memory_order_relaxed);
  Publish();
}

}  // namespace idem::memory_internal
