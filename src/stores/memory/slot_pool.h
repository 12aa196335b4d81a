// Slot: one record of the memory store in 48 bytes, and the pools that hold them.
//
// A slot keeps the key in its KeyCode form, the scope as a per-shard id, and the record head
// packed into four words. Times are milliseconds since the epoch: `created` in 48 bits, the
// lease deadline and expiry as signed 40-bit offsets from it (±17 years), saturating. The
// attempt count saturates at 65535. The token keeps only the shard's counter (the shard index
// is implied by the key). Long keys, fingerprints and responses live in one out-of-line blob
// per record, named by a 32-bit blob id (0: none); a completed record without a fingerprint,
// response or long key allocates nothing else.
#ifndef IDEM_STORES_MEMORY_SLOT_POOL_H_
#define IDEM_STORES_MEMORY_SLOT_POOL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/machine.h"
#include "stores/memory/address_range.h"
#include "stores/memory/key_code.h"

namespace idem::memory_internal {

inline constexpr std::uint32_t kMaxScopeId = (1u << 20) - 1;
inline constexpr std::uint64_t kMaxTokenSeq = (std::uint64_t{1} << 48) - 1;

class Slot {
 public:
  // A free slot has token counter 0; handed-out tokens start at 1.
  bool used() const { return Bits(w1_, 0, 48) != 0; }

  KeyCode key() const;
  void set_key(const KeyCode& k);

  std::uint32_t scope_id() const {
    return static_cast<std::uint32_t>(Bits(w2_, 52, 12) | (Bits(w3_, 40, 8) << 12));
  }
  void set_scope_id(std::uint32_t id) {
    SetBits(w2_, 52, 12, id);
    SetBits(w3_, 40, 8, id >> 12);
  }

  std::uint32_t blob() const {
    return static_cast<std::uint32_t>(Bits(w1_, 48, 16) | (Bits(w3_, 48, 16) << 16));
  }
  void set_blob(std::uint32_t id) {
    SetBits(w1_, 48, 16, id);
    SetBits(w3_, 48, 16, id >> 16);
  }

  bool has_fingerprint() const { return Bits(w2_, 50, 1) != 0; }
  void set_has_fingerprint(bool v) { SetBits(w2_, 50, 1, v ? 1 : 0); }

  RecordState state() const {
    return Bits(w2_, 48, 1) != 0 ? RecordState::kCompleted : RecordState::kInProgress;
  }
  Timestamp expires() const { return Offset(w3_); }

  // The record head. A token is (shard counter << shard_bits) | shard index.
  core::RecordHead head(int shard_bits, std::uint32_t shard) const;
  // Stores `h`, whose token was handed out by this slot's shard.
  void set_head(const core::RecordHead& h, int shard_bits);

  // Free-list link, for a free slot only.
  std::uint32_t next_free() const { return static_cast<std::uint32_t>(w0_); }
  void MakeFree(std::uint32_t next) {
    *this = Slot();
    w0_ = next;
  }

 private:
  static std::uint64_t Bits(std::uint64_t w, int shift, int n) {
    return (w >> shift) & ((std::uint64_t{1} << n) - 1);
  }
  static void SetBits(std::uint64_t& w, int shift, int n, std::uint64_t v) {
    const std::uint64_t m = ((std::uint64_t{1} << n) - 1) << shift;
    w = (w & ~m) | ((v << shift) & m);
  }
  Timestamp created() const;
  Timestamp Offset(std::uint64_t w) const;

