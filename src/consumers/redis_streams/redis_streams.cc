// The Redis Streams broker (include/idem/consumers/redis_streams.h).
//
// Per stream the broker keeps entries it read from Redis but has not handed out yet:
//  - `held`, sorted by entry id, each with the time it may be handed out: entries handed back
//    by Redeliver (with their delay), entries claimed while newer ones wait in `ready`, and
//    entries read back or claimed beyond a Poll's `max` (due now);
//  - then `ready`: new entries (XREADGROUP ... >) read ahead or beyond a Poll's `max`
//    (XREADGROUP's COUNT is per stream), and claimed entries newer than the first of them, in
//    stream order; all newer than the held ones.
// Invariant: while a stream has entries waiting in either, nothing newer of that stream is read
// from Redis, and `ready` waits for `held` to empty; so entries come out in stream order, and
// handed-back ones before any later entry of their stream.
//
// Pipelining, so that Redis works while the consumer does (they run on different cores):
//  - Read-ahead: when a Poll returns a full batch, it makes sure that kReadAheadDepth
//    XREADGROUPs for the next batches are on their way before it returns, without waiting for
//    their replies. The next Poll reads replies until it has a batch; their entries go to
//    `ready`. They are pending on this consumer from then on, like any delivered entry: a crash
//    leaves them to be read back from the pending list. More than one in flight keeps Redis
//    busy even when the consumer comes back for its next batch a little late.
//  - Acknowledge sends its XACKs and returns; their replies are read by a later call, and a
//    failed XACK fails that call (kUnavailable) and reconnects, after which the entries are
//    read back from the pending list and delivered again (the store answers Replay).
// `expected_` lists the replies still to be read, in order.
#include "idem/consumers/redis_streams.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "consumers/redis_streams/client.h"
#include "consumers/redis_streams/entries.h"

namespace idem::redis_streams {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::string_view kCaughtUp = "";  // the pending cursor once the list is read
constexpr std::size_t kMaxUnread = 64;      // replies left unread before Acknowledge reads them
constexpr std::size_t kReadAheadDepth = 2;  // XREADGROUPs in flight while the consumer works
constexpr std::size_t kAll = static_cast<std::size_t>(-1);

struct Held {
  EntryId id;
  SteadyClock::time_point due;
  bool redelivery = false;  // handed back: one more delivery when handed out again
  BrokerMessage message;
};

// Orders `ready` entries (by their position) against entry ids.
struct ReadyBefore {
  static EntryId IdOf(const BrokerMessage& m) {
    return ParseEntryId(m.position).value_or(EntryId{});
  }
  bool operator()(const BrokerMessage& m, const EntryId& id) const { return IdOf(m) < id; }
  bool operator()(const EntryId& id, const BrokerMessage& m) const { return id < IdOf(m); }
};

struct Stream {
  std::string name;
  // This consumer's own pending entries are read (XREADGROUP ... cursor) after every connect
  // until the list is read to its end; only then are new entries (">") read.
  std::string pending_cursor = "0";
  std::string claim_cursor = "0-0";
  std::deque<Held> held{};             // sorted by id
  std::vector<BrokerMessage> ready{};  // in stream order, after `held`
  std::size_t ready_taken = 0;         // ready[0, ready_taken) were handed out already

