// SlotIndex: one shard's hash index from a record's 32-bit hash tag to its pool slot.
//
// Open addressing with linear probing over 8-byte entries {tag, slot + 1} (0 = empty), at most
// 80% full, power-of-two capacity. The tag chooses the home position, so growing rehashes from
// the entries alone and never reads a record. Erase shifts later entries back (no tombstones).
//
// Not thread-safe: the shard lock guards every call. What callers do without the lock (prefetch,
// prepare the next table) goes through the index's IndexHint.
#ifndef IDEM_STORES_MEMORY_SLOT_INDEX_H_
#define IDEM_STORES_MEMORY_SLOT_INDEX_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace idem::memory_internal {

inline constexpr std::uint32_t kNoSlot = 0xFFFFFFFF;

// What callers use of a SlotIndex before they take the shard lock: where its table is (to
// prefetch the line a probe reads first), and the next table, made ahead of a growth. It is
// written only when the table grows or a next one is wanted or made, so it gets a cache line of
// its own, apart from the lock's, which every call writes: with callers on two cores the lock's
// line is often in the other core's cache, and a prefetch whose address came from that line
// would start only once the line had moved, one miss after the other instead of both at once.
// Thread-safe.
class alignas(64) IndexHint {
 public:
  IndexHint() = default;
  ~IndexHint();
  IndexHint(const IndexHint&) = delete;
  IndexHint& operator=(const IndexHint&) = delete;

  // Starts loading the cache line `tag` probes first. A prefetch of a stale address (a table
  // just outgrown) is harmless.
  void Prefetch(std::uint32_t tag) const {
    // One atomic holds the table address and log2 of its capacity (tables are 64-byte
    // aligned), so the two always match.
    const std::uintptr_t v = table_.load(std::memory_order_relaxed);
    const std::uintptr_t mask = (std::uintptr_t{1} << (v & 63)) - 1;
    __builtin_prefetch(reinterpret_cast<const void*>((v & ~std::uintptr_t{63}) +
                                                     (tag & mask) * sizeof(std::uint64_t)));
  }

  // Once the table is 70% full (and large enough to be a mapping of its own), the first caller
  // here allocates the next table and faults its pages in, so that the growth under the lock
  // only moves entries. Cheap when there is nothing to do.
  void PrepareGrowth() {
    if (!want_spare_.load(std::memory_order_relaxed)) return;
    if (!want_spare_.exchange(false, std::memory_order_relaxed)) return;
    MakeSpare();
  }

  // Whether PrepareGrowth has a table to make.
  bool WantsSpare() const { return want_spare_.load(std::memory_order_relaxed); }

 private:
  friend class SlotIndex;
  void MakeSpare();

  // The table | log2(its capacity).
  std::atomic<std::uintptr_t> table_{0};
  // Set under the lock when a spare is wanted; taken by the one caller that makes it.
  std::atomic<bool> want_spare_{false};
  // The next table (zeroed, faulted in) | log2(its capacity), or 0.
  std::atomic<std::uintptr_t> spare_{0};
};

class SlotIndex {
 public:
  // `hint` must outlive the index, and serve it alone.
  explicit SlotIndex(IndexHint& hint);
  ~SlotIndex();
  SlotIndex(const SlotIndex&) = delete;
  SlotIndex& operator=(const SlotIndex&) = delete;

  // The slot whose tag is `tag` and for which eq(slot) holds, or kNoSlot.
  template <typename Eq>
  std::uint32_t Find(std::uint32_t tag, Eq eq) const {
    for (std::uint32_t i = tag & mask_;; i = (i + 1) & mask_) {
      const std::uint64_t e = entries_[i];
      if (e == 0) return kNoSlot;
      if (static_cast<std::uint32_t>(e >> 32) == tag) {
        const auto slot = static_cast<std::uint32_t>(e) - 1;
        if (eq(slot)) return slot;
      }
    }
  }

  // The first slot whose tag is `tag`, or kNoSlot: a guess to prefetch, not an answer.
  std::uint32_t FirstWithTag(std::uint32_t tag) const {
    for (std::uint32_t i = tag & mask_;; i = (i + 1) & mask_) {
      const std::uint64_t e = entries_[i];
      if (e == 0) return kNoSlot;
      if (static_cast<std::uint32_t>(e >> 32) == tag) return static_cast<std::uint32_t>(e) - 1;
    }
  }

  // Adds an entry; no entry for the same record may exist.
  void Insert(std::uint32_t tag, std::uint32_t slot);
  // Removes the entry {tag, slot}; it must exist.
  void Erase(std::uint32_t tag, std::uint32_t slot);

  std::size_t size() const { return size_; }
  // Growths that took a table PrepareGrowth had made (tests).
  std::uint32_t spares_taken() const { return spares_taken_; }
  // The table's bytes, with the next one's when it is ready.
  std::size_t bytes() const;

 private:
  void Grow();
  void Place(std::uint64_t entry);
  void Publish();

  // All written under the lock (the shard keeps them on its lock's line).
  std::uint64_t* entries_;
  IndexHint& hint_;
  std::uint32_t mask_;
  std::uint32_t size_ = 0;
  std::uint32_t spare_at_ = 0;  // size at which Insert asks for a spare table; 0: never
  std::uint32_t spares_taken_ = 0;
};
static_assert(sizeof(IndexHint) == 64);

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_SLOT_INDEX_H_
