// The JetStream Broker: one durable pull consumer, explicit acks. See idem/consumers/nats.h.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "consumers/nats/connection.h"
#include "core/spare_messages.h"
#include "idem/consumers/nats.h"

namespace idem::nats {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

struct SubscriptionCloser {
  void operator()(natsSubscription* s) const { natsSubscription_Destroy(s); }
};
struct ConsumerInfoCloser {
  void operator()(jsConsumerInfo* ci) const { jsConsumerInfo_Destroy(ci); }
};
struct MetaDataCloser {
  void operator()(jsMsgMetaData* m) const { jsMsgMetaData_Destroy(m); }
};
struct PubAckCloser {
  void operator()(jsPubAck* a) const { jsPubAck_Destroy(a); }
};
using SubscriptionPtr = std::unique_ptr<natsSubscription, SubscriptionCloser>;
using ConsumerInfoPtr = std::unique_ptr<jsConsumerInfo, ConsumerInfoCloser>;

// The name an original's Nats-* header gets on its dead letter: Idem-Original-Nats-Msg-Id.
constexpr std::string_view kOriginalHeaderPrefix = "Idem-Original-";
// Message ids a dead letter tries (<stream>:<sequence>, then #2, #3, ...) before it gives up.
constexpr int kMaxDeadLetterIds = 16;

constexpr std::int64_t kNanosPerMilli = 1'000'000;
// A newer message of a held subject (Held) is NAKed to come back this long after the
// handed-back one is due, so that it follows it.
constexpr std::chrono::milliseconds kOvertakerMargin{20};
// How long past its due time a handed-back message may take to come back before the hold on its
// subject is given up (JetStream hands a due redelivery out first; one that does not come went
// to another consumer of the durable, or out of the stream).
constexpr std::chrono::milliseconds kHoldGrace{1'000};
// During a restart hold (RestartHold), a newer message is NAKed to come back after this share
// of ack_wait (at least kMinRestartStep), to be looked at again.
constexpr int kRestartSteps = 10;
constexpr std::chrono::milliseconds kMinRestartStep{50};

// Stream and consumer names become subject tokens of the JetStream API.
bool ValidName(std::string_view name) {
  if (name.empty()) return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return c == '.' || c == '*' || c == '>' || c == ' ' || c == '\t' || c == '\r' || c == '\n' ||
           c == '/' || c == '\\';
  });
}

bool ValidSubject(std::string_view subject, bool wildcards) {
  if (subject.empty() || subject.front() == '.' || subject.back() == '.') return false;
  if (subject.find("..") != std::string_view::npos) return false;
  for (char c : subject) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') return false;
    if (!wildcards && (c == '*' || c == '>')) return false;
  }
  return true;
}

std::vector<std::string_view> Tokens(std::string_view s) {
  std::vector<std::string_view> out;
  while (true) {
    const auto dot = s.find('.');
    out.push_back(s.substr(0, dot));
    if (dot == std::string_view::npos) return out;
    s.remove_prefix(dot + 1);
  }
}

// Whether the literal subject matches `pattern` (with * and >).
bool SubjectMatches(std::string_view pattern, std::string_view subject) {
  const auto p = Tokens(pattern);
  const auto s = Tokens(subject);
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == ">") return s.size() > i;
    if (i >= s.size()) return false;
    if (p[i] != "*" && p[i] != s[i]) return false;
  }
  return p.size() == s.size();
}