  std::uint64_t key_[2] = {0, 0};
  // created ms (48) | attempt (16)
  std::uint64_t w0_ = 0;
  // token counter (48) | blob id bits 0..15 (16)
  std::uint64_t w1_ = 0;
  // lease deadline offset (40) | key form (8) | completed (1) | failure (1) | has fingerprint
  // (1) | spare (1) | scope id bits 0..11 (12)
  std::uint64_t w2_ = 0;
  // expiry offset (40) | scope id bits 12..19 (8) | blob id bits 16..31 (16)
  std::uint64_t w3_ = 0;
};
static_assert(sizeof(Slot) == 48);

// All slots of a store, in one reserved range of address space: slot `id` lives at
// base + id, so finding a record from its id is one multiply, with no table to read. Pages
// become resident only when first written, and past the first 2 MiB they are backed by
// transparent huge pages where the kernel allows. Runs of kRunSlots ids are handed to shards;
// they come back only when the arena is destroyed. NewRun is thread-safe.
class SlotArena {
 public:
  static constexpr std::uint32_t kRunSlots = 256;

  SlotArena();
  ~SlotArena();
  SlotArena(const SlotArena&) = delete;
  SlotArena& operator=(const SlotArena&) = delete;

  Slot& at(std::uint32_t id) { return base_[id]; }
  const Slot& at(std::uint32_t id) const { return base_[id]; }
  // Starts loading slot `id` (48 bytes may straddle two cache lines).
  void Prefetch(std::uint32_t id) const {
    const char* p = reinterpret_cast<const char*>(base_ + id);
    __builtin_prefetch(p);
    __builtin_prefetch(p + sizeof(Slot) - 1);
  }

  // The first id of a fresh run of zeroed slots, or nullopt when the range is used up.
  std::optional<std::uint32_t> NewRun();
  // Slots (and bytes) of the runs handed out so far.
  std::size_t slots() const {
    return std::size_t{runs_.load(std::memory_order_relaxed)} * kRunSlots;
  }
  std::size_t bytes() const { return slots() * sizeof(Slot); }
  // Makes the pages the next runs will use resident now (FaultAhead): call outside locks.
  void PrefaultNext(std::size_t pages_ahead = 1) { fault_ahead_.Keep(bytes(), pages_ahead); }
  bool WantsPrefault(std::size_t pages_ahead = 1) const {
    return fault_ahead_.Wants(bytes(), pages_ahead);
  }

 private:
  explicit SlotArena(AddressRange range);

  Slot* base_ = nullptr;
  std::size_t reserved_bytes_ = 0;
  std::uint32_t max_runs_ = 0;
  std::atomic<std::uint32_t> runs_{0};
  FaultAhead fault_ahead_;
};

// One shard's share of the arena: the runs it took, and a free list of released slots,
// which are reused first. Not thread-safe (the shard lock guards it).
class SlotPool {
 public:
  // A zeroed slot's id, or nullopt when the arena is full.
  std::optional<std::uint32_t> Allocate(SlotArena& arena);
  void Free(SlotArena& arena, std::uint32_t id);

  // Calls f(id) for every slot id this shard ever handed out (used or free), from the
  // `from`-th one on, at most `count` of them; returns where it stopped (or npos at the end).
  template <typename F>
  std::size_t ForEach(std::size_t from, std::size_t count, F f) const {
    const std::size_t total = handed_out();
    const std::size_t end = from >= total ? total : from + std::min(count, total - from);
    for (std::size_t i = from; i < end; ++i) {
      f(runs_[i / SlotArena::kRunSlots] + static_cast<std::uint32_t>(i % SlotArena::kRunSlots));
    }
    return end == total ? kEnd : end;
  }
  static constexpr std::size_t kEnd = ~std::size_t{0};

 private:
  std::size_t handed_out() const {
    return runs_.empty() ? 0 : (runs_.size() - 1) * SlotArena::kRunSlots + (next_ - runs_.back());
  }
  static constexpr std::uint32_t kNoFree = 0xFFFFFFFF;

  // What every Allocate may write first (the shard keeps these 8 bytes on its lock's line).
  std::uint32_t free_head_ = kNoFree;
  std::uint32_t next_ = 0;           // next unused id of the current run
  std::uint32_t run_end_ = 0;        // end of the current run
  std::vector<std::uint32_t> runs_;  // first ids, in the order taken
};

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_SLOT_POOL_H_