  bool recovering() const { return !pending_cursor.empty(); }
  bool waiting() const { return !held.empty() || ready_taken < ready.size(); }
};

Status ValidateConfig(const RedisStreamsConfig& c) {
  auto bad = [](std::string_view option, std::string_view what) {
    return InvalidArgumentError("redis streams consumer: " + std::string(option) + " " +
                                std::string(what));
  };
  if (c.url.empty()) return bad("url", "is empty (redis://HOST:PORT)");
  if (auto a = ParseAddress(c.url); !a) return a.error();
  if (c.streams.empty()) return bad("streams", "is empty: name at least one stream");
  for (std::size_t i = 0; i < c.streams.size(); ++i) {
    if (c.streams[i].empty()) return bad("streams", "has an empty name");
    if (std::find(c.streams.begin(), c.streams.begin() + static_cast<std::ptrdiff_t>(i),
                  c.streams[i]) != c.streams.begin() + static_cast<std::ptrdiff_t>(i)) {
      return bad("streams", "names \"" + c.streams[i] + "\" twice");
    }
    if (c.streams[i] == c.dlq_stream) {
      return bad("dlq_stream", "\"" + c.dlq_stream + "\" is also one of the streams read");
    }
  }
  if (c.group.empty()) return bad("group", "is empty");
  if (c.consumer.empty()) return bad("consumer", "is empty (a stable name for this process)");
  if (c.dlq_stream.empty()) return bad("dlq_stream", "is empty");
  if (c.payload_field.empty()) return bad("payload_field", "is empty");
  if (c.claim_idle.count() <= 0) return bad("claim_idle", "must be above 0 ms");
  if (c.claim_interval.count() <= 0) return bad("claim_interval", "must be above 0 ms");
  if (c.timeout.count() <= 0) return bad("timeout", "must be above 0 ms");
  return OkStatus();
}

class RedisStreamsBroker final : public Broker {
 public:
  RedisStreamsBroker(RedisStreamsConfig config, Address address)
      : config_(std::move(config)),
        address_(std::move(address)),
        claim_idle_(std::to_string(config_.claim_idle.count())) {
    for (const std::string& name : config_.streams) streams_.push_back(Stream{.name = name});
  }

  // Reads the replies of the last XACKs (best effort), so that they are not cut off.
  ~RedisStreamsBroker() override {
    if (client_ != nullptr && !client_->broken()) (void)Collect(kAll);
  }

  std::string_view Name() const override { return "redis"; }

  // Connects and creates (or checks) the group on every stream.
  Status Connect(bool check_group);

  Result<std::vector<BrokerMessage>> Poll(std::size_t max, milliseconds wait) override;
  Status Acknowledge(std::span<const BrokerMessage* const> messages) override;
  Status Redeliver(std::span<const BrokerMessage* const> messages, milliseconds delay) override;
  Status DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) override;
  Status Touch(std::span<const BrokerMessage* const> messages) override;
  void Recycle(std::vector<BrokerMessage> batch) override { spare_.Keep(std::move(batch)); }
  Status Health() override;

 private:
  // The connection, opened again after a failure.
  Status Ready();
  // Drops the connection; the next call reconnects and reads the pending lists again.
  Status Broken(Status status);
  // Reads outstanding replies in order: all of them (kAll), or only until `ready` holds `want`
  // entries or no read-ahead is left, leaving the replies behind unread.
  Status Collect(std::size_t want);
  std::size_t ReadyCount() const;
  // The stream a message came from.
  Result<std::size_t> StreamOf(const BrokerMessage& m) const;
  std::size_t StreamNamed(std::string_view name) const;
  // An XREADGROUP reply's entries with their ids, per stream.
  Status ParseRead(const redisReply& reply,
                   std::vector<std::vector<ParsedEntry>>& per_stream) const;
  // Reads the reply to an XREADGROUP ... >: its entries go to `ready`.
  Status ReadNewEntries();

  // Poll's steps; each adds to `out` at most `max` entries in all, the rest wait.
  void TakeDue(SteadyClock::time_point now, std::size_t max, std::vector<BrokerMessage>& out);
  Status ReadPending(std::size_t max, const std::vector<char>& skip,
                     std::vector<BrokerMessage>& out);
  Status Claim(SteadyClock::time_point now, std::size_t max, const std::vector<char>& skip,
               std::vector<BrokerMessage>& out);
  Status ReadNew(std::size_t max, milliseconds block, std::vector<BrokerMessage>& out);
  // XREADGROUP ... > for the streams that may read new entries; false when none may.
  bool AppendReadNew(std::size_t count, milliseconds block);
  // Sets deliveries from XPENDING for entries read back or claimed, per stream.
  Status CountDeliveries(std::vector<std::vector<ParsedEntry>>& per_stream);
  // Hands out `entries` of stream `s` in order while `out` has room; the rest wait in `held`.
  void Deliver(std::size_t s, std::vector<ParsedEntry>& entries, std::size_t max,
               std::vector<BrokerMessage>& out);
  void Hold(std::size_t s, Held held);
  // XCLAIM ... JUSTID of the waiting entries, so that no other consumer takes them over.
  void AppendTouchHeld(std::size_t& replies);