Status Validate(const NatsConsumerConfig& c) {
  if (c.url.empty()) return InvalidArgumentError("nats: url is empty");
  if (!ValidName(c.stream)) {
    return InvalidArgumentError("nats: stream '" + c.stream +
                                "' is not a valid stream name (non-empty, no '.', '*', '>', "
                                "spaces or slashes)");
  }
  for (const auto& s : c.subjects) {
    if (!ValidSubject(s, true))
      return InvalidArgumentError("nats: subjects: '" + s + "' is not valid");
  }
  if (c.subjects.empty() && c.create_streams) {
    // Without subjects the stream cannot be created; it must exist already.
  }
  if (!ValidName(c.durable)) {
    return InvalidArgumentError("nats: durable '" + c.durable +
                                "' is not a valid consumer name (non-empty, no '.', '*', '>', "
                                "spaces or slashes)");
  }
  if (!ValidSubject(c.dlq_subject, false)) {
    return InvalidArgumentError("nats: dlq_subject '" + c.dlq_subject +
                                "' is not a valid subject without wildcards");
  }
  if (!ValidName(c.dlq_stream)) {
    return InvalidArgumentError("nats: dlq_stream '" + c.dlq_stream +
                                "' is not a valid stream name");
  }
  if (c.dlq_stream == c.stream) {
    return InvalidArgumentError("nats: dlq_stream must differ from stream ('" + c.stream +
                                "'), or dead letters would be consumed again");
  }
  for (const auto& s : c.subjects) {
    if (SubjectMatches(s, c.dlq_subject)) {
      return InvalidArgumentError("nats: dlq_subject '" + c.dlq_subject +
                                  "' is among the stream's subjects ('" + s +
                                  "'): dead letters would be consumed again");
    }
  }
  if (c.ack_wait < milliseconds(1)) return InvalidArgumentError("nats: ack_wait must be positive");
  if (c.max_ack_pending < 1) {
    return InvalidArgumentError("nats: max_ack_pending must be at least 1");
  }
  if (c.connect_timeout < milliseconds(1)) {
    return InvalidArgumentError("nats: connect_timeout must be positive");
  }
  if (c.request_timeout < milliseconds(1)) {
    return InvalidArgumentError("nats: request_timeout must be positive");
  }
  if (c.consumer_check_interval < milliseconds(1)) {
    return InvalidArgumentError("nats: consumer_check_interval must be positive");
  }
  if (c.reconnect_wait < milliseconds(0)) {
    return InvalidArgumentError("nats: reconnect_wait must not be negative");
  }
  return OkStatus();
}

bool IsUnreachable(natsStatus s) {
  return s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || s == NATS_CONNECTION_CLOSED ||
         s == NATS_CONNECTION_DISCONNECTED || s == NATS_IO_ERROR || s == NATS_NO_SERVER ||
         s == NATS_STALE_CONNECTION || s == NATS_INSUFFICIENT_BUFFER;
}

class NatsBroker final : public Broker {
 public:
  NatsBroker(NatsConsumerConfig config, Connection connection)
      : config_(std::move(config)),
        shown_url_(HideSecrets(config_.url)),
        connection_(std::move(connection)) {}

  ~NatsBroker() override {
    // Messages reference the subscription; drop them first.
    pending_.clear();
    restart_hold_.reset();
    sub_.reset();
  }

  Status Start() {
    if (config_.create_streams) {
      if (config_.subjects.empty()) {
        IDEM_RETURN_IF_ERROR(CheckStream(js(), config_.stream));
      } else {
        IDEM_RETURN_IF_ERROR(EnsureStream(js(), config_.stream, config_.subjects));
      }
      IDEM_RETURN_IF_ERROR(EnsureStream(js(), config_.dlq_stream, {config_.dlq_subject}));
    } else {
      IDEM_RETURN_IF_ERROR(CheckStream(js(), config_.stream));
      IDEM_RETURN_IF_ERROR(CheckStream(js(), config_.dlq_stream));
    }
    auto stream_subjects = StreamSubjects(js(), config_.stream);
    if (!stream_subjects) return stream_subjects.error();
    IDEM_RETURN_IF_ERROR(ChooseFilter(*stream_subjects));
    ConsumerInfoPtr info;
    IDEM_RETURN_IF_ERROR(EnsureConsumer(&info));
    if (info != nullptr) HoldForWhatIsPending(*info);
    return Subscribe();
  }

  std::string_view Name() const override { return "nats"; }

