// FakeBroker: an in-memory Broker for the consumer core's tests. Partitions are queues; Poll
// takes messages round-robin over partitions (keeping each one's order), Redeliver puts messages
// back at the head of their partition, and everything the consumer did is recorded.
//
// Thread-safe: several consumers may share one FakeBroker (each message then goes to one of
// them, as with a consumer group).
#ifndef IDEM_TESTS_SUPPORT_FAKE_BROKER_H_
#define IDEM_TESTS_SUPPORT_FAKE_BROKER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "idem/consumer.h"

namespace idem::testing {

class FakeBroker : public Broker {
 public:
  struct DeadLettered {
    BrokerMessage message;
    std::vector<std::pair<std::string, std::string>> headers;  // DeadLetterHeaders()
    std::string reason;
  };

  // Appends a message to its partition; position is its sequence number in that partition.
  void Publish(std::string partition, std::string payload,
               std::vector<std::pair<std::string, std::string>> headers = {});
  // A message with header Idempotency-Key: key.
  void PublishKeyed(std::string partition, std::string key, std::string payload = "{}");

  // Failure injection.
  void FailPoll(bool fail) {
    std::lock_guard l(mu_);
    fail_poll_ = fail;
  }
  void FailDeadLetter(bool fail) {
    std::lock_guard l(mu_);
    fail_dead_letter_ = fail;
  }

  // Runs `hook` at the start of every Acknowledge call (outside the broker's lock), e.g. to
  // make acknowledging take time on a fake clock. An empty function removes it.
  void BeforeAcknowledge(std::function<void()> hook) {
    std::lock_guard l(mu_);
    before_acknowledge_ = std::move(hook);
  }

  std::size_t Queued() const;  // not yet polled (or handed back)
  std::vector<BrokerMessage> Acknowledged() const;
  std::vector<DeadLettered> DeadLetters() const;
  std::size_t Redelivered() const;  // messages handed back so far
  std::vector<std::chrono::milliseconds> RedeliverDelays() const;
  std::size_t Touched() const;
  // "partition:position" of the messages each Touch call named, in order.
  std::vector<std::vector<std::string>> TouchCalls() const;
  // Every delivery (a message as one Poll returned it) gets a handle of its own. The handles
  // Poll returned and those the consumer gave back with Recycle, in order; and whether a
  // delivery was recycled before the consumer had acknowledged it or handed it back.
  std::vector<std::uint64_t> PolledHandles() const;
  std::vector<std::uint64_t> RecycledHandles() const;
  bool RecycledUnsettled() const;

  std::string_view Name() const override { return "fake"; }
  Result<std::vector<BrokerMessage>> Poll(std::size_t max, std::chrono::milliseconds wait) override;
  Status Acknowledge(std::span<const BrokerMessage* const> messages) override;
  Status Redeliver(std::span<const BrokerMessage* const> messages,
                   std::chrono::milliseconds delay) override;
  Status DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) override;
  Status Touch(std::span<const BrokerMessage* const> messages) override;
  void Recycle(std::vector<BrokerMessage> batch) override;
  Status Health() override { return OkStatus(); }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::deque<BrokerMessage>> queues_;
  std::map<std::string, std::uint64_t> next_position_;
  std::uint64_t next_handle_ = 1;
  bool fail_poll_ = false;
  bool fail_dead_letter_ = false;
  std::function<void()> before_acknowledge_;
  std::vector<BrokerMessage> acknowledged_;
  std::vector<DeadLettered> dead_letters_;
  std::size_t redelivered_ = 0;
  std::vector<std::chrono::milliseconds> redeliver_delays_;
  std::size_t touched_ = 0;
  std::vector<std::vector<std::string>> touch_calls_;
  std::vector<std::uint64_t> polled_;
  std::vector<std::uint64_t> recycled_;
  std::set<std::uint64_t> settled_;  // deliveries acknowledged or handed back
  bool recycled_unsettled_ = false;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_FAKE_BROKER_H_
