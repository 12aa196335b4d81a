#include "core/lease_keeper.h"

#include <algorithm>
#include <utility>

namespace idem::core {

LeaseKeeper::LeaseKeeper(std::chrono::milliseconds period)
    : period_(std::max(period, std::chrono::milliseconds(1))), thread_([this] { Loop(); }) {}

LeaseKeeper::~LeaseKeeper() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

LeaseKeeper::Hold::Hold(LeaseKeeper& keeper, std::function<void()> keep)
    : keeper_(keeper), keep_(std::move(keep)) {
  std::lock_guard lock(keeper_.mu_);
  keeper_.holds_.push_back(this);
}

LeaseKeeper::Hold::~Hold() {
  std::lock_guard lock(keeper_.mu_);
  auto& holds = keeper_.holds_;
  const auto it = std::find(holds.begin(), holds.end(), this);
  *it = holds.back();
  holds.pop_back();
}

void LeaseKeeper::Loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    // Spurious wake-ups only call the functions early; they decide what is due.
    cv_.wait_for(lock, period_);
    if (stop_) return;
    for (Hold* h : holds_) h->keep_();
  }
}

}  // namespace idem::core