  const RedisStreamsConfig config_;
  const Address address_;
  const std::string claim_idle_;
  std::vector<Stream> streams_;
  std::unique_ptr<Client> client_;
  enum class Expect : std::uint8_t { kReadAhead, kAck };
  std::deque<Expect> expected_;  // replies sent for and not read yet, in order
  std::size_t read_aheads_ = 0;  // of them, kReadAhead
  SteadyClock::time_point next_claim_{};
  // Messages the consumer is done with (Recycle): new entries are read into them.
  idem::internal::SpareMessages spare_;

  std::mutex health_mu_;
  std::unique_ptr<Client> health_client_;  // guarded by health_mu_
};

Status RedisStreamsBroker::Connect(bool check_group) {
  auto client = Client::Open(address_, config_.timeout);
  if (!client) return client.error();
  Client& c = **client;
  for (const Stream& s : streams_) {
    if (config_.create_group) {
      c.Append(Args()
                   .Add("XGROUP")
                   .Add("CREATE")
                   .Add(s.name)
                   .Add(config_.group)
                   .Add("0")
                   .Add("MKSTREAM"));
    } else if (check_group) {
      c.Append(Args().Add("XINFO").Add("GROUPS").Add(s.name));
    }
  }
  if (config_.create_group || check_group) {
    for (const Stream& s : streams_) {
      auto r = c.Read();
      if (!r) return r.error();
      const redisReply& reply = **r;
      if (config_.create_group) {
        if (IsError(reply) && !Text(reply).starts_with("BUSYGROUP")) {
          return UnavailableError(c.where() + ": XGROUP CREATE " + s.name + " " + config_.group +
                                  " answered " + Describe(reply));
        }
        continue;
      }
      bool found = false;
      if (reply.type == REDIS_REPLY_ARRAY) {
        for (std::size_t g = 0; g < reply.elements && !found; ++g) {
          const redisReply& info = *reply.element[g];
          for (std::size_t f = 0; f + 1 < info.elements; f += 2) {
            if (Text(*info.element[f]) == "name" && Text(*info.element[f + 1]) == config_.group) {
              found = true;
            }
          }
        }
      }
      if (!found) {
        return FailedPreconditionError("redis streams consumer: stream " + s.name +
                                       " has no consumer group " + config_.group +
                                       " and create_group is false");
      }
    }
  }
  client_ = std::move(*client);
  expected_.clear();
  read_aheads_ = 0;
  for (Stream& s : streams_) {
    s.pending_cursor = "0";
    s.claim_cursor = "0-0";
  }
  next_claim_ = SteadyClock::now();
  return OkStatus();
}

Status RedisStreamsBroker::Ready() {
  if (client_ != nullptr && !client_->broken()) return OkStatus();
  client_.reset();
  return Connect(/*check_group=*/false);
}

Status RedisStreamsBroker::Broken(Status status) {
  client_.reset();
  expected_.clear();
  read_aheads_ = 0;
  return status;
}

std::size_t RedisStreamsBroker::StreamNamed(std::string_view name) const {
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].name == name) return i;
  }
  return streams_.size();
}

Result<std::size_t> RedisStreamsBroker::StreamOf(const BrokerMessage& m) const {
  if (m.handle < streams_.size() && streams_[m.handle].name == m.partition) return m.handle;
  const std::size_t s = StreamNamed(m.partition);
  if (s == streams_.size()) {
    return InvalidArgumentError("redis streams consumer: message of \"" + m.partition +
                                "\", which this consumer does not read");
  }
  return s;
}

void RedisStreamsBroker::Hold(std::size_t s, Held held) {
  std::deque<Held>& q = streams_[s].held;
  auto at = std::lower_bound(q.begin(), q.end(), held.id,
                             [](const Held& h, const EntryId& id) { return h.id < id; });
  if (at != q.end() && at->id == held.id) {
    *at = std::move(held);
  } else {
    q.insert(at, std::move(held));
  }
}

void RedisStreamsBroker::Deliver(std::size_t s, std::vector<ParsedEntry>& entries, std::size_t max,
                                 std::vector<BrokerMessage>& out) {
  for (ParsedEntry& e : entries) {
    e.message.handle = s;
    if (out.size() < max && !streams_[s].waiting()) {
      out.push_back(std::move(e.message));
    } else {
      Hold(s, Held{.id = e.id, .due = {}, .redelivery = false, .message = std::move(e.message)});
    }
  }
}

std::size_t RedisStreamsBroker::ReadyCount() const {
  std::size_t n = 0;
  for (const Stream& s : streams_) n += s.ready.size() - s.ready_taken;
  return n;
}

