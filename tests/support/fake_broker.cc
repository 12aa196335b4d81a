#include "tests/support/fake_broker.h"

namespace idem::testing {

void FakeBroker::Publish(std::string partition, std::string payload,
                         std::vector<std::pair<std::string, std::string>> headers) {
  std::lock_guard lock(mu_);
  BrokerMessage m;
  m.position = std::to_string(next_position_[partition]++);
  m.partition = std::move(partition);
  m.payload = std::move(payload);
  m.headers = std::move(headers);
  m.handle = next_handle_++;
  queues_[m.partition].push_back(std::move(m));
}

void FakeBroker::PublishKeyed(std::string partition, std::string key, std::string payload) {
  Publish(std::move(partition), std::move(payload), {{"Idempotency-Key", std::move(key)}});
}

std::size_t FakeBroker::Queued() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [name, q] : queues_) n += q.size();
  return n;
}

std::vector<BrokerMessage> FakeBroker::Acknowledged() const {
  std::lock_guard lock(mu_);
  return acknowledged_;
}

std::vector<FakeBroker::DeadLettered> FakeBroker::DeadLetters() const {
  std::lock_guard lock(mu_);
  return dead_letters_;
}

std::size_t FakeBroker::Redelivered() const {
  std::lock_guard lock(mu_);
  return redelivered_;
}

std::vector<std::chrono::milliseconds> FakeBroker::RedeliverDelays() const {
  std::lock_guard lock(mu_);
  return redeliver_delays_;
}

std::vector<std::vector<std::string>> FakeBroker::TouchCalls() const {
  std::lock_guard lock(mu_);
  return touch_calls_;
}

std::size_t FakeBroker::Touched() const {
  std::lock_guard lock(mu_);
  return touched_;
}

Result<std::vector<BrokerMessage>> FakeBroker::Poll(std::size_t max, std::chrono::milliseconds) {
  std::lock_guard lock(mu_);
  if (fail_poll_) return UnavailableError("fake broker: poll refused");
  std::vector<BrokerMessage> out;
  bool more = true;
  while (out.size() < max && more) {
    more = false;
    for (auto& [name, q] : queues_) {
      if (q.empty() || out.size() >= max) continue;
      out.push_back(std::move(q.front()));
      q.pop_front();
      out.back().handle = next_handle_++;  // this delivery's
      polled_.push_back(out.back().handle);
      more = true;
    }
  }
  return out;
}

Status FakeBroker::Acknowledge(std::span<const BrokerMessage* const> messages) {
  std::function<void()> hook;
  {
    std::lock_guard lock(mu_);
    hook = before_acknowledge_;
  }
  if (hook) hook();
  std::lock_guard lock(mu_);
  for (const BrokerMessage* m : messages) {
    acknowledged_.push_back(*m);
    settled_.insert(m->handle);
  }
  return OkStatus();
}

Status FakeBroker::Redeliver(std::span<const BrokerMessage* const> messages,
                             std::chrono::milliseconds delay) {
  std::lock_guard lock(mu_);
  redeliver_delays_.push_back(delay);
  for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
    settled_.insert((*it)->handle);
    BrokerMessage m = **it;
    ++m.deliveries;
    queues_[m.partition].push_front(std::move(m));
    ++redelivered_;
  }
  return OkStatus();
}

Status FakeBroker::DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) {
  std::lock_guard lock(mu_);
  if (fail_dead_letter_) return UnavailableError("fake broker: dead-letter publish refused");
  dead_letters_.push_back({message, DeadLetterHeaders(message, info), std::string(info.reason)});
  return OkStatus();
}

Status FakeBroker::Touch(std::span<const BrokerMessage* const> messages) {
  std::lock_guard lock(mu_);
  touched_ += messages.size();
  std::vector<std::string>& call = touch_calls_.emplace_back();
  for (const BrokerMessage* m : messages) call.push_back(m->partition + ":" + m->position);
  return OkStatus();
}

void FakeBroker::Recycle(std::vector<BrokerMessage> batch) {
  std::lock_guard lock(mu_);
  for (const BrokerMessage& m : batch) {
    recycled_.push_back(m.handle);
    if (!settled_.contains(m.handle)) recycled_unsettled_ = true;
  }
}

std::vector<std::uint64_t> FakeBroker::PolledHandles() const {
  std::lock_guard lock(mu_);
  return polled_;
}

std::vector<std::uint64_t> FakeBroker::RecycledHandles() const {
  std::lock_guard lock(mu_);
  return recycled_;
}

bool FakeBroker::RecycledUnsettled() const {
  std::lock_guard lock(mu_);
  return recycled_unsettled_;
}

}  // namespace idem::testing