  Result<std::vector<BrokerMessage>> Poll(std::size_t max, milliseconds wait) override {
    std::vector<BrokerMessage> out;
    if (max == 0) return out;
    // What a restart hold released goes first, in order, before anything is fetched.
    if (!ready_.empty()) return TakeReady(max);
    // While libnats reconnects, a pull request would only wait in its reconnect buffer and
    // reach the server later as a stale request: say so at once instead.
    if (!Connected()) return UnavailableError("nats: not connected to " + shown_url_);
    Sweep();
    if (restart_hold_ && SteadyClock::now() >= restart_hold_->until && !ExtendRestartHold()) {
      EndRestartHold();
      if (!ready_.empty()) return TakeReady(max);
    }
    if (restart_hold_) TouchGathered();
    // Never ask for more than max_ack_pending: the server cannot send more, and a fetch that
    // waits for the rest waits out all of `wait` (measured: 1/10 of the rate).
    const int batch = static_cast<int>(
        std::min<std::size_t>(max, static_cast<std::size_t>(config_.max_ack_pending)));
    natsMsgList list{};
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const natsStatus s = natsSubscription_Fetch(&list, sub_.get(), batch,
                                                std::max<std::int64_t>(wait.count(), 1), &jerr);
    if (s == NATS_TIMEOUT || s == NATS_NOT_FOUND) {
      if (!Connected()) return UnavailableError("nats: not connected to " + shown_url_);
      return CheckConsumer(SteadyClock::now());
    }
    if (s != NATS_OK) {
      Status st = UnavailableError(
          ErrorText("nats: fetch from " + config_.stream + "/" + config_.durable, s));
      // No responders while connected: JetStream is still starting after a restart, or the
      // durable is gone (deleted by hand). Create it again for the next poll, at most once a
      // second.
      const auto now = SteadyClock::now();
      if (s == NATS_NO_RESPONDERS && Connected() && now - last_ensure_ >= std::chrono::seconds(1)) {
        last_ensure_ = now;
        (void)EnsureConsumer();
      }
      return st;
    }
    out.reserve(static_cast<std::size_t>(list.Count));
    const auto now = SteadyClock::now();
    for (int i = 0; i < list.Count; ++i) {
      natsMsg* msg = list.Msgs[i];
      list.Msgs[i] = nullptr;  // ours now
      MsgPtr owned(msg);
      BrokerMessage m = spare_.Take();
      std::uint64_t delivered = 1;
      std::uint64_t sequence = 0;
      // The reply subject holds the metadata; reading it in place saves natsMsg_GetMetaData's
      // allocations on the hot path. Anything unexpected goes the library's way.
      const char* reply = natsMsg_GetReply(msg);
      if (auto ack = ParseAckReply(reply != nullptr ? reply : ""); ack.has_value()) {
        m.position = ack->stream_sequence;
        sequence = ack->sequence;
        delivered = ack->delivered;
      } else {
        jsMsgMetaData* raw_meta = nullptr;
        if (natsMsg_GetMetaData(&raw_meta, msg) != NATS_OK) continue;  // not from JetStream
        std::unique_ptr<jsMsgMetaData, MetaDataCloser> meta(raw_meta);
        sequence = meta->Sequence.Stream;
        m.position = std::to_string(sequence);
        delivered = meta->NumDelivered;
      }
      m.partition = natsMsg_GetSubject(msg);
      m.payload.assign(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
      ReadHeadersInto(msg, m.headers);
      m.deliveries = static_cast<std::uint32_t>(std::min<std::uint64_t>(
          std::max<std::uint64_t>(delivered, 1), std::numeric_limits<std::uint32_t>::max()));
      if (Overtakes(m.partition, sequence, owned.get(), now)) continue;
      if (restart_hold_) {
        HoldForRestart(std::move(m), std::move(owned), sequence, now);
        continue;
      }
      m.handle = next_handle_++;
      pending_.emplace(m.handle, Pending{std::move(owned), now, sequence});
      if (ready_.empty()) {
        out.push_back(std::move(m));
      } else {
        ready_.push_back(std::move(m));  // behind what a restart hold released in this fetch
      }
    }
    natsMsgList_Destroy(&list);
    if (!ready_.empty()) return TakeReady(max);
    return out;
  }

  void Recycle(std::vector<BrokerMessage> batch) override { spare_.Keep(std::move(batch)); }

  Status Acknowledge(std::span<const BrokerMessage* const> messages) override {
    return Settle(messages, "ack", [](natsMsg* m) { return natsMsg_Ack(m, nullptr); });
  }

  Status Redeliver(std::span<const BrokerMessage* const> messages, milliseconds delay) override {
    const std::int64_t d = std::max<std::int64_t>(delay.count(), 0);
    Hold(messages, milliseconds(d));
    return Settle(messages, "nak", [d](natsMsg* m) { return natsMsg_NakWithDelay(m, d, nullptr); });
  }

  Status Touch(std::span<const BrokerMessage* const> messages) override {
    const auto now = SteadyClock::now();
    natsStatus first = NATS_OK;
    for (const BrokerMessage* m : messages) {
      auto it = pending_.find(m->handle);
      if (it == pending_.end()) continue;
      it->second.touched = now;
      const natsStatus s = natsMsg_InProgress(it->second.msg.get(), nullptr);
      if (s != NATS_OK && first == NATS_OK) first = s;
    }
    if (first != NATS_OK) return UnavailableError(ErrorText("nats: in-progress", first));
    return Flush("in-progress");
  }

  Status DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) override {
    if (!Connected()) {
      return UnavailableError("nats: not connected to " + shown_url_ + "; no dead letter sent");
    }
    Headers headers = DeadLetterHeaders(message, info);
    // Nats-* is the server's namespace: Nats-Msg-Id, Nats-Rollup, Nats-Expected-*, Nats-TTL
    // and what later servers add decide how (and whether) the DLQ stream stores the publish.
    // The original's are kept under another name: as such, an original Nats-Msg-Id would make
    // the dead letters of two messages that share it one, and a Nats-Rollup would be refused
    // by a DLQ stream without rollups (every retry again).
    for (auto& [name, value] : headers) {
      if (StartsWithIgnoreCase(name, "Nats-")) name.insert(0, kOriginalHeaderPrefix);
    }
    // A dead letter sent again after a crash (before the source message was acked) is stored
    // once within the DLQ stream's duplicate window: its message id is <stream>:<sequence>.
    // When another message holds that id (one of a source stream of the same name, deleted and
    // created again within the window), the next ids are tried in a fixed order, <id>#2, #3,
    // ..., so a repeat after a crash finds its first dead letter again.
    const std::string base = config_.stream + ":" + message.position;
    for (int n = 1; n <= kMaxDeadLetterIds; ++n) {
      const std::string id = n == 1 ? base : base + "#" + std::to_string(n);
      natsMsg* raw = nullptr;
      natsStatus s =
          natsMsg_Create(&raw, config_.dlq_subject.c_str(), nullptr, message.payload.data(),
                         static_cast<int>(message.payload.size()));
      if (s != NATS_OK) return InternalError(ErrorText("nats: dead letter", s));
      MsgPtr out(raw);
      IDEM_RETURN_IF_ERROR(WriteHeaders(out.get(), headers));
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = config_.request_timeout.count();
      po.MsgId = id.c_str();
      jsPubAck* raw_ack = nullptr;
      jsErrCode jerr = static_cast<jsErrCode>(0);
      s = js_PublishMsg(&raw_ack, js(), out.get(), &po, &jerr);
      std::unique_ptr<jsPubAck, PubAckCloser> ack(raw_ack);
      if (s != NATS_OK) {
        return UnavailableError(ErrorText("nats: dead letter to " + config_.dlq_subject, s));
      }
      if (ack == nullptr || !ack->Duplicate) return OkStatus();
      // A duplicate was not stored: the source may be acknowledged only when the message
      // already stored under the id is this one's dead letter.
      Result<bool> ours = IsStoredDeadLetter(*ack, message, id);
      if (!ours) return ours.error();
      if (*ours) return OkStatus();
    }
    return UnavailableError(
        "nats: dead letter ids " + base + " to " + base + "#" + std::to_string(kMaxDeadLetterIds) +
        " are all taken by other messages in " + config_.dlq_stream + "; not stored");
  }

