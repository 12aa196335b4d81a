// Blobs: a record's out-of-line bytes (long key, fingerprint, response).
//
// Small blobs, at most BlobPool::kMaxBytes (the common case: a fingerprint and a short
// response), are carved in 16-byte grains from one address range that a store's shards share
// (BlobArena), handed out in 64 KiB runs. So a small blob costs no allocator header, naming
// one takes 32 bits (its first grain), and a growing store takes a page fault per 2 MiB huge
// page rather than per 4 KiB heap page: in `log_store_bench`'s `sync=none` cycles, heap growth
// and its faults behind each completion's blob were about a seventh of the callers' time. Each
// shard keeps a free list per size (BlobPool), so a freed blob is reused by the next blob of
// its size; memory, as for slots, is not given back to the system while the store lives.
// Larger blobs, or any once the range is used up, are separate allocations (the store's).
#ifndef IDEM_STORES_MEMORY_BLOB_POOL_H_
#define IDEM_STORES_MEMORY_BLOB_POOL_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "stores/memory/address_range.h"

namespace idem::memory_internal {

class BlobArena {
 public:
  static constexpr std::size_t kGrain = 16;
  static constexpr std::uint32_t kRunGrains = 4096;  // 64 KiB

  BlobArena();
  ~BlobArena();
  BlobArena(const BlobArena&) = delete;
  BlobArena& operator=(const BlobArena&) = delete;

  char* at(std::uint32_t grain) const { return base_ + std::size_t{grain} * kGrain; }
  // The first grain of a fresh run (never 0), or nullopt when the range is used up.
  std::optional<std::uint32_t> NewRun();
  // Makes the pages the next runs will use resident now (FaultAhead): call outside locks.
  void PrefaultNext(std::size_t pages_ahead = 1) { fault_ahead_.Keep(used(), pages_ahead); }
  bool WantsPrefault(std::size_t pages_ahead = 1) const {
    return fault_ahead_.Wants(used(), pages_ahead);
  }

 private:
  explicit BlobArena(AddressRange range);
  std::size_t used() const {
    return std::size_t{runs_.load(std::memory_order_relaxed)} * kRunGrains * kGrain;
  }

  char* base_ = nullptr;
  std::size_t reserved_bytes_ = 0;
  std::uint32_t max_runs_ = 0;
  std::atomic<std::uint32_t> runs_{1};  // run 0 is never handed out: grain 0 names no blob
  FaultAhead fault_ahead_;
};

// One shard's blocks of the arena. Not thread-safe (the shard lock guards it).
class BlobPool {
 public:
  static constexpr std::size_t kMaxBytes = 256;

  // The first grain of a block of at least `bytes` (1..kMaxBytes), or nullopt when the arena is
  // used up.
  std::optional<std::uint32_t> Allocate(BlobArena& arena, std::size_t bytes);
  // Returns the block Allocate(arena, bytes) gave.
  void Free(BlobArena& arena, std::uint32_t grain, std::size_t bytes);

 private:
  static constexpr std::size_t kClasses = kMaxBytes / BlobArena::kGrain;
  static std::uint32_t Grains(std::size_t bytes) {
    return static_cast<std::uint32_t>((bytes + BlobArena::kGrain - 1) / BlobArena::kGrain);
  }
  void Push(BlobArena& arena, std::uint32_t grain, std::uint32_t grains);

  // Free blocks of n grains: a list through their first 4 bytes, headed by free_[n - 1]
  // (0: empty).
  std::array<std::uint32_t, kClasses> free_{};
  std::uint32_t next_ = 0;     // the current run's next unused grain
  std::uint32_t run_end_ = 0;  // the current run's end
};

// One shard's blobs, each named by a 32-bit id (0: none): a pooled blob by its first grain
// (grains are below 2^31), any other by kNotPooled | its index among the separate
// allocations. Not thread-safe (the shard lock guards it).
class ShardBlobs {
 public:
  static constexpr std::uint32_t kNotPooled = std::uint32_t{1} << 31;

  void set_arena(BlobArena* arena) { arena_ = arena; }
  // A new blob of `size` (> 0) bytes, to be written through the pointer.
  std::pair<std::uint32_t, char*> New(std::size_t size);
  // Frees blob `id`, which New(size) made.
  void Delete(std::uint32_t id, std::size_t size);
  const char* Bytes(std::uint32_t id) const {
    return (id & kNotPooled) != 0 ? big_[id ^ kNotPooled].get() : arena_->at(id);
  }
  // What naming the separate allocations costs, for the store's statistics.
  std::size_t table_bytes() const { return big_.capacity() * sizeof(big_[0]); }

 private:
  BlobArena* arena_ = nullptr;
  BlobPool pool_;
  std::vector<std::unique_ptr<char[]>> big_;
  std::vector<std::uint32_t> free_big_;  // indexes into big_ that hold nothing
};

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_BLOB_POOL_H_