Status RedisStreamsBroker::Collect(std::size_t want) {
  while (!expected_.empty() && (want == kAll || (read_aheads_ > 0 && ReadyCount() < want))) {
    const Expect expect = expected_.front();
    expected_.pop_front();
    if (expect == Expect::kReadAhead) {
      --read_aheads_;
      IDEM_RETURN_IF_ERROR(ReadNewEntries());
      continue;
    }
    auto r = client_->Read();
    if (!r) return r.error();
    if ((*r)->type != REDIS_REPLY_INTEGER) {
      return UnavailableError(client_->where() + ": XACK answered " + Describe(**r));
    }
  }
  return OkStatus();
}

Status RedisStreamsBroker::ParseRead(const redisReply& reply,
                                     std::vector<std::vector<ParsedEntry>>& per_stream) const {
  per_stream.resize(streams_.size());
  if (reply.type == REDIS_REPLY_NIL) return OkStatus();  // nothing new
  if (reply.type != REDIS_REPLY_ARRAY) {
    return UnavailableError(client_->where() + ": XREADGROUP answered " + Describe(reply));
  }
  for (std::size_t i = 0; i < reply.elements; ++i) {
    const redisReply& pair = *reply.element[i];
    if (pair.type != REDIS_REPLY_ARRAY || pair.elements != 2) {
      return InternalError("XREADGROUP answered " + Describe(pair));
    }
    const std::size_t s = StreamNamed(Text(*pair.element[0]));
    if (s == streams_.size()) continue;
    IDEM_RETURN_IF_ERROR(
        ParseEntries(*pair.element[1], streams_[s].name, config_.payload_field, per_stream[s]));
  }
  return OkStatus();
}

Status RedisStreamsBroker::ReadNewEntries() {
  std::vector<std::vector<BrokerMessage>*> targets(streams_.size());
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    Stream& st = streams_[i];
    if (st.ready_taken == st.ready.size()) {
      st.ready.clear();
      st.ready_taken = 0;
    }
    targets[i] = &st.ready;
  }
  NewEntriesParser parser(config_.streams, targets, config_.payload_field, spare_);
  const Status read = client_->ReadWith(NewEntriesParser::Functions(), &parser);
  // Also after a read that failed mid-reply: the entry it was reading goes, not half filled in
  // (a recycled message would still hold another entry's headers). The whole ones before it
  // stay in `ready`; they are pending in Redis either way.
  const Status& parsed = parser.Finish();
  if (!read.ok()) return read;
  if (!parsed.ok()) return Status(parsed.code(), client_->where() + ": " + parsed.message());
  return OkStatus();
}

void RedisStreamsBroker::TakeDue(SteadyClock::time_point now, std::size_t max,
                                 std::vector<BrokerMessage>& out) {
  for (Stream& s : streams_) {
    while (out.size() < max && !s.held.empty() && s.held.front().due <= now) {
      Held& h = s.held.front();
      if (h.redelivery) ++h.message.deliveries;
      out.push_back(std::move(h.message));
      s.held.pop_front();
    }
    if (!s.held.empty() || s.ready_taken == s.ready.size()) continue;
    if (out.empty() && s.ready_taken == 0 && s.ready.size() <= max) {
      out.swap(s.ready);  // the common case: one read-ahead batch is the whole Poll
    } else {
      const std::size_t n = std::min(max - out.size(), s.ready.size() - s.ready_taken);
      for (std::size_t i = 0; i < n; ++i) out.push_back(std::move(s.ready[s.ready_taken++]));
    }
    if (s.ready_taken == s.ready.size()) {
      s.ready.clear();
      s.ready_taken = 0;
    } else if (s.ready_taken * 2 >= s.ready.size()) {  // drop the husks of taken entries
      s.ready.erase(s.ready.begin(), s.ready.begin() + static_cast<std::ptrdiff_t>(s.ready_taken));
      s.ready_taken = 0;
    }
  }
}