  Status Health() override {
    if (Connected()) return OkStatus();
    return UnavailableError("nats: not connected to " + shown_url_);
  }

 private:
  struct Pending {
    MsgPtr msg;
    SteadyClock::time_point touched;
    std::uint64_t sequence;  // in the stream (BrokerMessage::position, as a number)
  };

  // A subject whose messages from `sequence` on were handed back (NAKed): JetStream lets newer
  // messages of the subject out meanwhile (max_ack_pending has room once the rest of the batch
  // is acked), and would hand them to the consumer first. Held, they are NAKed again on arrival
  // until the handed-back one comes back, or `until` passes (it may have gone to another
  // consumer of the durable, or out of the stream): order within a subject holds.
  struct Held {
    std::uint64_t sequence;
    SteadyClock::time_point due;    // when JetStream hands the first of them out again
    SteadyClock::time_point until;  // the hold is given up
  };

  void Hold(std::span<const BrokerMessage* const> messages, milliseconds delay) {
    const auto now = SteadyClock::now();
    for (const BrokerMessage* m : messages) {
      auto p = pending_.find(m->handle);
      if (p != pending_.end()) HoldSubject(m->partition, p->second.sequence, now, delay);
    }
  }

  // Holds `subject` from message `seq` on, which was NAKed `now` with `delay`; a hold from an
  // older message still in force stays.
  void HoldSubject(const std::string& subject, std::uint64_t seq, SteadyClock::time_point now,
                   milliseconds delay) {
    auto [it, inserted] = held_.try_emplace(subject, Held{seq, {}, {}});
    if (!inserted && seq >= it->second.sequence && now < it->second.until) return;
    it->second = {seq, now + delay, now + delay + kHoldGrace};
  }

