#include "core/lease_keeper.h"
#include "core/thread_name.h"

#include <algorithm>
#include <utility>

namespace idem::core {

LeaseKeeper::LeaseKeeper(std::chrono::milliseconds period)
    : period_(std::max(period, std::chrono::milliseconds(1))), thread_([this] {
        NameThisThread("idem-lease");
        Loop();
      }) {}

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
  std::unique_lock lock(keeper_.mu_);
  keeper_.called_cv_.wait(lock, [this] { return keeper_.calling_ != this; });
  auto& holds = keeper_.holds_;
  const auto it = std::find(holds.begin(), holds.end(), this);
  *it = holds.back();
  holds.pop_back();
}

void LeaseKeeper::Loop() {
  std::unique_lock lock(mu_);
  std::vector<Hold*> turn;
  while (!stop_) {
    // Spurious wake-ups only call the functions early; they decide what is due.
    cv_.wait_for(lock, period_);
    turn = holds_;
    for (Hold* h : turn) {
      if (stop_) return;
      // Dropped since the turn began (a Hold made since at the same address is called
      // instead, which is as good: its function decides what is due).
      if (std::find(holds_.begin(), holds_.end(), h) == holds_.end()) continue;
      calling_ = h;
      lock.unlock();
      h->keep_();
      lock.lock();
      calling_ = nullptr;
      called_cv_.notify_all();
    }
  }
}

}  // namespace idem::core
