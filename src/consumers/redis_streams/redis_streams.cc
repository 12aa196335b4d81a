// The Redis Streams broker (include/idem/consumers/redis_streams.h).
//
// Per stream the broker keeps `held`: entries it read from Redis but has not handed out yet,
// sorted by entry id, each with the time it may be handed out. Redeliver puts entries there
// with a delay; entries read beyond a Poll's `max` (XREADGROUP's COUNT is per stream) and
// read ahead (below) wait there too, due at once. Invariant: while a stream has held entries,
// nothing newer of that stream is read from Redis, so held entries always come out before any
// later entry of their stream.
//
// Read-ahead: when a Poll returns a full batch, it sends the XREADGROUP for the next batch
// before returning, without waiting for the reply, so that Redis reads the next batch while
// the consumer works on this one (Redis and the consumer run on different cores). The reply is
// read by the next call that talks to Redis and its entries go to `held`. The entries are
// pending on this consumer from then on, like any delivered entry: a crash leaves them to be
// read back from the pending list.
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

struct Held {
  EntryId id;
  SteadyClock::time_point due;
  bool redelivery = false;  // handed back: one more delivery when handed out again
  BrokerMessage message;
};

struct Stream {
  std::string name;
  // This consumer's own pending entries are read (XREADGROUP ... cursor) after every connect
  // until the list is read to its end; only then are new entries (">") read.
  std::string pending_cursor = "0";
  std::string claim_cursor = "0-0";
  std::deque<Held> held{};  // sorted by id

  bool recovering() const { return !pending_cursor.empty(); }
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

  std::string_view Name() const override { return "redis"; }

  // Connects and creates (or checks) the group on every stream.
  Status Connect(bool check_group);

  Result<std::vector<BrokerMessage>> Poll(std::size_t max, milliseconds wait) override;
  Status Acknowledge(std::span<const BrokerMessage* const> messages) override;
  Status Redeliver(std::span<const BrokerMessage* const> messages, milliseconds delay) override;
  Status DeadLetter(const BrokerMessage& message, const DeadLetterInfo& info) override;
  Status Touch(std::span<const BrokerMessage* const> messages) override;
  Status Health() override;

 private:
  // The connection, opened again after a failure.
  Status Ready();
  // Drops the connection; the next call reconnects and reads the pending lists again.
  Status Broken(Status status);
  // Reads the reply to a read-ahead, if one is outstanding, into `held`.
  Status CollectReadAhead();
  // The stream a message came from.
  Result<std::size_t> StreamOf(const BrokerMessage& m) const;
  std::size_t StreamNamed(std::string_view name) const;

  // Poll's steps; each adds to `out` at most `max` entries in all, the rest go to `held`.
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
  // XCLAIM ... JUSTID of the held entries, so that no other consumer takes them over.
  void AppendTouchHeld(std::size_t& replies);

  const RedisStreamsConfig config_;
  const Address address_;
  const std::string claim_idle_;
  std::vector<Stream> streams_;
  std::unique_ptr<Client> client_;
  bool read_ahead_ = false;  // an XREADGROUP was sent and its reply not read yet
  SteadyClock::time_point next_claim_{};

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
  read_ahead_ = false;
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
  read_ahead_ = false;
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
    if (out.size() < max && streams_[s].held.empty()) {
      out.push_back(std::move(e.message));
    } else {
      Hold(s, Held{.id = e.id, .due = {}, .redelivery = false, .message = std::move(e.message)});
    }
  }
}