Status RedisStreamsBroker::CountDeliveries(std::vector<std::vector<ParsedEntry>>& per_stream) {
  std::vector<std::size_t> asked;
  for (std::size_t s = 0; s < per_stream.size(); ++s) {
    if (per_stream[s].empty()) continue;
    const std::string first = per_stream[s].front().id.ToString();
    const std::string last = per_stream[s].back().id.ToString();
    const std::string count = std::to_string(per_stream[s].size() + 64);
    client_->Append(Args()
                        .Add("XPENDING")
                        .Add(streams_[s].name)
                        .Add(config_.group)
                        .Add(first)
                        .Add(last)
                        .Add(count)
                        .Add(config_.consumer));
    asked.push_back(s);
  }
  for (const std::size_t s : asked) {
    auto r = client_->Read();
    if (!r) return r.error();
    const redisReply& reply = **r;
    if (reply.type != REDIS_REPLY_ARRAY) {
      return UnavailableError(client_->where() + ": XPENDING answered " + Describe(reply));
    }
    std::unordered_map<std::string_view, std::uint32_t> counts;
    for (std::size_t i = 0; i < reply.elements; ++i) {
      const redisReply& p = *reply.element[i];
      if (p.type == REDIS_REPLY_ARRAY && p.elements == 4 &&
          p.element[3]->type == REDIS_REPLY_INTEGER) {
        counts[Text(*p.element[0])] =
            static_cast<std::uint32_t>(std::max<long long>(1, p.element[3]->integer));
      }
    }
    for (ParsedEntry& e : per_stream[s]) {
      if (auto it = counts.find(e.message.position); it != counts.end()) {
        e.message.deliveries = it->second;
      }
    }
  }
  return OkStatus();
}

Status RedisStreamsBroker::ReadPending(std::size_t max, const std::vector<char>& skip,
                                       std::vector<BrokerMessage>& out) {
  Args args;
  const std::string count = std::to_string(max - out.size());
  args.Add("XREADGROUP")
      .Add("GROUP")
      .Add(config_.group)
      .Add(config_.consumer)
      .Add("COUNT")
      .Add(count);
  args.Add("STREAMS");
  std::vector<std::size_t> asked;
  for (std::size_t s = 0; s < streams_.size(); ++s) {
    if (streams_[s].recovering() && skip[s] == 0 && !streams_[s].waiting()) {
      args.Add(streams_[s].name);
      asked.push_back(s);
    }
  }
  if (asked.empty()) return OkStatus();
  for (const std::size_t s : asked) args.Add(streams_[s].pending_cursor);
  auto r = client_->Call(args);
  if (!r) return r.error();
  std::vector<std::vector<ParsedEntry>> per_stream;
  IDEM_RETURN_IF_ERROR(ParseRead(**r, per_stream));
  // Entries deleted from the stream while pending have nothing to deliver: acknowledge them.
  std::size_t acks = 0;
  for (const std::size_t s : asked) {
    std::vector<ParsedEntry>& entries = per_stream[s];
    if (entries.empty()) {
      streams_[s].pending_cursor = kCaughtUp;
      continue;
    }
    streams_[s].pending_cursor = entries.back().id.ToString();
    Args ack;
    ack.Add("XACK").Add(streams_[s].name).Add(config_.group);
    for (const ParsedEntry& e : entries) {
      if (e.deleted) ack.Add(e.message.position);
    }
    if (ack.size() > 3) {
      client_->Append(ack);
      ++acks;
    }
    std::erase_if(entries, [](const ParsedEntry& e) { return e.deleted; });
  }
  for (; acks > 0; --acks) {
    auto a = client_->Read();
    if (!a) return a.error();
  }
  IDEM_RETURN_IF_ERROR(CountDeliveries(per_stream));
  for (const std::size_t s : asked) Deliver(s, per_stream[s], max, out);
  return OkStatus();
}

void RedisStreamsBroker::AppendTouchHeld(std::size_t& replies) {
  for (const Stream& s : streams_) {
    if (!s.waiting()) continue;
    Args args;
    args.Add("XCLAIM").Add(s.name).Add(config_.group).Add(config_.consumer).Add("0");
    for (const Held& h : s.held) args.Add(h.message.position);
    for (std::size_t i = s.ready_taken; i < s.ready.size(); ++i) args.Add(s.ready[i].position);
    args.Add("JUSTID");
    client_->Append(args);
    ++replies;
  }
}

