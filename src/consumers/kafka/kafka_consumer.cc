// The Kafka broker (include/idem/consumers/kafka.h): a librdkafka consumer in a group, with
// offsets committed only by Acknowledge, and a producer of its own for dead letters.
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "consumers/kafka/rdkafka_handles.h"
#include "core/spare_messages.h"
#include "idem/consumers/kafka.h"

namespace idem::kafka {
namespace {

using internal::Conf;
using internal::Error;
using internal::Event;
using internal::Handle;
using internal::Metadata;
using internal::PartitionList;
using internal::Queue;
using internal::Set;
using internal::TimeoutMs;
using SteadyClock = std::chrono::steady_clock;

// How long a seek may take to reach the fetcher (a local hand-over, no network).
constexpr std::chrono::milliseconds kSeekTimeout{10'000};
constexpr std::chrono::milliseconds kCommitTimeout{30'000};  // at most; see CommitTimeout()
constexpr std::chrono::milliseconds kHealthTimeout{2'000};
// How long closing waits for the answer to the commit in flight.
constexpr std::chrono::milliseconds kCloseCommitWait{1'000};
// Beyond the session timeout, for leaving the group on close.
constexpr std::chrono::milliseconds kCloseGrace{5'000};
constexpr std::chrono::milliseconds kDeadLetterTimeout{30'000};  // message.timeout.ms default

// One assigned partition. Lives from its assignment to its revocation; a partition assigned
// again gets a new state with a new id, so messages polled before a revoke are recognised.
struct PartitionState {
  std::uint64_t id = 0;  // BrokerMessage::handle of its messages
  std::string topic;
  std::int32_t partition = 0;
  std::string name;  // "topic/N"
  // The next offset this consumer committed (-1: none yet). Commits only move forwards.
  std::int64_t committed = -1;
  // The next offset Acknowledge wants committed; above `committed` while a commit failed.
  std::int64_t pending = -1;
  // The first message handed back by Redeliver and not acknowledged since: commits stop there.
  std::optional<std::int64_t> hold;
  // How often each offset was handed back (offsets not yet committed).
  std::map<std::int64_t, std::uint32_t> handbacks;
  // Kafka keys of delivered, uncommitted messages that had one, by increasing offset.
  std::deque<std::pair<std::int64_t, std::string>> keys;
  // Paused by Redeliver until resume_at; then resumed and sought to resume_offset.
  bool paused = false;
  SteadyClock::time_point resume_at{};
  std::int64_t resume_offset = 0;
};

std::optional<std::int64_t> ParseOffset(std::string_view position) {
  std::int64_t offset = 0;
  auto [end, ec] = std::from_chars(position.data(), position.data() + position.size(), offset);
  if (ec != std::errc() || end != position.data() + position.size() || offset < 0) {
    return std::nullopt;
  }
  return offset;
}

// Errors a consumer sees and recovers from by itself: not worth a failed Poll.
bool Transient(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR__PARTITION_EOF:
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR__NO_OFFSET:
      return true;
    default:
      return false;
  }
}

class KafkaBroker final : public Broker {
 public:
  explicit KafkaBroker(KafkaConsumerConfig config) : config_(std::move(config)) {}

  ~KafkaBroker() override {
    if (consumer_ != nullptr) Close();
    if (producer_ != nullptr) rd_kafka_flush(producer_.get(), TimeoutMs(kDeadLetterTimeout));
  }

  Status Open();

  std::string_view Name() const override { return "kafka"; }
  Result<std::vector<BrokerMessage>> Poll(std::size_t max, std::chrono::milliseconds wait) override;
  Status Acknowledge(std::span<const BrokerMessage* const> messages) override;
  Status Settle() override;
  void Recycle(std::vector<BrokerMessage> batch) override;
  Status Redeliver(std::span<const BrokerMessage* const> messages,
                   std::chrono::milliseconds delay) override;
  Status DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) override;
  Status Health() override;

 private:
  static void RebalanceCallback(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                                rd_kafka_topic_partition_list_t* partitions, void* opaque);
  void Rebalance(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* partitions);
  // Close's unassign, on a thread of its own, waited for until `deadline`; false when it had
  // not returned by then (the handle must then be left behind: see Close).
  static bool UnassignBy(rd_kafka_t* rk, const rd_kafka_topic_partition_list_t* partitions,
                         SteadyClock::time_point deadline);
  static void DeliveryCallback(rd_kafka_t* rk, const rd_kafka_message_t* message, void* opaque);

  PartitionState* Find(std::uint64_t id);
  PartitionState* Find(rd_kafka_topic_t* topic, std::int32_t partition);
  // Takes one message or error event from librdkafka; appends the message to `out`.
  Status Take(rd_kafka_message_t* message, std::vector<BrokerMessage>& out);
  Status ResumeDue(SteadyClock::time_point now);
  Status Seek(const std::vector<std::pair<PartitionState*, std::int64_t>>& targets);
  // Waits for the answer to the commit in flight, then sends what is pending: one commit in
  // flight at a time. Returns the first error among an earlier commit's (found by Poll), the
  // awaited one's and the send's.
  Status CommitPending();
  // Sends the pending offsets as one commit, without waiting for its answer (none in flight).
  Status SendPending();
  // A commit in flight, or acknowledged offsets not yet committed.
  bool HasUncommitted() const;
  static Status NotAnswered(std::chrono::milliseconds wait) {
    return UnavailableError("kafka: commit not answered within " + std::to_string(wait.count()) +
                            " ms");
  }
  // Takes the answer to the commit in flight, waiting up to `wait` for it. ok when none is in
  // flight, when it succeeded, and when `wait` is zero and it is not answered yet; kUnavailable
  // when it failed or a positive `wait` passed without an answer (it is then given up on).
  Status AwaitCommit(std::chrono::milliseconds wait);
  // AwaitCommit, keeping a failure for the next Acknowledge to report (Settle judges by what
  // is still uncommitted).
  void TakeCommitAnswer(std::chrono::milliseconds wait);
  // A commit slower than a session is of no use: the group has moved on by then.
  std::chrono::milliseconds CommitTimeout() const {
    return std::min(kCommitTimeout, config_.session_timeout);
  }
  Status EnsureProducer();
  void Close();
  Status FatalStatus(rd_kafka_t* rk, std::string_view what);

  KafkaConsumerConfig config_;
  Handle consumer_;
  Queue queue_;
  Handle producer_;  // for dead letters; created on the first one
  std::map<std::pair<std::string, std::int32_t>, std::unique_ptr<PartitionState>> partitions_;
  std::unordered_map<std::uint64_t, PartitionState*> by_id_;
  std::uint64_t next_id_ = 1;
  // Messages of one partition arrive in runs: remember the last lookup. Reset by rebalances.
  rd_kafka_topic_t* last_topic_ = nullptr;
  std::int32_t last_partition_ = -1;
  PartitionState* last_state_ = nullptr;
  bool rebalanced_ = false;  // a rebalance ran since the current Poll started
  bool closing_ = false;
  SteadyClock::time_point close_deadline_{};
  bool unassign_stuck_ = false;  // Close's unassign did not return in time: left behind
  // The commit sent by the last Acknowledge (or Poll), not answered yet: its own reply queue
  // (dropped, unread, if the answer never comes), and the offsets and partitions it carries.
  struct SentCommit {
    Queue replies;
    PartitionList offsets;
    std::vector<std::uint64_t> ids;  // PartitionState::id of each of `offsets`, in order
  };
  std::optional<SentCommit> sent_;
  Status commit_error_;  // a failed commit whose answer Poll or a rebalance took: reported next
  Status deferred_;      // an error seen after a Poll had messages: the next Poll returns it
  std::vector<rd_kafka_message_t*> drain_;
  idem::internal::SpareMessages spare_;  // what the consumer is done with (Recycle), for Take
};

Status KafkaBroker::Open() {
  if (config_.brokers.empty())
    return InvalidArgumentError("kafka: brokers (bootstrap.servers) is empty");
  if (config_.group.empty()) return InvalidArgumentError("kafka: group (group.id) is empty");
  if (config_.topics.empty()) return InvalidArgumentError("kafka: no topics to subscribe to");
  for (const std::string& topic : config_.topics) {
    if (topic.empty()) return InvalidArgumentError("kafka: a topic name is empty");
  }
  if (config_.session_timeout < kMinSessionTimeout) {
    return InvalidArgumentError(
        "kafka property 'session.timeout.ms': " + std::to_string(config_.session_timeout.count()) +
        " is below the adapter's minimum of " + std::to_string(kMinSessionTimeout.count()));
  }

  Conf conf(rd_kafka_conf_new());
  const auto session_ms = config_.session_timeout.count();
  internal::Properties settings = {
      {"bootstrap.servers", config_.brokers},
      {"group.id", config_.group},
      {"session.timeout.ms", std::to_string(session_ms)},
      // A third of the session, as Kafka advises, and no more than librdkafka's default.
      {"heartbeat.interval.ms", std::to_string(std::clamp<long long>(session_ms / 3, 1, 3000))},
  };
  if (!config_.client_id.empty()) settings.emplace_back("client.id", config_.client_id);
  for (const auto& [name, value] : settings) {
    if (Status s = Set(conf.get(), name, value); !s.ok()) return s;
  }
  if (Status s = internal::SetAll(conf.get(), config_.properties); !s.ok()) return s;
  // The adapter's guarantees rest on these: set last so that properties cannot undo them.
  const internal::Properties fixed = {
      {"enable.auto.commit", "false"},
      {"enable.auto.offset.store", "false"},
      {"partition.assignment.strategy", "cooperative-sticky"},
      {"auto.offset.reset", "earliest"},
  };
  for (const auto& [name, value] : config_.properties) {
    for (const auto& f : fixed) {
      if (name == f.first && value != f.second) {
        return InvalidArgumentError("kafka property '" + name + "': the adapter needs " + f.second);
      }
    }
  }
  for (const auto& [name, value] : fixed) {
    if (Status s = Set(conf.get(), name, value); !s.ok()) return s;
  }
  rd_kafka_conf_set_rebalance_cb(conf.get(), &KafkaBroker::RebalanceCallback);
  rd_kafka_conf_set_opaque(conf.get(), this);

  auto handle = internal::NewHandle(RD_KAFKA_CONSUMER, std::move(conf));
  if (!handle) return handle.error();
  consumer_ = std::move(*handle);
  // Everything (rebalances, errors) comes through the consumer queue, served by Poll.
  rd_kafka_poll_set_consumer(consumer_.get());
  queue_.reset(rd_kafka_queue_get_consumer(consumer_.get()));

  PartitionList topics(rd_kafka_topic_partition_list_new(static_cast<int>(config_.topics.size())));
  for (const std::string& topic : config_.topics) {
    rd_kafka_topic_partition_list_add(topics.get(), topic.c_str(), RD_KAFKA_PARTITION_UA);
  }
  if (rd_kafka_resp_err_t err = rd_kafka_subscribe(consumer_.get(), topics.get()); err) {
    return InvalidArgumentError(std::string("kafka: cannot subscribe: ") + rd_kafka_err2str(err));
  }
  return {};
}

// Leaves the group, committing nothing. librdkafka 2.0's close can hang for good in
// cooperative mode when a rebalance is under way (librdkafka #4527, #4041; CI met it), so first
// the assignment is given up the ordinary way -- unsubscribe, and poll until the revoke came --
// and then the close has nothing left to revoke. Each step is bounded; a close still not done
// by then leaves the handle behind (destroying it would wait for that same close), and the
// group drops the member after its session timeout.
void KafkaBroker::Close() {
  rd_kafka_t* rk = consumer_.get();
  // The answer to the last commit, so that a healthy cluster has it before the partitions go;
  // a cluster that does not answer within kCloseCommitWait is not waited for longer (the
  // commit was sent, and may land anyway).
  (void)AwaitCommit(std::min(CommitTimeout(), kCloseCommitWait));
  auto deadline = SteadyClock::now() + config_.session_timeout;
  if (rd_kafka_unsubscribe(rk) == RD_KAFKA_RESP_ERR_NO_ERROR) {
    while (!partitions_.empty() && SteadyClock::now() < deadline) {
      if (rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 100)) rd_kafka_message_destroy(m);
    }
  }
  closing_ = true;
  deadline = SteadyClock::now() + config_.session_timeout + kCloseGrace;
  close_deadline_ = deadline;
  Queue events(rd_kafka_queue_new(rk));
  Error error(rd_kafka_consumer_close_queue(rk, events.get()));
  while (error == nullptr && !rd_kafka_consumer_closed(rk) && !unassign_stuck_ &&
         SteadyClock::now() < deadline) {
    Event event(rd_kafka_queue_poll(events.get(), 100));
    if (event != nullptr && rd_kafka_event_type(event.get()) == RD_KAFKA_EVENT_REBALANCE) {
      Rebalance(rd_kafka_event_error(event.get()),
                rd_kafka_event_topic_partition_list(event.get()));
    }
  }
  if (error != nullptr || unassign_stuck_ || !rd_kafka_consumer_closed(rk)) {
    std::fprintf(stderr, "idem kafka: the consumer did not close in time; leaving it behind\n");
    events.reset();
    queue_.reset();
    (void)consumer_.release();
  }
}

void KafkaBroker::RebalanceCallback(rd_kafka_t*, rd_kafka_resp_err_t err,
                                    rd_kafka_topic_partition_list_t* partitions, void* opaque) {
  static_cast<KafkaBroker*>(opaque)->Rebalance(err, partitions);
}

// Called from inside Poll or from Close (the destructor): no batch is being processed, so nothing
// of the revoked partitions is in flight except what the current Poll collected.
void KafkaBroker::Rebalance(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* partitions) {
  // Always the cooperative protocol: the adapter fixes cooperative-sticky. Not asked of
  // librdkafka (rd_kafka_rebalance_protocol): from here, during a close, that waits for the
  // group's thread, which waits for this callback -- a hang CI met.
  rd_kafka_t* rk = consumer_.get();
  rebalanced_ = true;
  last_topic_ = nullptr;
  last_state_ = nullptr;
  Error error;
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    error.reset(rd_kafka_incremental_assign(rk, partitions));
    if (error == nullptr) {
      for (int i = 0; i < partitions->cnt; ++i) {
        const auto& tp = partitions->elems[i];
        auto state = std::make_unique<PartitionState>();
        state->id = next_id_++;
        state->topic = tp.topic;
        state->partition = tp.partition;
        state->name = state->topic + "/" + std::to_string(tp.partition);
        by_id_[state->id] = state.get();
        partitions_[{state->topic, state->partition}] = std::move(state);
      }
    }
  } else {
    // Revoked (or lost): first the commit in flight is answered, so that what was acknowledged
    // before the revoke is committed before the partitions move (as with a synchronous commit).
    TakeCommitAnswer(CommitTimeout());
    // Then forget the partitions. A paused one is resumed first so that its pause does not
    // outlive this assignment.
    PartitionList paused(rd_kafka_topic_partition_list_new(0));
    for (int i = 0; i < partitions->cnt; ++i) {
      const auto& tp = partitions->elems[i];
      auto it = partitions_.find({tp.topic, tp.partition});
      if (it == partitions_.end()) continue;
      if (it->second->paused) {
        rd_kafka_topic_partition_list_add(paused.get(), tp.topic, tp.partition);
      }
      by_id_.erase(it->second->id);
      partitions_.erase(it);
    }
    if (paused->cnt > 0) rd_kafka_resume_partitions(rk, paused.get());
    if (closing_) {
      // During the close the unassign itself can block for good (the same librdkafka bugs; a
      // CI run under load met it here): it gets until the close's deadline.
      unassign_stuck_ = !UnassignBy(rk, partitions, close_deadline_);
    } else {
      error.reset(rd_kafka_incremental_unassign(rk, partitions));
    }
  }
  if (error != nullptr && !closing_) {
    deferred_ = UnavailableError(std::string("kafka: rebalance failed: ") +
                                 rd_kafka_error_string(error.get()));
  }
}

bool KafkaBroker::UnassignBy(rd_kafka_t* rk, const rd_kafka_topic_partition_list_t* partitions,
                             SteadyClock::time_point deadline) {
  // The thread owns what it uses: a copy of the list, and the handle, which a stuck unassign
  // keeps from ever being destroyed (Close leaves it behind). Stuck, the thread is detached
  // and stays blocked inside librdkafka until the process exits.
  struct Call {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto call = std::make_shared<Call>();
  PartitionList list(rd_kafka_topic_partition_list_copy(partitions));
  std::thread unassign([rk, call, list = std::move(list)]() mutable {
    Error(rd_kafka_incremental_unassign(rk, list.get()));  // an error: the close goes on anyway
    std::lock_guard lock(call->mu);
    call->done = true;
    call->cv.notify_all();
  });
  std::unique_lock lock(call->mu);
  const bool done = call->cv.wait_until(lock, deadline, [&] { return call->done; });
  lock.unlock();
  if (done) {
    unassign.join();
  } else {
    unassign.detach();
  }
  return done;
}

PartitionState* KafkaBroker::Find(std::uint64_t id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

PartitionState* KafkaBroker::Find(rd_kafka_topic_t* topic, std::int32_t partition) {
  if (topic == last_topic_ && partition == last_partition_) return last_state_;
  auto it = partitions_.find({rd_kafka_topic_name(topic), partition});
  last_topic_ = topic;
  last_partition_ = partition;
  last_state_ = it == partitions_.end() ? nullptr : it->second.get();
  return last_state_;
}

Status KafkaBroker::FatalStatus(rd_kafka_t* rk, std::string_view what) {
  char reason[512];
  rd_kafka_resp_err_t err = rd_kafka_fatal_error(rk, reason, sizeof reason);
  return UnavailableError(std::string("kafka: fatal error (") + std::string(what) +
                          "): " + (err ? reason : "unknown"));
}

Status KafkaBroker::Take(rd_kafka_message_t* message, std::vector<BrokerMessage>& out) {
  std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> owned(
      message, &rd_kafka_message_destroy);
  if (message->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    if (message->err == RD_KAFKA_RESP_ERR__FATAL) return FatalStatus(consumer_.get(), "consumer");
    if (Transient(message->err)) return {};
    std::string where;
    if (message->rkt != nullptr) {
      where = std::string(" on ") + rd_kafka_topic_name(message->rkt);
      if (message->partition >= 0) where += "/" + std::to_string(message->partition);
    }
    return UnavailableError("kafka: " + std::string(rd_kafka_err2name(message->err)) + where +
                            ": " + rd_kafka_message_errstr(message));
  }
  PartitionState* state = Find(message->rkt, message->partition);
  // Not (or no longer) assigned, or paused by Redeliver: it will be fetched again.
  if (state == nullptr || state->paused) return {};

  BrokerMessage& m = out.emplace_back(spare_.Take());
  m.partition = state->name;
  m.position = std::to_string(message->offset);
  if (message->payload != nullptr) {
    m.payload.assign(static_cast<const char*>(message->payload), message->len);
  }
  internal::CopyHeadersInto(message, m.headers);
  m.handle = state->id;
  if (!state->handbacks.empty()) {
    auto it = state->handbacks.find(message->offset);
    if (it != state->handbacks.end()) m.deliveries = 1 + it->second;
  }
  if (message->key != nullptr) {
    // After a seek back, the deque may hold keys of offsets delivered again.
    while (!state->keys.empty() && state->keys.back().first >= message->offset) {
      state->keys.pop_back();
    }
    state->keys.emplace_back(message->offset,
                             std::string(static_cast<const char*>(message->key), message->key_len));
  }
  return {};
}

Status KafkaBroker::ResumeDue(SteadyClock::time_point now) {
  std::vector<std::pair<PartitionState*, std::int64_t>> targets;
  PartitionList resume(rd_kafka_topic_partition_list_new(0));
  for (auto& [key, state] : partitions_) {
    if (!state->paused || state->resume_at > now) continue;
    state->paused = false;
    rd_kafka_topic_partition_list_add(resume.get(), state->topic.c_str(), state->partition);
    targets.emplace_back(state.get(), state->resume_offset);
  }
  if (targets.empty()) return {};
  rd_kafka_resume_partitions(consumer_.get(), resume.get());
  // A resume restarts fetching at the last position handed to the application, which may be
  // past the offset Redeliver sought to: seek again.
  return Seek(targets);
}

Status KafkaBroker::Seek(const std::vector<std::pair<PartitionState*, std::int64_t>>& targets) {
  PartitionList list(rd_kafka_topic_partition_list_new(static_cast<int>(targets.size())));
  for (const auto& [state, offset] : targets) {
    rd_kafka_topic_partition_list_add(list.get(), state->topic.c_str(), state->partition)->offset =
        offset;
  }
  // Synchronous: no message fetched before the seek reaches the application after it.
  Error error(rd_kafka_seek_partitions(consumer_.get(), list.get(), TimeoutMs(kSeekTimeout)));
  if (error != nullptr) {
    return UnavailableError(std::string("kafka: seek failed: ") +
                            rd_kafka_error_string(error.get()));
  }
  for (int i = 0; i < list->cnt; ++i) {
    if (list->elems[i].err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return UnavailableError(std::string("kafka: seek of ") + list->elems[i].topic + "/" +
                              std::to_string(list->elems[i].partition) +
                              " failed: " + rd_kafka_err2str(list->elems[i].err));
    }
  }
  return {};
}

Result<std::vector<BrokerMessage>> KafkaBroker::Poll(std::size_t max,
                                                     std::chrono::milliseconds wait) {
  if (!deferred_.ok()) return std::exchange(deferred_, Status());
  if (rd_kafka_fatal_error(consumer_.get(), nullptr, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return FatalStatus(consumer_.get(), "consumer");
  }
  std::vector<BrokerMessage> out;
  if (max == 0) return out;
  auto now = SteadyClock::now();
  if (Status s = ResumeDue(now); !s.ok()) return s;
  // Do not sleep past the end of a pause.
  for (const auto& [key, state] : partitions_) {
    if (state->paused) {
      wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(state->resume_at - now));
    }
  }
  // The answer to the commit in flight, if it came; its error goes with the next Acknowledge.
  TakeCommitAnswer(std::chrono::milliseconds(0));
  // With none in flight, what is still pending failed before (during a rebalance, say): it goes
  // again, without waiting.
  if (!sent_) (void)SendPending();
  rebalanced_ = false;
  out.reserve(std::min<std::size_t>(max, 1024));

  Status error;
  if (rd_kafka_message_t* first = rd_kafka_consumer_poll(consumer_.get(), TimeoutMs(wait))) {
    error = Take(first, out);
    // Then what is already there, without waiting.
    while (error.ok() && out.size() < max) {
      drain_.resize(max - out.size());
      ssize_t n = rd_kafka_consume_batch_queue(queue_.get(), 0, drain_.data(), drain_.size());
      if (n <= 0) break;
      for (ssize_t i = 0; i < n; ++i) {
        Status s = Take(drain_[static_cast<std::size_t>(i)], out);  // takes every message
        if (error.ok() && !s.ok()) error = std::move(s);
      }
    }
  }
  if (rebalanced_) {
    // Drop what was collected of partitions revoked meanwhile.
    std::erase_if(out, [&](const BrokerMessage& m) { return Find(m.handle) == nullptr; });
  }
  if (!error.ok()) {
    if (out.empty()) return error;
    deferred_ = std::move(error);
  }
  return out;
}

Status KafkaBroker::Acknowledge(std::span<const BrokerMessage* const> messages) {
  struct Acked {
    std::int64_t max = -1;
    bool clears_hold = false;
  };
  std::map<PartitionState*, Acked> acked;
  for (const BrokerMessage* m : messages) {
    PartitionState* state = Find(m->handle);
    if (state == nullptr) continue;  // revoked since: its new owner reads it again
    auto offset = ParseOffset(m->position);
    if (!offset) return InvalidArgumentError("kafka: bad position '" + m->position + "'");
    Acked& a = acked[state];
    a.max = std::max(a.max, *offset);
    if (state->hold && *state->hold == *offset) a.clears_hold = true;
  }
  for (auto& [state, a] : acked) {
    if (a.clears_hold) state->hold.reset();
    std::int64_t next = a.max + 1;
    if (state->hold) next = std::min(next, *state->hold);
    state->pending = std::max(state->pending, next);
  }
  return CommitPending();
}

Status KafkaBroker::CommitPending() {
  Status earlier = std::exchange(commit_error_, Status());
  Status awaited = AwaitCommit(CommitTimeout());
  Status sent = SendPending();
  if (!earlier.ok()) return earlier;
  return awaited.ok() ? sent : awaited;
}

void KafkaBroker::TakeCommitAnswer(std::chrono::milliseconds wait) {
  if (Status s = AwaitCommit(wait); !s.ok() && commit_error_.ok()) commit_error_ = std::move(s);
}

void KafkaBroker::Recycle(std::vector<BrokerMessage> batch) { spare_.Keep(std::move(batch)); }

Status KafkaBroker::Settle() {
  // An earlier failure matters only if what it failed to commit is still not committed at the
  // end: its offsets went again since.
  commit_error_ = Status();
  // One bound for the whole call. A cluster that did not answer the commit in flight in time
  // is not waited for again: that failure is the answer. One that answered with an error gets
  // the pending offsets again, and the answer to those decides.
  const auto deadline = SteadyClock::now() + CommitTimeout();
  Status first = AwaitCommit(CommitTimeout());
  if (Status s = SendPending(); !s.ok()) return s;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
  if (left <= std::chrono::milliseconds(0)) {
    if (!first.ok()) return first;
    if (!HasUncommitted()) return {};
    return NotAnswered(CommitTimeout());
  }
  if (Status s = AwaitCommit(left); !s.ok()) return s;
  // Offsets of partitions revoked meanwhile are their new owner's: it reads those messages
  // again, and the store answers Replay.
  return {};
}

bool KafkaBroker::HasUncommitted() const {
  return sent_.has_value() ||
         std::any_of(partitions_.begin(), partitions_.end(),
                     [](const auto& p) { return p.second->pending > p.second->committed; });
}

Status KafkaBroker::SendPending() {
  PartitionList list(rd_kafka_topic_partition_list_new(0));
  std::vector<std::uint64_t> ids;
  for (auto& [key, state] : partitions_) {
    if (state->pending <= state->committed) continue;
    rd_kafka_topic_partition_list_add(list.get(), state->topic.c_str(), state->partition)->offset =
        state->pending;
    ids.push_back(state->id);
  }
  if (ids.empty()) return {};
  // Sent without waiting: the round trip to the coordinator (most of a plain consumer's time
  // per batch) overlaps the next batch, and the next Acknowledge takes the answer. A commit
  // that fails stays pending and goes again with the next Poll or Acknowledge, unless the
  // partition is revoked first.
  Queue replies(rd_kafka_queue_new(consumer_.get()));
  rd_kafka_resp_err_t err =
      rd_kafka_commit_queue(consumer_.get(), list.get(), replies.get(), nullptr, nullptr);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError(std::string("kafka: commit failed: ") + rd_kafka_err2str(err));
  }
  sent_.emplace(SentCommit{std::move(replies), std::move(list), std::move(ids)});
  return {};
}

Status KafkaBroker::AwaitCommit(std::chrono::milliseconds wait) {
  if (!sent_) return {};
  // librdkafka's synchronous commit waits without a bound (a commit it defers for a
  // coordinator, say); this gives up after `wait` and lets the answer, if it ever comes, go
  // unread with its queue.
  Event result(rd_kafka_queue_poll(sent_->replies.get(), TimeoutMs(wait)));
  if (result == nullptr) {
    if (wait <= std::chrono::milliseconds(0)) return {};
    sent_.reset();
    return NotAnswered(wait);
  }
  const SentCommit sent = std::move(*sent_);
  sent_.reset();
  if (rd_kafka_resp_err_t err = rd_kafka_event_error(result.get()); err) {
    return UnavailableError(std::string("kafka: commit failed: ") + rd_kafka_err2str(err));
  }
  const rd_kafka_topic_partition_list_t* answered =
      rd_kafka_event_topic_partition_list(result.get());
  std::string failed;
  for (std::size_t i = 0; i < sent.ids.size(); ++i) {
    PartitionState* state = Find(sent.ids[i]);
    if (state == nullptr) continue;  // revoked since
    const rd_kafka_topic_partition_t* tp =
        answered == nullptr
            ? nullptr
            : rd_kafka_topic_partition_list_find(answered, state->topic.c_str(), state->partition);
    const rd_kafka_resp_err_t partition_err =
        tp == nullptr ? RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION : tp->err;
    if (partition_err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      failed += (failed.empty() ? "" : ", ") + state->name + ": " + rd_kafka_err2str(partition_err);
      continue;
    }
    const std::int64_t offset = sent.offsets->elems[i].offset;
    state->committed = std::max(state->committed, offset);
    while (!state->keys.empty() && state->keys.front().first < offset) state->keys.pop_front();
    state->handbacks.erase(state->handbacks.begin(), state->handbacks.lower_bound(offset));
  }
  if (!failed.empty()) return UnavailableError("kafka: commit failed: " + failed);
  return {};
}

Status KafkaBroker::Redeliver(std::span<const BrokerMessage* const> messages,
                              std::chrono::milliseconds delay) {
  std::map<PartitionState*, std::int64_t> first;
  for (const BrokerMessage* m : messages) {
    PartitionState* state = Find(m->handle);
    if (state == nullptr) continue;  // revoked since: its new owner reads it again
    auto offset = ParseOffset(m->position);
    if (!offset) return InvalidArgumentError("kafka: bad position '" + m->position + "'");
    auto [it, inserted] = first.emplace(state, *offset);
    if (!inserted) it->second = std::min(it->second, *offset);
    ++state->handbacks[*offset];
  }
  if (first.empty()) return {};
  std::vector<std::pair<PartitionState*, std::int64_t>> targets(first.begin(), first.end());
  const auto resume_at = SteadyClock::now() + delay;
  PartitionList pause(rd_kafka_topic_partition_list_new(0));
  for (auto& [state, offset] : targets) {
    state->hold = state->hold ? std::min(*state->hold, offset) : offset;
    if (delay > std::chrono::milliseconds(0)) {
      state->resume_offset = state->paused ? std::min(state->resume_offset, offset) : offset;
      state->resume_at = std::max(state->resume_at, resume_at);
      if (!state->paused) {
        rd_kafka_topic_partition_list_add(pause.get(), state->topic.c_str(), state->partition);
      }
      state->paused = true;
    }
  }
  if (pause->cnt > 0) {
    if (rd_kafka_resp_err_t err = rd_kafka_pause_partitions(consumer_.get(), pause.get()); err) {
      return UnavailableError(std::string("kafka: pause failed: ") + rd_kafka_err2str(err));
    }
  }
  return Seek(targets);
}

void KafkaBroker::DeliveryCallback(rd_kafka_t*, const rd_kafka_message_t* message, void*) {
  auto* result = static_cast<rd_kafka_resp_err_t*>(message->_private);
  if (result != nullptr) *result = message->err;
}

Status KafkaBroker::EnsureProducer() {
  if (producer_ != nullptr) return {};
  Conf conf(rd_kafka_conf_new());
  internal::Properties settings = {
      {"bootstrap.servers", config_.brokers},
      {"enable.idempotence", "true"},
      {"message.timeout.ms", std::to_string(kDeadLetterTimeout.count())},
      {"linger.ms", "0"},
  };
  if (!config_.client_id.empty()) settings.emplace_back("client.id", config_.client_id + "-dlq");
  for (const auto& [name, value] : settings) {
    if (Status s = Set(conf.get(), name, value); !s.ok()) return s;
  }
  // The consumer's extra properties (security settings and the like) apply here too, except
  // those that only a consumer knows.
  for (const auto& [name, value] : config_.properties) {
    (void)Set(conf.get(), name, value);
  }
  rd_kafka_conf_set_dr_msg_cb(conf.get(), &KafkaBroker::DeliveryCallback);
  auto handle = internal::NewHandle(RD_KAFKA_PRODUCER, std::move(conf));
  if (!handle) return UnavailableError(handle.error().message());
  producer_ = std::move(*handle);
  return {};
}

Status KafkaBroker::DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) {
  if (config_.dlq_topic.empty()) {
    return FailedPreconditionError("kafka: no dlq_topic configured for the dead letter of " +
                                   message.partition + "@" + message.position);
  }
  if (Status s = EnsureProducer(); !s.ok()) return s;
  const std::string* key = nullptr;
  if (PartitionState* state = Find(message.handle)) {
    if (auto offset = ParseOffset(message.position)) {
      auto it = std::lower_bound(state->keys.begin(), state->keys.end(), *offset,
                                 [](const auto& e, std::int64_t o) { return e.first < o; });
      if (it != state->keys.end() && it->first == *offset) key = &it->second;
    }
  }
  internal::HeaderList headers = internal::NewHeaderList(DeadLetterHeaders(message, info));
  rd_kafka_resp_err_t result = RD_KAFKA_RESP_ERR__IN_PROGRESS;
  rd_kafka_resp_err_t err = rd_kafka_producev(
      producer_.get(), RD_KAFKA_V_TOPIC(config_.dlq_topic.c_str()),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
      RD_KAFKA_V_VALUE(const_cast<char*>(message.payload.data()), message.payload.size()),
      RD_KAFKA_V_KEY(key ? key->data() : nullptr, key ? key->size() : 0),
      RD_KAFKA_V_HEADERS(headers.get()), RD_KAFKA_V_OPAQUE(&result), RD_KAFKA_V_END);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError(std::string("kafka: dead letter to ") + config_.dlq_topic + ": " +
                            rd_kafka_err2str(err));
  }
  (void)headers.release();  // librdkafka owns them now
  // The delivery report sets `result`; message.timeout.ms bounds the wait.
  const auto deadline = SteadyClock::now() + kDeadLetterTimeout + std::chrono::seconds(5);
  while (result == RD_KAFKA_RESP_ERR__IN_PROGRESS && SteadyClock::now() < deadline) {
    rd_kafka_poll(producer_.get(), 100);
  }
  if (result == RD_KAFKA_RESP_ERR__IN_PROGRESS) {
    // Keep `result` alive for the report that may still come: flush until it does.
    rd_kafka_purge(producer_.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    while (result == RD_KAFKA_RESP_ERR__IN_PROGRESS) rd_kafka_poll(producer_.get(), 100);
    return UnavailableError("kafka: dead letter to " + config_.dlq_topic + " not confirmed");
  }
  if (result != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError(std::string("kafka: dead letter to ") + config_.dlq_topic + ": " +
                            rd_kafka_err2str(result));
  }
  return {};
}

Status KafkaBroker::Health() {
  if (rd_kafka_fatal_error(consumer_.get(), nullptr, 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return FatalStatus(consumer_.get(), "consumer");
  }
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err =
      rd_kafka_metadata(consumer_.get(), 0, nullptr, &md, TimeoutMs(kHealthTimeout));
  Metadata owned(md);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return UnavailableError(std::string("kafka: brokers do not answer: ") + rd_kafka_err2str(err));
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<Broker>> OpenKafkaConsumer(const KafkaConsumerConfig& config) {
  auto broker = std::make_unique<KafkaBroker>(config);
  if (Status s = broker->Open(); !s.ok()) return s;
  return std::unique_ptr<Broker>(std::move(broker));
}

}  // namespace idem::kafka