  // True when message `seq` of `subject` (not handed out yet) is newer than a handed-back
  // message of its subject: it is NAKed to come back after that one. An older message passes
  // and leaves the hold as it is (after a restart, the previous process's messages come back
  // while this one's newer messages are held).
  bool Overtakes(const std::string& subject, std::uint64_t seq, natsMsg* msg,
                 SteadyClock::time_point now) {
    if (held_.empty()) return false;
    auto it = held_.find(subject);
    if (it == held_.end() || seq < it->second.sequence) return false;
    if (seq == it->second.sequence || now >= it->second.until) {
      held_.erase(it);  // the handed-back message is back (or given up): the subject flows
      return false;
    }
    const auto wait = std::chrono::ceil<milliseconds>(it->second.due - now) + kOvertakerMargin;
    (void)natsMsg_NakWithDelay(msg, std::max<std::int64_t>(wait.count(), 1), nullptr);
    // During a restart hold, every held subject is held behind a newer message it NAKed.
    if (restart_hold_) restart_hold_->naked.insert(seq);
    return true;
  }

  // What the durable had delivered and not seen acknowledged when this Broker started: the
  // messages a process before this one polled and never settled (it was killed, or stopped
  // without handing them back). JetStream delivers them again once their ack_wait (or NAK
  // delay) runs out, but not in their order: a killed consumer had touched (+WPI) only its
  // batch's unsettled messages, so the settled ones come back first, and what it had NAKed
  // comes back when its delay ends. Meanwhile JetStream lets newer messages out as far as
  // max_ack_pending has room (once the settled ones are acknowledged, ahead of the unsettled
  // ones). So until every message pending at the start is back (or ack_wait and a grace have
  // passed, twice that when the server still counts some pending then: ExtendRestartHold; one
  // may have gone to another consumer of the durable, or out of the stream):
  //   - those messages are gathered, and then handed out in stream order (ready_);
  //   - a message newer than all of them is NAKed, to be looked at again a step later, and its
  //     subject is held behind it (HoldSubject). After another crash it is one of the pending
  //     ones, and is gathered and ordered with the rest.
  struct RestartHold {
    struct Gathered {
      BrokerMessage message;
      MsgPtr msg;
      SteadyClock::time_point touched;  // arrived, or last sent +WPI
    };
    std::uint64_t last_delivered;  // the newest stream sequence delivered before the start
    std::size_t pending;           // how many messages were pending at the start
    std::map<std::uint64_t, Gathered> gathered;  // by stream sequence
    std::set<std::uint64_t> naked;  // newer messages NAKed meanwhile (pending at the server)
    SteadyClock::time_point until;  // the hold is given up (or extended once: ExtendRestartHold)
    bool extended = false;
  };

  // `info`: the durable's, as EnsureConsumer found (or made) it at the start.
  void HoldForWhatIsPending(const jsConsumerInfo& info) {
    if (info.NumAckPending <= 0) return;
    restart_hold_.emplace();
    restart_hold_->last_delivered = info.Delivered.Stream;
    restart_hold_->pending = static_cast<std::size_t>(info.NumAckPending);
    restart_hold_->until = SteadyClock::now() + config_.ack_wait + kHoldGrace;
  }

  // Message `seq` of `m.partition` arrived during the restart hold: gathered when it was
  // pending at the start (a second delivery replaces the first), else NAKed.
  void HoldForRestart(BrokerMessage m, MsgPtr msg, std::uint64_t seq, SteadyClock::time_point now) {
    RestartHold& h = *restart_hold_;
    if (seq <= h.last_delivered) {
      h.gathered.insert_or_assign(seq, RestartHold::Gathered{std::move(m), std::move(msg), now});
      if (h.gathered.size() >= h.pending) EndRestartHold();
      return;
    }
    const milliseconds step = std::max(kMinRestartStep, config_.ack_wait / kRestartSteps);
    const milliseconds delay =
        std::clamp(std::chrono::ceil<milliseconds>(h.until - now), milliseconds(1), step);
    (void)natsMsg_NakWithDelay(msg.get(), delay.count(), nullptr);
    h.naked.insert(seq);
    HoldSubject(m.partition, seq, now, delay);
  }