Status RedisStreamsBroker::Claim(SteadyClock::time_point now, std::size_t max,
                                 const std::vector<char>& skip, std::vector<BrokerMessage>& out) {
  std::size_t touches = 0;
  AppendTouchHeld(touches);
  const std::string count = std::to_string(max - out.size());
  std::vector<std::size_t> asked;
  for (std::size_t s = 0; s < streams_.size(); ++s) {
    const Stream& st = streams_[s];
    if (st.recovering() || skip[s] != 0 || !st.held.empty()) continue;
    client_->Append(Args()
                        .Add("XAUTOCLAIM")
                        .Add(st.name)
                        .Add(config_.group)
                        .Add(config_.consumer)
                        .Add(claim_idle_)
                        .Add(st.claim_cursor)
                        .Add("COUNT")
                        .Add(count));
    asked.push_back(s);
  }
  for (; touches > 0; --touches) {
    auto r = client_->Read();
    if (!r) return r.error();
  }
  std::vector<std::vector<ParsedEntry>> per_stream(streams_.size());
  bool swept = true;
  for (const std::size_t s : asked) {
    auto r = client_->Read();
    if (!r) return r.error();
    const redisReply& reply = **r;
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements < 2 ||
        reply.element[0]->type != REDIS_REPLY_STRING) {
      return UnavailableError(client_->where() + ": XAUTOCLAIM " + streams_[s].name + " answered " +
                              Describe(reply));
    }
    streams_[s].claim_cursor = Text(*reply.element[0]);
    if (streams_[s].claim_cursor != "0-0") swept = false;
    IDEM_RETURN_IF_ERROR(
        ParseEntries(*reply.element[1], streams_[s].name, config_.payload_field, per_stream[s]));
    // Entries read ahead are pending on this consumer too: if they idled that long (they were
    // touched just before, so only with a tiny claim_idle), they are still here, in `ready`,
    // and must not come twice. Any other entry is delivered: another consumer's, taken over
    // (XAUTOCLAIM moved it here and reset its idle time), or one this consumer handed out that
    // was not settled within claim_idle.
    const Stream& st = streams_[s];
    std::erase_if(per_stream[s], [&](const ParsedEntry& e) {
      return e.deleted ||
             std::binary_search(st.ready.begin() + static_cast<std::ptrdiff_t>(st.ready_taken),
                                st.ready.end(), e.id, ReadyBefore{});
    });
  }
  // Once every stream's pending list was swept to its end, wait claim_interval for the next.
  if (swept) next_claim_ = now + config_.claim_interval;
  IDEM_RETURN_IF_ERROR(CountDeliveries(per_stream));
  for (const std::size_t s : asked) {
    // Claimed entries newer than the first read-ahead one join `ready` in stream order: held,
    // they would come before older entries (and `ready` waits for `held`).
    Stream& st = streams_[s];
    std::vector<ParsedEntry>& claimed = per_stream[s];
    if (st.ready_taken < st.ready.size()) {
      const EntryId first_ready = ReadyBefore::IdOf(st.ready[st.ready_taken]);
      const auto newer = std::find_if(claimed.begin(), claimed.end(),
                                      [&](const ParsedEntry& e) { return first_ready < e.id; });
      for (auto e = newer; e != claimed.end(); ++e) {
        e->message.handle = s;
        const auto at =
            std::upper_bound(st.ready.begin() + static_cast<std::ptrdiff_t>(st.ready_taken),
                             st.ready.end(), e->id, ReadyBefore{});
        st.ready.insert(at, std::move(e->message));
      }
      claimed.erase(newer, claimed.end());
    }
    Deliver(s, claimed, max, out);
  }
  return OkStatus();
}

bool RedisStreamsBroker::AppendReadNew(std::size_t count, milliseconds block) {
  Args args;
  const std::string count_text = std::to_string(count);
  const std::string block_text = std::to_string(block.count());
  args.Add("XREADGROUP")
      .Add("GROUP")
      .Add(config_.group)
      .Add(config_.consumer)
      .Add("COUNT")
      .Add(count_text);
  if (block.count() > 0) args.Add("BLOCK").Add(block_text);
  args.Add("STREAMS");
  std::size_t n = 0;
  // A stream whose newer entries wait in `ready` may read more behind them; one with held
  // entries (handed back) reads nothing new until they are out.
  for (const Stream& s : streams_) {
    if (!s.recovering() && s.held.empty()) {
      args.Add(s.name);
      ++n;
    }
  }
  if (n == 0) return false;
  for (std::size_t i = 0; i < n; ++i) args.Add(">");
  client_->Append(args);
  return true;
}

