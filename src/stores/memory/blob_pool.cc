#include "stores/memory/blob_pool.h"

#include <algorithm>
#include <cstring>

#include "idem/status.h"
#include "stores/memory/address_range.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define IDEM_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define IDEM_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define IDEM_POISON(p, n) static_cast<void>(0)
#define IDEM_UNPOISON(p, n) static_cast<void>(0)
#endif

namespace idem::memory_internal {

// Room for up to 2^31 grains (32 GiB of address space, none of it resident until written).
BlobArena::BlobArena()
    : BlobArena(ReserveAddressRange((std::size_t{1} << 31) * kGrain,
                                    std::size_t{16} * kRunGrains * kGrain)) {}

BlobArena::BlobArena(AddressRange r)
    : base_(r.base),
      reserved_bytes_(r.bytes),
      max_runs_(static_cast<std::uint32_t>(r.bytes / kGrain / kRunGrains)),
      fault_ahead_(r) {}

BlobArena::~BlobArena() {
  // What the shards left poisoned must not stay so for whatever the system maps here next
  // (only the runs handed out: unpoisoning the whole range would write all of its shadow).
  IDEM_UNPOISON(base_, std::size_t{runs_.load(std::memory_order_relaxed)} * kRunGrains * kGrain);
  ReleaseAddressRange({base_, reserved_bytes_});
}

std::optional<std::uint32_t> BlobArena::NewRun() {
  const std::optional<std::uint32_t> run = TakeRun(runs_, max_runs_);
  if (!run) return std::nullopt;
  return *run * kRunGrains;
}

// Under AddressSanitizer every byte of a run that no live blob holds is poisoned, so reading
// past a blob's end, or a freed blob, is reported.
std::optional<std::uint32_t> BlobPool::Allocate(BlobArena& arena, std::size_t bytes) {
  IDEM_CHECK(bytes > 0 && bytes <= kMaxBytes);
  const std::uint32_t n = Grains(bytes);
  std::uint32_t grain = free_[n - 1];
  if (grain != 0) {
    char* p = arena.at(grain);
    IDEM_UNPOISON(p, std::max(bytes, sizeof(grain)));
    std::memcpy(&free_[n - 1], p, sizeof(grain));
    return grain;
  }
  if (run_end_ - next_ < n) {
    // What is left of this run is smaller than any block it could not hold: keep it for one.
    if (run_end_ != next_) Push(arena, next_, run_end_ - next_);
    const std::optional<std::uint32_t> run = arena.NewRun();
    if (!run) return std::nullopt;
    IDEM_POISON(arena.at(*run), std::size_t{BlobArena::kRunGrains} * BlobArena::kGrain);
    next_ = *run;
    run_end_ = *run + BlobArena::kRunGrains;
  }
  grain = next_;
  next_ += n;
  IDEM_UNPOISON(arena.at(grain), bytes);
  return grain;
}

void BlobPool::Free(BlobArena& arena, std::uint32_t grain, std::size_t bytes) {
  Push(arena, grain, Grains(bytes));
}

void BlobPool::Push(BlobArena& arena, std::uint32_t grain, std::uint32_t grains) {
  char* p = arena.at(grain);
  IDEM_UNPOISON(p, sizeof(grain));
  std::memcpy(p, &free_[grains - 1], sizeof(grain));
  IDEM_POISON(p, std::size_t{grains} * BlobArena::kGrain);
  free_[grains - 1] = grain;
}

std::pair<std::uint32_t, char*> ShardBlobs::New(std::size_t size) {
  if (size <= BlobPool::kMaxBytes) {
    if (const std::optional<std::uint32_t> grain = pool_.Allocate(*arena_, size)) {
      return {*grain, arena_->at(*grain)};
    }
  }
  std::uint32_t i = 0;
  if (free_big_.empty()) {
    IDEM_CHECK_MSG(big_.size() < kNotPooled, "too many blobs in a shard");
    i = static_cast<std::uint32_t>(big_.size());
    big_.emplace_back();
  } else {
    i = free_big_.back();
    free_big_.pop_back();
  }
  big_[i] = std::make_unique_for_overwrite<char[]>(size);
  return {kNotPooled | i, big_[i].get()};
}

void ShardBlobs::Delete(std::uint32_t id, std::size_t size) {
  if ((id & kNotPooled) == 0) {
    pool_.Free(*arena_, id, size);
    return;
  }
  big_[id ^ kNotPooled].reset();
  free_big_.push_back(id ^ kNotPooled);
}

}  // namespace idem::memory_internal