  // At the hold's deadline with messages still missing: true when the hold goes on for another
  // ack_wait (and grace), once. A delivery of a missing message may have been lost on its way
  // (CI saw one delivered to nobody this Broker heard of, and back an ack_wait later, after the
  // hold had ended: its subject's newer messages had been handed out first). The server is
  // asked: when it counts more messages pending than those this Broker gathered and NAKed, some
  // are still out there and due within an ack_wait. When they went to another consumer of the
  // durable, the hold ends an ack_wait later than it would have; when they left the stream, or
  // the server cannot be asked, it ends now.
  bool ExtendRestartHold() {
    RestartHold& h = *restart_hold_;
    if (h.extended || h.gathered.size() >= h.pending) return false;
    h.extended = true;
    ConsumerInfoPtr info;
    jsErrCode jerr{};
    if (GetConsumerInfo(info, jerr) != NATS_OK || info == nullptr) return false;
    const auto held = static_cast<std::int64_t>(h.gathered.size() + h.naked.size());
    if (info->NumAckPending <= held) return false;
    h.until = SteadyClock::now() + config_.ack_wait + kHoldGrace;
    return true;
  }

  // A gathered message may wait longer than its ack_wait for the others: +WPI at half of it, so
  // that it is not delivered again (a second copy arriving after the hold ended would be
  // handed out twice).
  void TouchGathered() {
    const auto now = SteadyClock::now();
    bool sent = false;
    for (auto& [seq, g] : restart_hold_->gathered) {
      if (now - g.touched < config_.ack_wait / 2) continue;
      (void)natsMsg_InProgress(g.msg.get(), nullptr);
      g.touched = now;
      sent = true;
    }
    if (sent) (void)Flush("in-progress");
  }

  // Hands out what the hold gathered, in stream order (so each subject's), before anything
  // fetched after it.
  void EndRestartHold() {
    const auto now = SteadyClock::now();
    for (auto& [seq, g] : restart_hold_->gathered) {
      g.message.handle = next_handle_++;
      pending_.emplace(g.message.handle, Pending{std::move(g.msg), now, seq});
      ready_.push_back(std::move(g.message));
    }
    restart_hold_.reset();
  }

  // What a restart hold released, in order. A message of a subject held meanwhile (the consumer
  // handed back an older one of it) is NAKed like one fetched (Overtakes).
  std::vector<BrokerMessage> TakeReady(std::size_t max) {
    std::vector<BrokerMessage> out;
    const auto now = SteadyClock::now();
    while (!ready_.empty() && out.size() < max) {
      BrokerMessage& m = ready_.front();
      if (auto p = pending_.find(m.handle);
          p != pending_.end() &&
          Overtakes(m.partition, p->second.sequence, p->second.msg.get(), now)) {
        pending_.erase(p);
        ready_.pop_front();
        continue;
      }
      out.push_back(std::move(m));
      ready_.pop_front();
    }
    return out;
  }

  jsCtx* js() { return connection_.js.get(); }

  // After a PubAck that says duplicate: true when the DLQ message it names is the dead letter
  // of `message` (a repeat after a crash), false when it is another message (the id was taken,
  // e.g. by a stream deleted and created again within the duplicate window); kUnavailable
  // when it cannot be read.
  Result<bool> IsStoredDeadLetter(const jsPubAck& ack, const BrokerMessage& message,
                                  const std::string& id) {
    const std::string stream = ack.Stream != nullptr ? ack.Stream : config_.dlq_stream;
    const std::string what = "nats: dead letter " + id + " was taken for a duplicate of " + stream +
                             "/" + std::to_string(ack.Sequence);
    natsMsg* raw = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const natsStatus s = js_GetMsg(&raw, js(), stream.c_str(), ack.Sequence, nullptr, &jerr);
    MsgPtr stored(raw);
    if (s != NATS_OK) return UnavailableError(ErrorText(what + "; reading it back", s));
    const std::string source = message.partition + "@" + message.position;
    const char* stored_source = nullptr;
    const bool same =
        natsMsgHeader_Get(stored.get(), std::string(kDlqSourceHeader).c_str(), &stored_source) ==
            NATS_OK &&
        stored_source != nullptr && source == stored_source &&
        std::string_view(natsMsg_GetData(stored.get()),
                         static_cast<std::size_t>(natsMsg_GetDataLength(stored.get()))) ==
            message.payload;
    return same;
  }