Status RedisStreamsBroker::CollectReadAhead() {
  if (!read_ahead_) return OkStatus();
  read_ahead_ = false;
  auto r = client_->Read();
  if (!r) return r.error();
  const redisReply& reply = **r;
  if (reply.type == REDIS_REPLY_NIL) return OkStatus();
  if (reply.type != REDIS_REPLY_ARRAY) {
    return UnavailableError(client_->where() + ": XREADGROUP answered " + Describe(reply));
  }
  std::vector<ParsedEntry> entries;
  for (std::size_t i = 0; i < reply.elements; ++i) {
    const redisReply& pair = *reply.element[i];
    if (pair.type != REDIS_REPLY_ARRAY || pair.elements != 2) {
      return InternalError("XREADGROUP answered " + Describe(pair));
    }
    const std::size_t s = StreamNamed(Text(*pair.element[0]));
    if (s == streams_.size()) continue;
    entries.clear();
    IDEM_RETURN_IF_ERROR(
        ParseEntries(*pair.element[1], streams_[s].name, config_.payload_field, entries));
    for (ParsedEntry& e : entries) {
      e.message.handle = s;
      Hold(s, Held{.id = e.id, .due = {}, .redelivery = false, .message = std::move(e.message)});
    }
  }
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
    if (streams_[s].recovering() && skip[s] == 0 && streams_[s].held.empty()) {
      args.Add(streams_[s].name);
      asked.push_back(s);
    }
  }
  if (asked.empty()) return OkStatus();
  for (const std::size_t s : asked) args.Add(streams_[s].pending_cursor);
  auto r = client_->Call(args);
  if (!r) return r.error();
  const redisReply& reply = **r;
  if (reply.type != REDIS_REPLY_ARRAY && reply.type != REDIS_REPLY_NIL) {
    return UnavailableError(client_->where() + ": XREADGROUP (pending) answered " +
                            Describe(reply));
  }
  std::vector<std::vector<ParsedEntry>> per_stream(streams_.size());
  std::vector<char> answered(streams_.size(), 0);
  for (std::size_t i = 0; reply.type == REDIS_REPLY_ARRAY && i < reply.elements; ++i) {
    const redisReply& pair = *reply.element[i];
    if (pair.type != REDIS_REPLY_ARRAY || pair.elements != 2) {
      return InternalError("XREADGROUP answered " + Describe(pair));
    }
    const std::size_t s = StreamNamed(Text(*pair.element[0]));
    if (s == streams_.size()) continue;
    answered[s] = 1;
    IDEM_RETURN_IF_ERROR(
        ParseEntries(*pair.element[1], streams_[s].name, config_.payload_field, per_stream[s]));
  }
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
    if (s.held.empty()) continue;
    Args args;
    args.Add("XCLAIM").Add(s.name).Add(config_.group).Add(config_.consumer).Add("0");
    for (const Held& h : s.held) args.Add(h.message.position);
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
    std::erase_if(per_stream[s], [](const ParsedEntry& e) { return e.deleted; });
  }
  // Once every stream's pending list was swept to its end, wait claim_interval for the next.
  if (swept) next_claim_ = now + config_.claim_interval;
  IDEM_RETURN_IF_ERROR(CountDeliveries(per_stream));
  for (const std::size_t s : asked) Deliver(s, per_stream[s], max, out);
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
  auto r = client_->Read();
  if (!r) return r.error();
  IDEM_RETURN_IF_ERROR(client_->SetTimeout(config_.timeout));
  const redisReply& reply = **r;
  if (reply.type == REDIS_REPLY_NIL) return OkStatus();
  if (reply.type != REDIS_REPLY_ARRAY) {
    return UnavailableError(client_->where() + ": XREADGROUP answered " + Describe(reply));
  }
  std::vector<ParsedEntry> entries;
  for (std::size_t i = 0; i < reply.elements; ++i) {
    const redisReply& pair = *reply.element[i];
    if (pair.type != REDIS_REPLY_ARRAY || pair.elements != 2) {
      return InternalError("XREADGROUP answered " + Describe(pair));
    }
    const std::size_t s = StreamNamed(Text(*pair.element[0]));
    if (s == streams_.size()) continue;
    entries.clear();
    IDEM_RETURN_IF_ERROR(
        ParseEntries(*pair.element[1], streams_[s].name, config_.payload_field, entries));
    Deliver(s, entries, max, out);
  }
  return OkStatus();
}

Result<std::vector<BrokerMessage>> RedisStreamsBroker::Poll(std::size_t max, milliseconds wait) {
  max = std::max<std::size_t>(max, 1);
  if (Status s = Ready(); !s.ok()) return Broken(s);
  if (Status s = CollectReadAhead(); !s.ok()) return Broken(s);
  std::vector<BrokerMessage> out;
  out.reserve(max);
  // A stream that had held entries delivers no entry read back or claimed in this Poll: those
  // may be older than the held ones just handed out.
  std::vector<char> had_held(streams_.size());
  for (std::size_t s = 0; s < streams_.size(); ++s) had_held[s] = !streams_[s].held.empty();

  SteadyClock::time_point now = SteadyClock::now();
  TakeDue(now, max, out);
  if (out.size() < max) {
    if (Status s = ReadPending(max, had_held, out); !s.ok()) return Broken(s);
  }
  if (out.size() < max && now >= next_claim_) {
    if (Status s = Claim(now, max, had_held, out); !s.ok()) return Broken(s);
  }
  if (out.size() < max) {
    // Block only when there is nothing to return, and not past the first held entry's time.
    milliseconds block = out.empty() ? wait : milliseconds(0);
    bool readable = false;
    for (const Stream& s : streams_) {
      if (!s.held.empty()) {
        const auto until = std::chrono::ceil<milliseconds>(s.held.front().due - now);
        block = std::max(milliseconds(0), std::min(block, until));
      } else if (!s.recovering()) {
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
  if (out.size() == max && AppendReadNew(max, milliseconds(0))) {
    if (Status s = client_->Flush(); !s.ok()) return Broken(s);
    read_ahead_ = true;
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
    if (acks[*s].size() == 0) acks[*s].Add("XACK").Add(streams_[*s].name).Add(config_.group);
    acks[*s].Add(m->position);
  }
  std::size_t sent = 0;
  for (const Args& a : acks) {
    if (a.size() == 0) continue;
    client_->Append(a);
    ++sent;
  }
  if (Status s = CollectReadAhead(); !s.ok()) return Broken(s);
  for (; sent > 0; --sent) {
    auto r = client_->Read();
    if (!r) return Broken(r.error());
    if ((*r)->type != REDIS_REPLY_INTEGER) {
      return Broken(UnavailableError(client_->where() + ": XACK answered " + Describe(**r)));
    }
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
  client_->Append(args);
  if (Status s = CollectReadAhead(); !s.ok()) return Broken(s);
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
  if (Status s = CollectReadAhead(); !s.ok()) return Broken(s);
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