Status RedisStreamsBroker::ReadNew(std::size_t max, milliseconds block,
                                   std::vector<BrokerMessage>& out) {
  if (!AppendReadNew(max - out.size(), block)) return OkStatus();
  IDEM_RETURN_IF_ERROR(client_->SetTimeout(config_.timeout + block));
  IDEM_RETURN_IF_ERROR(ReadNewEntries());
  IDEM_RETURN_IF_ERROR(client_->SetTimeout(config_.timeout));
  TakeDue(SteadyClock::now(), max, out);
  return OkStatus();
}

Result<std::vector<BrokerMessage>> RedisStreamsBroker::Poll(std::size_t max, milliseconds wait) {
  max = std::max<std::size_t>(max, 1);
  if (Status s = Ready(); !s.ok()) return Broken(s);
  if (Status s = Collect(max); !s.ok()) return Broken(s);
  // Not reserved: most Polls take a read-ahead's vector whole, and a large allocation for each
  // would make malloc consolidate its free lists every time (5% of a consumer's time).
  std::vector<BrokerMessage> out;
  // A stream that had entries waiting delivers no entry read back from its pending list in
  // this Poll: those may be older than the waiting ones handed out now.
  std::vector<char> had_waiting(streams_.size());
  // Claims wait only for handed-back entries. They come before read-ahead entries (they wait
  // behind them in `held`), so that a consumer that always has a full batch read ahead still
  // takes over a dead consumer's entries.
  std::vector<char> had_held(streams_.size());
  for (std::size_t s = 0; s < streams_.size(); ++s) {
    had_waiting[s] = streams_[s].waiting();
    had_held[s] = !streams_[s].held.empty();
  }

  const SteadyClock::time_point now = SteadyClock::now();
  if (now >= next_claim_) {
    // The steps that wait for their own replies read the XACK replies before them first.
    if (Status s = Collect(kAll); !s.ok()) return Broken(s);
    if (Status s = Claim(now, max, had_held, out); !s.ok()) return Broken(s);
  }
  TakeDue(now, max, out);
  if (out.size() < max) {
    if (Status s = Collect(kAll); !s.ok()) return Broken(s);
    TakeDue(now, max, out);
  }
  if (out.size() < max) {
    if (Status s = ReadPending(max, had_waiting, out); !s.ok()) return Broken(s);
  }
  if (out.size() < max) {
    // Block only when there is nothing to return, and not past the first held entry's time.
    milliseconds block = out.empty() ? wait : milliseconds(0);
    bool readable = false;
    for (const Stream& s : streams_) {
      if (!s.held.empty()) {
        const auto until = std::chrono::ceil<milliseconds>(s.held.front().due - now);
        block = std::max(milliseconds(0), std::min(block, until));
      } else if (!s.recovering() && !s.waiting()) {
        readable = true;
      }
    }
    if (readable) {
      if (Status s = ReadNew(max, block, out); !s.ok()) return Broken(s);
    } else if (out.empty() && block.count() > 0) {
      std::this_thread::sleep_for(block);
    }
    if (out.empty()) TakeDue(SteadyClock::now(), max, out);
  }
  if (out.size() == max) {
    bool sent = false;
    while (read_aheads_ < kReadAheadDepth && AppendReadNew(max, milliseconds(0))) {
      expected_.push_back(Expect::kReadAhead);
      ++read_aheads_;
      sent = true;
    }
    if (sent) {
      if (Status s = client_->Flush(); !s.ok()) return Broken(s);
    }
  }
  return out;
}

Status RedisStreamsBroker::Acknowledge(std::span<const BrokerMessage* const> messages) {
  if (messages.empty()) return OkStatus();
  if (Status s = Ready(); !s.ok()) return Broken(s);
  std::vector<Args> acks(streams_.size());
  for (const BrokerMessage* m : messages) {
    auto s = StreamOf(*m);
    if (!s) return s.error();
    if (acks[*s].size() == 0) {
      acks[*s].Reserve(messages.size() + 3).Add("XACK").Add(streams_[*s].name).Add(config_.group);
    }
    acks[*s].Add(m->position);
  }
  for (const Args& a : acks) {
    if (a.size() == 0) continue;
    client_->Append(a);
    expected_.push_back(Expect::kAck);
  }
  if (Status s = client_->Flush(); !s.ok()) return Broken(s);
  // A caller that only acknowledges (no Poll in between) still reads its replies now and then.
  if (expected_.size() > kMaxUnread) {
    if (Status s = Collect(kAll); !s.ok()) return Broken(s);
  }
  return OkStatus();
}