  bool Connected() const {
    return natsConnection_Status(connection_.conn.get()) == NATS_CONN_STATUS_CONNECTED;
  }

  static bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) ==
                    std::tolower(static_cast<unsigned char>(y));
           });
  }
  static bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix) {
    return s.size() >= prefix.size() && EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
  }

  // A filter only when the stream holds more than `subjects`: nats-server 2.9 delivers about a
  // quarter slower through a filtered consumer, even one whose filter covers the whole stream.
  Status ChooseFilter(std::vector<std::string> stream_subjects) {
    std::vector<std::string> wanted = config_.subjects;
    std::sort(stream_subjects.begin(), stream_subjects.end());
    std::sort(wanted.begin(), wanted.end());
    if (wanted.empty() || wanted == stream_subjects) {
      filter_.clear();
      return OkStatus();
    }
    if (wanted.size() == 1) {
      filter_ = wanted.front();
      return OkStatus();
    }
    // A consumer of nats-server 2.9 has at most one filter subject.
    return FailedPreconditionError("nats: subjects: stream '" + config_.stream +
                                   "' holds other subjects too, and a consumer can filter on "
                                   "one subject only; give one subject, or none for all");
  }

  // An idle poll: once per consumer_check_interval, make sure the durable still exists (a pull
  // request to a deleted one is never answered, so Poll alone would wait forever).
  Result<std::vector<BrokerMessage>> CheckConsumer(SteadyClock::time_point now) {
    if (now - last_ensure_ < config_.consumer_check_interval) return std::vector<BrokerMessage>{};
    last_ensure_ = now;
    ConsumerInfoPtr info;
    jsErrCode jerr{};
    const natsStatus s = GetConsumerInfo(info, jerr);
    if (s == NATS_OK) return std::vector<BrokerMessage>{};
    if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr) {
      IDEM_RETURN_IF_ERROR(EnsureConsumer());
      return std::vector<BrokerMessage>{};
    }
    return UnavailableError(ErrorText("nats: consumer info " + config_.durable, s));
  }

  // The durable's info (config and state) as the server has it now.
  natsStatus GetConsumerInfo(ConsumerInfoPtr& info, jsErrCode& jerr) {
    jsConsumerInfo* raw = nullptr;
    jerr = static_cast<jsErrCode>(0);
    const natsStatus s = js_GetConsumerInfo(&raw, js(), config_.stream.c_str(),
                                            config_.durable.c_str(), nullptr, &jerr);
    info.reset(raw);
    return s;
  }

  // Creates the durable, or updates it to this config; `info`, when given, gets its info as the
  // server answered (its state included).
  Status EnsureConsumer(ConsumerInfoPtr* info_out = nullptr) {
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = config_.durable.c_str();
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    cc.AckWait = config_.ack_wait.count() * kNanosPerMilli;
    cc.MaxAckPending = config_.max_ack_pending;
    if (!filter_.empty()) cc.FilterSubject = filter_.c_str();
    ConsumerInfoPtr info;
    jsErrCode jerr{};
    natsStatus s = GetConsumerInfo(info, jerr);
    const bool exists = s == NATS_OK;
    if (!exists && s != NATS_NOT_FOUND && jerr != JSConsumerNotFoundErr) {
      return UnavailableError(ErrorText("nats: consumer info " + config_.durable, s));
    }
    jsConsumerInfo* raw = nullptr;
    jerr = static_cast<jsErrCode>(0);
    s = exists ? js_UpdateConsumer(&raw, js(), config_.stream.c_str(), &cc, nullptr, &jerr)
               : js_AddConsumer(&raw, js(), config_.stream.c_str(), &cc, nullptr, &jerr);
    info.reset(raw);
    if (s == NATS_OK) {
      if (info_out != nullptr) *info_out = std::move(info);
      return OkStatus();
    }
    const std::string what = std::string("nats: ") + (exists ? "update" : "create") +
                             " consumer '" + config_.durable + "' on stream '" + config_.stream +
                             "'";
    if (IsUnreachable(s)) return UnavailableError(ErrorText(what, s));
    return FailedPreconditionError(ErrorText(what, s));
  }

  Status Subscribe() {
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = config_.stream.c_str();
    so.Consumer = config_.durable.c_str();
    so.ManualAck = true;
    natsSubscription* raw = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const natsStatus s =
        js_PullSubscribe(&raw, js(), nullptr, config_.durable.c_str(), nullptr, &so, &jerr);
    if (s != NATS_OK) {
      const std::string what = "nats: pull subscribe to '" + config_.durable + "'";
      if (IsUnreachable(s)) return UnavailableError(ErrorText(what, s));
      return FailedPreconditionError(ErrorText(what, s));
    }
    sub_.reset(raw);
    // The client-side buffer: far more than a fetch ever asks for.
    (void)natsSubscription_SetPendingLimits(sub_.get(), 1 << 20, 1 << 30);
    return OkStatus();
  }

  // Acks, naks: one libnats call per message, then one flush so they have reached the server.
  template <typename F>
  Status Settle(std::span<const BrokerMessage* const> messages, const char* what, F op) {
    natsStatus first = NATS_OK;
    for (const BrokerMessage* m : messages) {
      auto it = pending_.find(m->handle);
      if (it == pending_.end()) continue;  // settled before (or never ours): nothing to send
      const natsStatus s = op(it->second.msg.get());
      if (s != NATS_OK) {
        if (first == NATS_OK) first = s;
        continue;
      }
      pending_.erase(it);
    }
    if (first != NATS_OK) return UnavailableError(ErrorText(std::string("nats: ") + what, first));
    return Flush(what);
  }

  Status Flush(const char* what) {
    // Not connected: what was sent waits in libnats' reconnect buffer and goes out once it
    // reconnects; a flush would only block for request_timeout.
    if (!Connected()) {
      return UnavailableError(std::string("nats: not connected to ") + shown_url_ + "; the " +
                              what + " goes out once it reconnects");
    }
    const natsStatus s =
        natsConnection_FlushTimeout(connection_.conn.get(), config_.request_timeout.count());
    if (s != NATS_OK) {
      return UnavailableError(ErrorText(std::string("nats: flush after ") + what, s));
    }
    return OkStatus();
  }

  // Messages that were polled and never settled (their consumer gave up on them) are redelivered
  // by the server after ack_wait; forget them after a long while so the map does not grow.
  void Sweep() {
    if (pending_.size() < 4096) return;
    const auto horizon = SteadyClock::now() - std::max<SteadyClock::duration>(
                                                  10 * config_.ack_wait, std::chrono::minutes(10));
    std::erase_if(pending_, [&](const auto& kv) { return kv.second.touched < horizon; });
  }

  NatsConsumerConfig config_;
  std::string shown_url_;  // config_.url without secrets, for messages
  Connection connection_;
  std::string filter_;  // the consumer's filter subject; empty: the whole stream
  SubscriptionPtr sub_;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::unordered_map<std::string, Held> held_;  // by subject
  std::optional<RestartHold> restart_hold_;     // set by Start when messages were pending
  std::deque<BrokerMessage> ready_;             // released by the restart hold, for Poll
  idem::internal::SpareMessages spare_;  // what the consumer is done with (Recycle), for Poll
  std::uint64_t next_handle_ = 1;
  SteadyClock::time_point last_ensure_{};
};

}  // namespace

Result<std::unique_ptr<Broker>> OpenNatsConsumer(const NatsConsumerConfig& config) {
  IDEM_RETURN_IF_ERROR(Validate(config));
  ConnectOptions co;
  co.url = config.url;
  co.name = config.connection_name;
  co.connect_timeout = config.connect_timeout;
  co.reconnect_wait = config.reconnect_wait;
  co.request_timeout = config.request_timeout;
  auto connection = Connect(co);
  if (!connection) return connection.error();
  auto broker = std::make_unique<NatsBroker>(config, std::move(*connection));
  IDEM_RETURN_IF_ERROR(broker->Start());
  return std::unique_ptr<Broker>(std::move(broker));
}

}  // namespace idem::nats
