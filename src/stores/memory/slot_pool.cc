#include "stores/memory/slot_pool.h"

#include <algorithm>
#include <limits>
#include <new>

#include "stores/memory/address_range.h"
#include "stores/memory/slot_index.h"

namespace idem::memory_internal {
namespace {

constexpr std::int64_t kMaxCreated = (std::int64_t{1} << 48) - 1;
constexpr std::int64_t kMaxOffset = (std::int64_t{1} << 39) - 1;
constexpr std::uint64_t kOffsetMask = (std::uint64_t{1} << 40) - 1;

std::int64_t Ms(Timestamp t) { return t.time_since_epoch().count(); }

}  // namespace

KeyCode Slot::key() const {
  KeyCode k;
  k.w[0] = key_[0];
  k.w[1] = key_[1];
  k.form = static_cast<std::uint8_t>(Bits(w2_, 40, 8));
  return k;
}

void Slot::set_key(const KeyCode& k) {
  key_[0] = k.w[0];
  key_[1] = k.w[1];
  SetBits(w2_, 40, 8, k.form);
}

Timestamp Slot::created() const {
  return Timestamp(std::chrono::milliseconds(static_cast<std::int64_t>(Bits(w0_, 0, 48))));
}

Timestamp Slot::Offset(std::uint64_t w) const {
  // Sign-extend the 40-bit offset.
  const auto offset = static_cast<std::int64_t>((w & kOffsetMask) << 24) >> 24;
  return created() + std::chrono::milliseconds(offset);
}

core::RecordHead Slot::head(int shard_bits, std::uint32_t shard) const {
  core::RecordHead h;
  h.state = state();
  h.outcome = Bits(w2_, 49, 1) != 0 ? Outcome::kFailure : Outcome::kSuccess;
  h.token = (Bits(w1_, 0, 48) << shard_bits) | shard;
  h.attempt = static_cast<std::uint32_t>(w0_ >> 48);
  h.created = created();
  h.lease_deadline = Offset(w2_);
  h.expires = Offset(w3_);
  return h;
}

void Slot::set_head(const core::RecordHead& h, int shard_bits) {
  const std::uint64_t seq = h.token >> shard_bits;
  IDEM_CHECK(seq != 0 && seq <= kMaxTokenSeq);
  const std::int64_t created = std::clamp(Ms(h.created), std::int64_t{0}, kMaxCreated);
  const auto offset = [created](Timestamp t) {
    return static_cast<std::uint64_t>(std::clamp(Ms(t) - created, -kMaxOffset - 1, kMaxOffset)) &
           kOffsetMask;
  };
  constexpr std::uint64_t kLow48 = (std::uint64_t{1} << 48) - 1;
  constexpr std::uint64_t kStateBits = std::uint64_t{3} << 48;
  const std::uint64_t state =
      (h.state == RecordState::kCompleted ? 1u : 0u) | (h.outcome == Outcome::kFailure ? 2u : 0u);
  w0_ = static_cast<std::uint64_t>(created) |
        (std::uint64_t{std::min(h.attempt, core::kMaxAttempt)} << 48);
  w1_ = (w1_ & ~kLow48) | seq;
  w2_ = (w2_ & ~(kOffsetMask | kStateBits)) | offset(h.lease_deadline) | (state << 48);
  w3_ = (w3_ & ~kOffsetMask) | offset(h.expires);
}

// Room for up to 2^30 slots (48 GiB of address space, none of it resident until written).
SlotArena::SlotArena()
    : SlotArena(ReserveAddressRange((std::size_t{1} << 30) * sizeof(Slot),
                                    (std::size_t{1} << 16) * sizeof(Slot))) {}

SlotArena::SlotArena(AddressRange r)
    : base_(reinterpret_cast<Slot*>(r.base)),
      reserved_bytes_(r.bytes),
      max_runs_(static_cast<std::uint32_t>(r.bytes / sizeof(Slot) / kRunSlots)),
      fault_ahead_(r) {}

SlotArena::~SlotArena() { ReleaseAddressRange({reinterpret_cast<char*>(base_), reserved_bytes_}); }

std::optional<std::uint32_t> SlotArena::NewRun() {
  const std::optional<std::uint32_t> run = TakeRun(runs_, max_runs_);
  if (!run) return std::nullopt;
  return *run * kRunSlots;
}

std::optional<std::uint32_t> SlotPool::Allocate(SlotArena& arena) {
  if (free_head_ != kNoFree) {
    const std::uint32_t id = free_head_;
    free_head_ = arena.at(id).next_free();
    arena.at(id) = Slot();
    return id;
  }
  if (next_ == run_end_) {
    const std::optional<std::uint32_t> run = arena.NewRun();
    if (!run) return std::nullopt;
    runs_.push_back(*run);
    next_ = *run;
    run_end_ = *run + SlotArena::kRunSlots;
  }
  // This shard's next new record will go right after this one, many calls from now: ask
  // for its line now, so that insert does not wait for it.
  if (next_ + 1 < run_end_) __builtin_prefetch(&arena.at(next_ + 1), 1);
  return next_++;
}

void SlotPool::Free(SlotArena& arena, std::uint32_t id) {
  arena.at(id).MakeFree(free_head_);
  free_head_ = id;
}

}  // namespace idem::memory_internal