Status RedisStreamsBroker::Redeliver(std::span<const BrokerMessage* const> messages,
                                     milliseconds delay) {
  const SteadyClock::time_point due = SteadyClock::now() + delay;
  for (const BrokerMessage* m : messages) {
    auto s = StreamOf(*m);
    if (!s) return s.error();
    const auto id = ParseEntryId(m->position);
    if (!id) {
      return InvalidArgumentError("redis streams consumer: \"" + m->position +
                                  "\" is not an entry id");
    }
    BrokerMessage copy = *m;
    copy.handle = *s;
    Hold(*s, Held{.id = *id, .due = due, .redelivery = true, .message = std::move(copy)});
  }
  return OkStatus();
}

Status RedisStreamsBroker::DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) {
  if (Status s = Ready(); !s.ok()) return Broken(s);
  const auto headers = DeadLetterHeaders(message, info);
  Args args;
  args.Add("XADD").Add(config_.dlq_stream).Add("*").Add(config_.payload_field).Add(message.payload);
  for (const auto& [name, value] : headers) args.Add(name).Add(value);
  if (Status s = Collect(kAll); !s.ok()) return Broken(s);
  client_->Append(args);
  auto r = client_->Read();
  if (!r) return Broken(r.error());
  if ((*r)->type != REDIS_REPLY_STRING) {
    return Broken(UnavailableError(client_->where() + ": XADD " + config_.dlq_stream +
                                   " answered " + Describe(**r)));
  }
  return OkStatus();
}

Status RedisStreamsBroker::Touch(std::span<const BrokerMessage* const> messages) {
  if (messages.empty()) return OkStatus();
  if (Status s = Ready(); !s.ok()) return Broken(s);
  // First: reading a read-ahead's reply changes the waiting entries touched below.
  if (Status s = Collect(kAll); !s.ok()) return Broken(s);
  std::vector<Args> claims(streams_.size());
  for (const BrokerMessage* m : messages) {
    auto s = StreamOf(*m);
    if (!s) return s.error();
    if (claims[*s].size() == 0) {
      claims[*s]
          .Add("XCLAIM")
          .Add(streams_[*s].name)
          .Add(config_.group)
          .Add(config_.consumer)
          .Add("0");
    }
    claims[*s].Add(m->position);
  }
  std::size_t sent = 0;
  for (Args& a : claims) {
    if (a.size() == 0) continue;
    a.Add("JUSTID");
    client_->Append(a);
    ++sent;
  }
  // The entries waiting behind them are idle as long: keep them too.
  AppendTouchHeld(sent);
  for (; sent > 0; --sent) {
    auto r = client_->Read();
    if (!r) return Broken(r.error());
    if ((*r)->type != REDIS_REPLY_ARRAY) {
      return Broken(UnavailableError(client_->where() + ": XCLAIM answered " + Describe(**r)));
    }
  }
  return OkStatus();
}

Status RedisStreamsBroker::Health() {
  std::lock_guard lock(health_mu_);
  if (health_client_ == nullptr || health_client_->broken()) {
    health_client_.reset();
    auto c = Client::Open(address_, config_.timeout);
    if (!c) return c.error();
    health_client_ = std::move(*c);
  }
  auto r = health_client_->Call(Args().Add("PING"));
  if (!r) return r.error();
  if ((*r)->type != REDIS_REPLY_STATUS || Text(**r) != "PONG") {
    health_client_.reset();
    return UnavailableError(address_.text + ": PING answered " + Describe(**r));
  }
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<Broker>> OpenRedisStreamsConsumer(const RedisStreamsConfig& config) {
  IDEM_RETURN_IF_ERROR(ValidateConfig(config));
  auto address = ParseAddress(config.url);
  if (!address) return address.error();
  auto broker = std::make_unique<RedisStreamsBroker>(config, std::move(*address));
  IDEM_RETURN_IF_ERROR(broker->Connect(/*check_group=*/!config.create_group));
  return std::unique_ptr<Broker>(std::move(broker));
}

}  // namespace idem::redis_streams
