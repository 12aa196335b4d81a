// The Redis store: validates, names the key, runs the operation's script (scripts.h) on the
// node that owns the key, and reads the answer. Every decision happens inside Redis.
#include "idem/stores/redis.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <set>
#include <span>
#include <string_view>
#include <utility>

#include "core/machine.h"
#include "core/url_text.h"
#include "stores/redis/codec.h"
#include "stores/redis/connection.h"
#include "stores/redis/router.h"
#include "stores/redis/scripts.h"

namespace idem {
namespace {

using redis::Command;
using redis::Describe;
using redis::GetScript;
using redis::Reply;
using redis::Request;
using redis::ScriptId;

// Lua numbers are doubles: sequence numbers and versions above this could not be compared
// exactly inside Redis.
constexpr std::uint64_t kMaxExact = (std::uint64_t{1} << 53) - 1;
constexpr std::size_t kScanCount = 1000;

std::int64_t Ms(Timestamp t) { return t.time_since_epoch().count(); }
Timestamp At(long long ms) { return Timestamp(std::chrono::milliseconds(ms)); }

std::string_view FingerprintArg(const std::optional<Fingerprint>& fp) {
  if (!fp) return {};
  return std::string_view(reinterpret_cast<const char*>(fp->bytes.data()), fp->bytes.size());
}

bool IsInt(const redisReply* r) { return r != nullptr && r->type == REDIS_REPLY_INTEGER; }

// What each script's reply says about whether it changed data (for WAIT).
using Wrote = redis::Wrote;
bool FirstIs(const redisReply& r, long long code) {
  return r.type == REDIS_REPLY_ARRAY && r.elements > 0 && IsInt(r.element[0]) &&
         r.element[0]->integer == code;
}
bool WroteIfAcquired(const redisReply& r) { return FirstIs(r, 0); }
bool WroteIfSessionFound(const redisReply& r) {
  // Every answer but "unknown session" and "past the window" refreshed the session.
  return r.type == REDIS_REPLY_ARRAY && r.elements > 0 && IsInt(r.element[0]) &&
         r.element[0]->integer >= 0;
}
bool WroteIfApplied(const redisReply& r) { return r.type == REDIS_REPLY_INTEGER && r.integer == 0; }
bool WroteIfPositive(const redisReply& r) { return r.type == REDIS_REPLY_INTEGER && r.integer > 0; }
bool WroteIfSessionInfo(const redisReply& r) {
  return r.type == REDIS_REPLY_ARRAY && r.elements == 4;
}
// A batch's answers: {0, token, ...} or, for a key acquired with the call's one lease, just 0.
bool WroteIfAnyAcquired(const redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY) return false;
  for (std::size_t i = 0; i < r.elements; ++i) {
    const redisReply& e = *r.element[i];
    if (WroteIfAcquired(e) || (e.type == REDIS_REPLY_INTEGER && e.integer == 0)) return true;
  }
  return false;
}
bool WroteIfAnyApplied(const redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY) return false;
  for (std::size_t i = 0; i < r.elements; ++i) {
    if (WroteIfApplied(*r.element[i])) return true;
  }
  return false;
}

// EVALSHA of one script on one key, formatted as the arguments come.
class ScriptCall {
 public:
  ScriptCall(ScriptId id, std::string key, Wrote wrote) {
    const redis::Script& script = GetScript(id);
    command_.Arg("EVALSHA").Arg(script.sha).Arg(std::int64_t{1}).Arg(key);
    request_.key = std::move(key);
    request_.wrote = wrote;
    request_.script = &script;
  }
  ScriptCall& Arg(std::string_view a) {
    command_.Arg(a);
    return *this;
  }
  ScriptCall& Arg(std::int64_t n) {
    command_.Arg(n);
    return *this;
  }
  ScriptCall& UArg(std::uint64_t n) {
    command_.UArg(n);
    return *this;
  }
  Request Take() {
    command_.AppendTo(request_.command);
    return std::move(request_);
  }

 private:
  Command command_;
  Request request_;
};

Status Unexpected(std::string_view op, const redisReply& r) {
  return UnavailableError("redis answered " + std::string(op) + " with " + Describe(r));
}

// An error reply to one of our commands: the server refused it.
Status Refused(std::string_view op, const redisReply& r) {
  const std::string_view text(r.str, r.len);
  if (text.substr(0, 3) == "OOM") {
    return ResourceExhaustedError("redis is out of memory (" + std::string(text) + ")");
  }
  return UnavailableError("redis refused " + std::string(op) + ": " + std::string(text));
}

long long IntAt(const redisReply& r, std::size_t i) { return r.element[i]->integer; }

// {0, token, attempt, lease} / {1, lease} / {2, outcome, attempt, response} / {3} / {4}.
// Other codes are for the caller (sessions); they come back as nullopt.
Result<std::optional<BeginAnswer>> ParseBegin(std::string_view op, const redisReply& r) {
  if (r.type == REDIS_REPLY_ERROR) return Refused(op, r);
  if (r.type != REDIS_REPLY_ARRAY || r.elements == 0 || !IsInt(r.element[0])) {
    return Unexpected(op, r);
  }
  const long long code = IntAt(r, 0);
  auto ints = [&r](std::size_t n) {
    if (r.elements != n) return false;
    for (std::size_t i = 0; i < n; ++i) {
      if (!IsInt(r.element[i])) return false;
    }
    return true;
  };
  switch (code) {
    case 0: {
      // {0, token, attempt, lease deadline}, and from begin_versioned a fifth: 1 if it took
      // over another version's run (a record's takeover is its attempt > 1).
      if (!(ints(4) || ints(5)) || IntAt(r, 1) <= 0 || IntAt(r, 2) <= 0) break;
      const auto attempt = static_cast<std::uint32_t>(IntAt(r, 2));
      return std::optional<BeginAnswer>(Acquired{static_cast<Token>(IntAt(r, 1)), attempt,
                                                 At(IntAt(r, 3)),
                                                 r.elements == 5 ? IntAt(r, 4) == 1 : attempt > 1});
    }
    case 1:
      if (!ints(2)) break;
      return std::optional<BeginAnswer>(Busy{At(IntAt(r, 1))});
    case 2: {
      if (r.elements != 4 || !IsInt(r.element[1]) || !IsInt(r.element[2]) ||
          r.element[3]->type != REDIS_REPLY_STRING) {
        break;
      }
      Replay replay;
      replay.outcome = IntAt(r, 1) == 1 ? Outcome::kFailure : Outcome::kSuccess;
      replay.attempt = static_cast<std::uint32_t>(IntAt(r, 2));
      replay.response.assign(r.element[3]->str, r.element[3]->len);
      return std::optional<BeginAnswer>(std::move(replay));
    }
    case 3:
      return std::optional<BeginAnswer>(Conflict{});
    case 4:
      return std::optional<BeginAnswer>(Stale{});
    default:
      return std::optional<BeginAnswer>();
  }
  return Unexpected(op, r);
}

// 0 applied, 1 lease lost; -1 (unknown session) comes back as nullopt.
Result<std::optional<WriteAnswer>> ParseWrite(std::string_view op, const redisReply& r) {
  if (r.type == REDIS_REPLY_ERROR) return Refused(op, r);
  if (r.type == REDIS_REPLY_INTEGER) {
    if (r.integer == 0) return std::optional<WriteAnswer>(WriteAnswer::kApplied);
    if (r.integer == 1) return std::optional<WriteAnswer>(WriteAnswer::kLeaseLost);
    if (r.integer == -1) return std::optional<WriteAnswer>();
  }
  return Unexpected(op, r);
}

Result<BeginAnswer> ToBegin(std::string_view op, const Result<Reply>& reply) {
  if (!reply.has_value()) return reply.error();
  auto parsed = ParseBegin(op, **reply);
  if (!parsed.has_value()) return parsed.error();
  if (!parsed->has_value()) return Unexpected(op, **reply);
  return std::move(**parsed);
}

Result<WriteAnswer> ToWrite(std::string_view op, const Result<Reply>& reply) {
  if (!reply.has_value()) return reply.error();
  auto parsed = ParseWrite(op, **reply);
  if (!parsed.has_value()) return parsed.error();
  if (!parsed->has_value()) return Unexpected(op, **reply);
  return **parsed;
}

class RedisStore final : public Store {
 public:
  RedisStore(const RedisStoreOptions& options, std::unique_ptr<redis::Router> router)
      : clock_(options.clock != nullptr ? options.clock : &Clock::System()),
        prefix_(options.key_prefix),
        max_key_bytes_(options.max_key_bytes),
        abandoned_(options.abandoned_retention.count()),
        router_(std::move(router)) {}

  std::string_view Name() const override { return "redis"; }

  Result<BeginAnswer> Begin(const BeginRequest& req) override {
    IDEM_RETURN_IF_ERROR(core::CheckBegin(req, max_key_bytes_));
    return ToBegin("begin", router_->Run(BeginCall(req, Now())));
  }

  Result<WriteAnswer> Complete(const CompleteRequest& req) override {
    IDEM_RETURN_IF_ERROR(core::CheckComplete(req, max_key_bytes_));
    return ToWrite("complete", router_->Run(CompleteCall(req, Now())));
  }

  Result<WriteAnswer> Release(std::string_view scope, std::string_view key, Token token) override {
    IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, max_key_bytes_));
    return ToWrite("release",
                   router_->Run(ScriptCall(ScriptId::kRelease,
                                           redis::RecordKey(prefix_, scope, key), WroteIfApplied)
                                    .Arg(Now())
                                    .UArg(token)
                                    .Take()));
  }

  Result<WriteAnswer> Extend(std::string_view scope, std::string_view key, Token token,
                             std::chrono::milliseconds lease) override {
    const ExtendRequest req{.scope = scope, .key = key, .token = token, .lease = lease};
    IDEM_RETURN_IF_ERROR(core::CheckExtend(req, max_key_bytes_));
    return ToWrite("extend", router_->Run(ExtendCall(req, Now())));
  }

  // Pipelined: one round trip (per node, in a cluster).
  std::vector<Result<WriteAnswer>> ExtendBatch(std::span<const ExtendRequest> reqs) override {
    return RunBatch<WriteAnswer>(
        reqs, [this](const ExtendRequest& r) { return core::CheckExtend(r, max_key_bytes_); },
        [this](const ExtendRequest& r, std::int64_t now) { return ExtendCall(r, now); },
        [](const Result<Reply>& reply) { return ToWrite("extend", reply); });
  }

  std::vector<Result<BeginAnswer>> BeginBatch(std::span<const BeginRequest> reqs) override {
    if (!router_->cluster()) {
      // One node: a script call per chunk of the batch, not per key.
      return RunManyBatch<BeginAnswer>(
          reqs, [this](const BeginRequest& r) { return core::CheckBegin(r, max_key_bytes_); },
          ScriptId::kBeginMany, WroteIfAnyAcquired, 2,
          [this](Command& c, std::int64_t now, std::span<const BeginRequest* const> chunk, bool) {
            // One lease for the whole call (the usual case) is sent once.
            const bool same = std::all_of(chunk.begin(), chunk.end(), [&](const BeginRequest* r) {
              return r->lease == chunk.front()->lease;
            });
            c.Arg(now).Arg(abandoned_);
            if (same) {
              c.Arg(chunk.front()->lease.count());
            } else {
              c.Arg(std::string_view());
            }
            return same;
          },
          [](Command& c, const BeginRequest& r, bool same) {
            if (!same) c.Arg(r.lease.count());
            c.Arg(FingerprintArg(r.fingerprint));
          },
          [](const redisReply& all, std::size_t j, std::size_t n) -> Result<BeginAnswer> {
            const redisReply& r = *all.element[j];
            // 0: acquired a new key with the call's one lease; the token and lease deadline
            // are the two elements after the answers.
            if (IsInt(&r) && r.integer == 0 && all.elements == n + 2 && IsInt(all.element[n]) &&
                IsInt(all.element[n + 1]) && all.element[n]->integer > 0) {
              return BeginAnswer(Acquired{static_cast<Token>(all.element[n]->integer), 1,
                                          At(all.element[n + 1]->integer)});
            }
            auto parsed = ParseBegin("begin", r);
            if (!parsed.has_value()) return parsed.error();
            if (!parsed->has_value()) return Unexpected("begin", r);
            return std::move(**parsed);
          });
    }
    return RunBatch<BeginAnswer>(
        reqs, [this](const BeginRequest& r) { return core::CheckBegin(r, max_key_bytes_); },
        [this](const BeginRequest& r, std::int64_t now) { return BeginCall(r, now); },
        [](const Result<Reply>& reply) { return ToBegin("begin", reply); });
  }

  std::vector<Result<WriteAnswer>> CompleteBatch(std::span<const CompleteRequest> reqs) override {
    if (!router_->cluster()) {
      return RunManyBatch<WriteAnswer>(
          reqs, [this](const CompleteRequest& r) { return core::CheckComplete(r, max_key_bytes_); },
          ScriptId::kCompleteMany, WroteIfAnyApplied, 0,
          [](Command& c, std::int64_t now, std::span<const CompleteRequest* const> chunk,
             bool distinct) {
            // One outcome and retention for the whole call (the usual case) are sent once.
            const bool same =
                std::all_of(chunk.begin(), chunk.end(), [&](const CompleteRequest* r) {
                  return r->outcome == chunk.front()->outcome &&
                         r->retention == chunk.front()->retention;
                });
            c.Arg(now).Arg(distinct ? std::string_view("1") : std::string_view());
            if (same) {
              c.Arg(std::int64_t{chunk.front()->outcome == Outcome::kFailure ? 1 : 0})
                  .Arg(chunk.front()->retention.count());
            } else {
              c.Arg(std::string_view()).Arg(std::string_view());
            }
            return same;
          },
          [](Command& c, const CompleteRequest& r, bool same) {
            c.UArg(r.token);
            if (!same) {
              c.Arg(std::int64_t{r.outcome == Outcome::kFailure ? 1 : 0}).Arg(r.retention.count());
            }
            c.Arg(r.response);
          },
          [](const redisReply& all, std::size_t j, std::size_t) -> Result<WriteAnswer> {
            const redisReply& r = *all.element[j];
            auto parsed = ParseWrite("complete", r);
            if (!parsed.has_value()) return parsed.error();
            if (!parsed->has_value()) return Unexpected("complete", r);
            return **parsed;
          });
    }
    return RunBatch<WriteAnswer>(
        reqs, [this](const CompleteRequest& r) { return core::CheckComplete(r, max_key_bytes_); },
        [this](const CompleteRequest& r, std::int64_t now) { return CompleteCall(r, now); },
        [](const Result<Reply>& reply) { return ToWrite("complete", reply); });
  }

  // ---- operator calls ----

  Result<std::optional<Record>> Get(std::string_view scope, std::string_view key) override {
    IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, max_key_bytes_));
    const std::int64_t now = Now();
    Result<Reply> reply = router_->Run(GetCall(redis::RecordKey(prefix_, scope, key)));
    if (!reply.has_value()) return reply.error();
    auto stored = ReadGet(**reply);
    if (!stored.has_value()) return stored.error();
    if (!stored->has_value() || !core::IsLive((*stored)->head, At(now))) {
      return std::optional<Record>();
    }
    return std::optional<Record>(ToRecord(std::string(scope), std::string(key), **stored));
  }

  Result<std::vector<Record>> List(const ListFilter& filter) override {
    if (filter.scope) IDEM_RETURN_IF_ERROR(ValidateScope(*filter.scope));
    const std::int64_t now = Now();
    std::vector<Record> out;
    if (filter.limit == 0) return out;
    Status st = Scan([&](std::vector<std::string>& keys) -> Result<bool> {
      std::vector<redis::ParsedKey> parsed;
      std::vector<Request> requests;
      for (std::string& k : keys) {
        auto p = redis::ParseKey(prefix_, k);
        if (!p || p->kind != redis::KeyKind::kRecord) continue;
        if (filter.scope && p->scope != *filter.scope) continue;
        parsed.push_back(std::move(*p));
        requests.push_back(GetCall(std::move(k)));
      }
      std::vector<Result<Reply>> replies = router_->RunMany(requests);
      for (std::size_t i = 0; i < replies.size(); ++i) {
        if (!replies[i].has_value()) return replies[i].error();
        auto stored = ReadGet(**replies[i]);
        if (!stored.has_value()) return stored.error();
        if (!stored->has_value()) continue;  // gone since the scan
        const core::RecordHead& h = (*stored)->head;
        if (!core::IsLive(h, At(now)) || (filter.state && h.state != *filter.state) ||
            (filter.created_before && !(h.created < *filter.created_before))) {
          continue;
        }
        out.push_back(ToRecord(std::move(parsed[i].scope), std::move(parsed[i].name), **stored));
        if (out.size() >= filter.limit) return false;
      }
      return true;
    });
    if (!st.ok()) return st;
    return out;
  }

  Result<bool> Erase(std::string_view scope, std::string_view key) override {
    IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, max_key_bytes_));
    Result<Reply> reply = router_->Run(
        ScriptCall(ScriptId::kErase, redis::RecordKey(prefix_, scope, key), WroteIfPositive)
            .Arg(Now())
            .Take());
    if (!reply.has_value()) return reply.error();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) return Refused("erase", r);
    if (r.type != REDIS_REPLY_INTEGER || (r.integer != 0 && r.integer != 1)) {
      return Unexpected("erase", r);
    }
    return r.integer == 1;
  }

  Result<StoreStats> Stats() override {
    const std::int64_t now = Now();
    StoreStats stats;
    Status st = Scan([&](std::vector<std::string>& keys) -> Result<bool> {
      std::vector<redis::KeyKind> kinds;
      std::vector<Request> requests;
      for (std::string& k : keys) {
        auto p = redis::ParseKey(prefix_, k);
        if (!p) continue;
        kinds.push_back(p->kind);
        stats.bytes += k.size() + 64;  // the key, and Redis's own bookkeeping for it
        if (p->kind == redis::KeyKind::kRecord) {
          requests.push_back(GetCall(std::move(k)));
        } else {
          Request r;
          r.command = (p->kind == redis::KeyKind::kSession ? Command().Arg("HGETALL").Arg(k)
                                                           : Command().Arg("GET").Arg(k))
                          .Take();
          r.key = std::move(k);
          requests.push_back(std::move(r));
        }
      }
      std::vector<Result<Reply>> replies = router_->RunMany(requests);
      for (std::size_t i = 0; i < replies.size(); ++i) {
        if (!replies[i].has_value()) return replies[i].error();
        const redisReply& r = **replies[i];
        if (r.type == REDIS_REPLY_NIL) continue;
        if (r.type == REDIS_REPLY_ERROR) return Refused("stats", r);
        switch (kinds[i]) {
          case redis::KeyKind::kSession:
            IDEM_RETURN_IF_ERROR(CountSession(r, now, stats));
            break;
          case redis::KeyKind::kEntity: {
            if (r.type != REDIS_REPLY_STRING) return Unexpected("stats", r);
            auto e = redis::DecodeEntity(std::string_view(r.str, r.len));
            if (!e.has_value()) return e.error();
            if (now < Ms(e->expires)) ++stats.entities;
            stats.bytes += r.len;
            break;
          }
          default: {
            auto stored = ReadGet(r);
            if (!stored.has_value()) return stored.error();
            if (!stored->has_value() || !core::IsLive((*stored)->head, At(now))) break;
            ++((*stored)->head.state == RecordState::kCompleted ? stats.completed
                                                                : stats.in_progress);
            stats.bytes += 16 + (*stored)->response.size();
            break;
          }
        }
      }
      return true;
    });
    if (!st.ok()) return st;
    return stats;
  }

  Result<std::uint64_t> Purge() override {
    const std::int64_t now = Now();
    std::uint64_t reclaimed = 0;
    Status st = Scan([&](std::vector<std::string>& keys) -> Result<bool> {
      std::vector<Request> requests;
      for (std::string& k : keys) {
        auto p = redis::ParseKey(prefix_, k);
        if (!p) continue;
        const char what = p->kind == redis::KeyKind::kSession  ? 's'
                          : p->kind == redis::KeyKind::kEntity ? 'e'
                                                               : 'r';
        requests.push_back(ScriptCall(ScriptId::kPurge, std::move(k), WroteIfPositive)
                               .Arg(now)
                               .Arg(std::string_view(&what, 1))
                               .Take());
      }
      std::vector<Result<Reply>> replies = router_->RunMany(requests);
      for (const Result<Reply>& reply : replies) {
        if (!reply.has_value()) return reply.error();
        const redisReply& r = **reply;
        if (r.type == REDIS_REPLY_ERROR) return Refused("purge", r);
        if (r.type != REDIS_REPLY_INTEGER || r.integer < 0) return Unexpected("purge", r);
        reclaimed += static_cast<std::uint64_t>(r.integer);
      }
      return true;
    });
    if (!st.ok()) return st;
    return reclaimed;
  }

  // ---- client sessions ----

  Result<SessionInfo> OpenSession(const SessionRequest& req) override {
    IDEM_RETURN_IF_ERROR(core::CheckSession(req, max_key_bytes_));
    Result<Reply> reply = router_->Run(
        ScriptCall(ScriptId::kOpenSession, redis::SessionKey(prefix_, req.scope, req.client_id),
                   WroteIfSessionInfo)
            .Arg(Now())
            .Arg(req.ttl.count())
            .UArg(req.window)
            .Take());
    return ToSessionInfo("open session", reply, req.scope, req.client_id);
  }

  Result<BeginAnswer> BeginSequenced(const SequencedBeginRequest& req) override {
    IDEM_RETURN_IF_ERROR(core::CheckSequenced(req, max_key_bytes_));
    IDEM_RETURN_IF_ERROR(CheckExact("sequence number", req.seq));
    IDEM_RETURN_IF_ERROR(CheckExact("acknowledgement", req.ack));
    Result<Reply> reply = router_->Run(
        ScriptCall(ScriptId::kBeginSequenced, redis::SessionKey(prefix_, req.scope, req.client_id),
                   WroteIfSessionFound)
            .Arg(Now())
            .UArg(req.seq)
            .UArg(req.ack)
            .Arg(req.lease.count())
            .Arg(abandoned_)
            .Arg(FingerprintArg(req.fingerprint))
            .Take());
    if (!reply.has_value()) return reply.error();
    auto parsed = ParseBegin("begin sequenced", **reply);
    if (!parsed.has_value()) return parsed.error();
    if (parsed->has_value()) return std::move(**parsed);
    const redisReply& r = **reply;
    if (IntAt(r, 0) == -1) return UnknownSession(req.scope, req.client_id);
    if (IntAt(r, 0) == -2 && r.elements == 3 && IsInt(r.element[1]) && IsInt(r.element[2])) {
      return ResourceExhaustedError(
          "sequence number " + std::to_string(req.seq) + " is past the session window (low water " +
          std::to_string(IntAt(r, 1)) + ", window " + std::to_string(IntAt(r, 2)) + ")");
    }
    return Unexpected("begin sequenced", r);
  }

  Result<WriteAnswer> CompleteSequenced(const SequencedCompleteRequest& req) override {
    IDEM_RETURN_IF_ERROR(CheckClient(req.scope, req.client_id));
    IDEM_RETURN_IF_ERROR(CheckSeq(req.seq));
    Result<Reply> reply = router_->Run(
        ScriptCall(ScriptId::kCompleteSequenced,
                   redis::SessionKey(prefix_, req.scope, req.client_id), WroteIfApplied)
            .Arg(Now())
            .UArg(req.seq)
            .UArg(req.token)
            .Arg(std::int64_t{req.outcome == Outcome::kFailure ? 1 : 0})
            .Arg(req.response)
            .Take());
    return ToSequencedWrite("complete sequenced", reply, req.scope, req.client_id);
  }

  Result<WriteAnswer> ReleaseSequenced(std::string_view scope, std::string_view client_id,
                                       std::uint64_t seq, Token token) override {
    IDEM_RETURN_IF_ERROR(CheckClient(scope, client_id));
    IDEM_RETURN_IF_ERROR(CheckSeq(seq));
    Result<Reply> reply =
        router_->Run(ScriptCall(ScriptId::kReleaseSequenced,
                                redis::SessionKey(prefix_, scope, client_id), WroteIfApplied)
                         .Arg(Now())
                         .UArg(seq)
                         .UArg(token)
                         .Take());
    return ToSequencedWrite("release sequenced", reply, scope, client_id);
  }

  Result<SessionInfo> Acknowledge(std::string_view scope, std::string_view client_id,
                                  std::uint64_t ack) override {
    IDEM_RETURN_IF_ERROR(CheckClient(scope, client_id));
    IDEM_RETURN_IF_ERROR(CheckExact("acknowledgement", ack));
    Result<Reply> reply =
        router_->Run(ScriptCall(ScriptId::kAcknowledge,
                                redis::SessionKey(prefix_, scope, client_id), WroteIfSessionInfo)
                         .Arg(Now())
                         .UArg(ack)
                         .Take());
    return ToSessionInfo("acknowledge", reply, scope, client_id);
  }

  // ---- versioned entities ----

  Result<BeginAnswer> BeginVersioned(const VersionedBeginRequest& req) override {
    IDEM_RETURN_IF_ERROR(core::CheckVersioned(req, max_key_bytes_));
    IDEM_RETURN_IF_ERROR(CheckExact("version", req.version));
    return ToBegin(
        "begin versioned",
        router_->Run(ScriptCall(ScriptId::kBeginVersioned,
                                redis::EntityKey(prefix_, req.scope, req.entity), WroteIfAcquired)
                         .Arg(Now())
                         .UArg(req.version)
                         .Arg(req.lease.count())
                         .Arg(abandoned_)
                         .Take()));
  }

  Result<WriteAnswer> CompleteVersioned(const VersionedCompleteRequest& req) override {
    IDEM_RETURN_IF_ERROR(CheckEntity(req.scope, req.entity));
    IDEM_RETURN_IF_ERROR(core::CheckRetention(req.retention));
    return ToWrite(
        "complete versioned",
        router_->Run(ScriptCall(ScriptId::kCompleteVersioned,
                                redis::EntityKey(prefix_, req.scope, req.entity), WroteIfApplied)
                         .Arg(Now())
                         .UArg(req.token)
                         .Arg(req.retention.count())
                         .Take()));
  }

  Result<WriteAnswer> ReleaseVersioned(std::string_view scope, std::string_view entity,
                                       Token token) override {
    IDEM_RETURN_IF_ERROR(CheckEntity(scope, entity));
    return ToWrite("release versioned",
                   router_->Run(ScriptCall(ScriptId::kReleaseVersioned,
                                           redis::EntityKey(prefix_, scope, entity), WroteIfApplied)
                                    .Arg(Now())
                                    .UArg(token)
                                    .Take()));
  }

  Result<std::optional<EntityVersion>> GetVersion(std::string_view scope,
                                                  std::string_view entity) override {
    IDEM_RETURN_IF_ERROR(CheckEntity(scope, entity));
    const std::int64_t now = Now();
    Request request;
    request.key = redis::EntityKey(prefix_, scope, entity);
    request.command = Command().Arg("GET").Arg(request.key).Take();
    Result<Reply> reply = router_->Run(request);
    if (!reply.has_value()) return reply.error();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_NIL) return std::optional<EntityVersion>();
    if (r.type == REDIS_REPLY_ERROR) return Refused("get version", r);
    if (r.type != REDIS_REPLY_STRING) return Unexpected("get version", r);
    auto e = redis::DecodeEntity(std::string_view(r.str, r.len));
    if (!e.has_value()) return e.error();
    if (now >= Ms(e->expires)) return std::optional<EntityVersion>();
    EntityVersion v;
    v.scope = std::string(scope);
    v.entity = std::string(entity);
    v.applied = e->applied;
    if (e->in_progress != 0) v.in_progress = e->in_progress;
    v.token = e->token;
    v.attempt = e->attempt;
    v.lease_deadline = e->lease_deadline;
    v.expires = e->expires;
    return std::optional<EntityVersion>(std::move(v));
  }

 private:
  std::int64_t Now() const { return Ms(clock_->Now()); }

  Request BeginCall(const BeginRequest& req, std::int64_t now) const {
    return ScriptCall(ScriptId::kBegin, redis::RecordKey(prefix_, req.scope, req.key),
                      WroteIfAcquired)
        .Arg(now)
        .Arg(req.lease.count())
        .Arg(abandoned_)
        .Arg(FingerprintArg(req.fingerprint))
        .Take();
  }

  Request CompleteCall(const CompleteRequest& req, std::int64_t now) const {
    return ScriptCall(ScriptId::kComplete, redis::RecordKey(prefix_, req.scope, req.key),
                      WroteIfApplied)
        .Arg(now)
        .UArg(req.token)
        .Arg(std::int64_t{req.outcome == Outcome::kFailure ? 1 : 0})
        .Arg(req.retention.count())
        .Arg(req.response)
        .Take();
  }

  Request ExtendCall(const ExtendRequest& req, std::int64_t now) const {
    return ScriptCall(ScriptId::kExtend, redis::RecordKey(prefix_, req.scope, req.key),
                      WroteIfApplied)
        .Arg(now)
        .UArg(req.token)
        .Arg(req.lease.count())
        .Arg(abandoned_)
        .Take();
  }

  static Request GetCall(std::string key) {
    return ScriptCall(ScriptId::kGet, std::move(key), nullptr).Take();
  }

  // A kGet reply: nullopt when there is no record.
  static Result<std::optional<redis::StoredRecord>> ReadGet(const redisReply& r) {
    if (r.type == REDIS_REPLY_NIL) return std::optional<redis::StoredRecord>();
    if (r.type == REDIS_REPLY_ERROR) return Refused("get", r);
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 ||
        r.element[0]->type != REDIS_REPLY_STRING || !IsInt(r.element[1])) {
      return Unexpected("get", r);
    }
    auto stored = redis::DecodeRecord(std::string_view(r.element[0]->str, r.element[0]->len),
                                      r.element[1]->integer);
    if (!stored.has_value()) return stored.error();
    return std::optional<redis::StoredRecord>(std::move(*stored));
  }

  static Record ToRecord(std::string scope, std::string key, const redis::StoredRecord& s) {
    Record r;
    r.scope = std::move(scope);
    r.key = std::move(key);
    r.state = s.head.state;
    r.fingerprint = s.fingerprint;
    r.token = s.head.token;
    r.attempt = s.head.attempt;
    r.created = s.head.created;
    r.lease_deadline = s.head.lease_deadline;
    r.expires = s.head.expires;
    r.outcome = s.head.outcome;
    r.response = s.response;
    return r;
  }

  template <typename Answer, typename Req, typename Check, typename Make, typename Read>
  std::vector<Result<Answer>> RunBatch(std::span<const Req> reqs, Check check, Make make,
                                       Read read) {
    std::vector<std::optional<Result<Answer>>> answers(reqs.size());
    std::vector<Request> requests;
    std::vector<std::size_t> index;
    const std::int64_t now = Now();
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      Status st = check(reqs[i]);
      if (!st.ok()) {
        answers[i].emplace(std::move(st));
        continue;
      }
      requests.push_back(make(reqs[i], now));
      index.push_back(i);
    }
    if (!requests.empty()) {
      std::vector<Result<Reply>> replies = router_->RunMany(requests);
      for (std::size_t j = 0; j < replies.size(); ++j) answers[index[j]].emplace(read(replies[j]));
    }
    std::vector<Result<Answer>> out;
    out.reserve(reqs.size());
    for (auto& a : answers) out.push_back(std::move(*a));
    return out;
  }

  // A batch on one node: the valid requests in chunks, each chunk one call of `script` with
  // the chunk's keys, the arguments `head` adds (given the chunk, and whether no key appears
  // twice in it), then the arguments `each` adds for each request (given what `head`
  // returned). The reply has an element for each request, and may have `extra` more after
  // them; `read(reply, j, n)` turns element j of a reply for n requests into an answer.
  template <typename Answer, typename Req, typename Check, typename Head, typename Each,
            typename Read>
  std::vector<Result<Answer>> RunManyBatch(std::span<const Req> reqs, Check check, ScriptId script,
                                           redis::Wrote wrote, std::size_t extra, Head head,
                                           Each each, Read read) {
    constexpr std::size_t kChunk = 256;  // keeps each script call short
    std::vector<std::optional<Result<Answer>>> answers(reqs.size());
    std::vector<std::size_t> valid;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      Status st = check(reqs[i]);
      if (st.ok()) {
        valid.push_back(i);
      } else {
        answers[i].emplace(std::move(st));
      }
    }
    const std::int64_t now = Now();
    const redis::Script& s = GetScript(script);
    std::vector<Request> requests;
    std::vector<const Req*> part;
    std::vector<std::string> keys;
    std::vector<std::string_view> sorted;
    for (std::size_t at = 0; at < valid.size(); at += kChunk) {
      const std::size_t n = std::min(kChunk, valid.size() - at);
      part.clear();
      keys.clear();
      for (std::size_t j = 0; j < n; ++j) {
        const Req& r = reqs[valid[at + j]];
        part.push_back(&r);
        keys.push_back(redis::RecordKey(prefix_, r.scope, r.key));
      }
      sorted.assign(keys.begin(), keys.end());
      std::sort(sorted.begin(), sorted.end());
      const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
      Command c;
      c.Arg("EVALSHA").Arg(s.sha).UArg(n);
      for (const std::string& key : keys) c.Arg(key);
      const auto mode = head(c, now, std::span<const Req* const>(part), distinct);
      for (const Req* r : part) each(c, *r, mode);
      Request request;
      request.key = std::move(keys.front());
      c.AppendTo(request.command);
      request.wrote = wrote;
      request.script = &s;
      requests.push_back(std::move(request));
    }
    std::vector<Result<Reply>> replies = router_->RunMany(requests);
    for (std::size_t chunk = 0; chunk < replies.size(); ++chunk) {
      const std::size_t first = chunk * kChunk;
      const std::size_t n = std::min(kChunk, valid.size() - first);
      const Result<Reply>& reply = replies[chunk];
      Status failed;
      if (!reply.has_value()) {
        failed = reply.error();
      } else if ((*reply)->type == REDIS_REPLY_ERROR) {
        failed = Refused("batch", **reply);
      } else if ((*reply)->type != REDIS_REPLY_ARRAY ||
                 ((*reply)->elements != n && (*reply)->elements != n + extra)) {
        failed = Unexpected("batch", **reply);
      }
      for (std::size_t j = 0; j < n; ++j) {
        if (!failed.ok()) {
          answers[valid[first + j]].emplace(failed);
        } else {
          answers[valid[first + j]].emplace(read(**reply, j, n));
        }
      }
    }
    std::vector<Result<Answer>> out;
    out.reserve(reqs.size());
    for (auto& a : answers) out.push_back(std::move(*a));
    return out;
  }

  // Walks every key under the prefix, on every master, a page at a time; `page` returns false
  // to stop early.
  Status Scan(const std::function<Result<bool>(std::vector<std::string>&)>& page) {
    Result<std::vector<redis::Node*>> masters = router_->Masters();
    if (!masters.has_value()) return masters.error();
    const std::string pattern = redis::PrefixPattern(prefix_);
    std::set<std::string> seen;  // SCAN may return a key twice
    for (redis::Node* node : *masters) {
      std::string cursor = "0";
      do {
        const std::string command = Command()
                                        .Arg("SCAN")
                                        .Arg(cursor)
                                        .Arg("MATCH")
                                        .Arg(pattern)
                                        .Arg("COUNT")
                                        .UArg(kScanCount)
                                        .Take();
        Result<Reply> reply = router_->RunOn(*node, command);
        if (!reply.has_value()) return reply.error();
        const redisReply& r = **reply;
        if (r.type == REDIS_REPLY_ERROR) return Refused("scan", r);
        if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 ||
            r.element[0]->type != REDIS_REPLY_STRING || r.element[1]->type != REDIS_REPLY_ARRAY) {
          return Unexpected("scan", r);
        }
        cursor.assign(r.element[0]->str, r.element[0]->len);
        std::vector<std::string> keys;
        for (std::size_t i = 0; i < r.element[1]->elements; ++i) {
          const redisReply* k = r.element[1]->element[i];
          if (k->type != REDIS_REPLY_STRING) return Unexpected("scan", r);
          std::string key(k->str, k->len);
          if (seen.insert(key).second) keys.push_back(std::move(key));
        }
        if (!keys.empty()) {
          Result<bool> more = page(keys);
          if (!more.has_value()) return more.error();
          if (!*more) return OkStatus();
        }
      } while (cursor != "0");
    }
    return OkStatus();
  }

  Status CountSession(const redisReply& r, std::int64_t now, StoreStats& stats) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements % 2 != 0) return Unexpected("stats", r);
    std::optional<redis::StoredSession> head;
    for (std::size_t i = 0; i < r.elements; i += 2) {
      const redisReply* f = r.element[i];
      const redisReply* v = r.element[i + 1];
      if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) {
        return Unexpected("stats", r);
      }
      if (std::string_view(f->str, f->len) == "h") {
        auto s = redis::DecodeSession(std::string_view(v->str, v->len));
        if (!s.has_value()) return s.error();
        head = *s;
      }
    }
    if (!head || now >= Ms(head->expires)) return OkStatus();
    ++stats.sessions;
    for (std::size_t i = 0; i < r.elements; i += 2) {
      const redisReply* f = r.element[i];
      const redisReply* v = r.element[i + 1];
      stats.bytes += f->len + v->len + 16;
      if (std::string_view(f->str, f->len) == "h") continue;
      auto rec = redis::DecodeRecord(std::string_view(v->str, v->len), -1);
      if (!rec.has_value()) return rec.error();
      if (!core::IsLive(rec->head, At(now))) continue;
      ++(rec->head.state == RecordState::kCompleted ? stats.completed : stats.in_progress);
    }
    return OkStatus();
  }

  Result<SessionInfo> ToSessionInfo(std::string_view op, const Result<Reply>& reply,
                                    std::string_view scope, std::string_view client_id) const {
    if (!reply.has_value()) return reply.error();
    const redisReply& r = **reply;
    if (r.type == REDIS_REPLY_ERROR) return Refused(op, r);
    if (r.type == REDIS_REPLY_ARRAY && r.elements == 1 && IsInt(r.element[0]) &&
        IntAt(r, 0) == -1) {
      return UnknownSession(scope, client_id);
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements != 4) return Unexpected(op, r);
    for (std::size_t i = 0; i < 4; ++i) {
      if (!IsInt(r.element[i])) return Unexpected(op, r);
    }
    SessionInfo info;
    info.scope = std::string(scope);
    info.client_id = std::string(client_id);
    info.low_water = static_cast<std::uint64_t>(IntAt(r, 0));
    info.window = static_cast<std::uint32_t>(IntAt(r, 1));
    info.outstanding = static_cast<std::uint32_t>(IntAt(r, 2));
    info.expires = At(IntAt(r, 3));
    return info;
  }

  Result<WriteAnswer> ToSequencedWrite(std::string_view op, const Result<Reply>& reply,
                                       std::string_view scope, std::string_view client_id) const {
    if (!reply.has_value()) return reply.error();
    auto parsed = ParseWrite(op, **reply);
    if (!parsed.has_value()) return parsed.error();
    if (!parsed->has_value()) return UnknownSession(scope, client_id);
    return **parsed;
  }

  static Status UnknownSession(std::string_view scope, std::string_view client_id) {
    return FailedPreconditionError("session '" + std::string(client_id) + "' in scope '" +
                                   std::string(scope) +
                                   "' is unknown or expired; register it again");
  }

  static Status CheckExact(std::string_view what, std::uint64_t n) {
    if (n <= kMaxExact) return OkStatus();
    return InvalidArgumentError(std::string(what) + " " + std::to_string(n) +
                                " is over the Redis store's limit of 2^53-1");
  }

  Status CheckClient(std::string_view scope, std::string_view client_id) const {
    SessionRequest r;
    r.scope = scope;
    r.client_id = client_id;
    return core::CheckSession(r, max_key_bytes_);
  }

  static Status CheckSeq(std::uint64_t seq) {
    if (seq == 0) return InvalidArgumentError("sequence number 0: numbers start at 1");
    return CheckExact("sequence number", seq);
  }

  Status CheckEntity(std::string_view scope, std::string_view entity) const {
    VersionedBeginRequest r;
    r.scope = scope;
    r.entity = entity;
    r.version = 1;
    return core::CheckVersioned(r, max_key_bytes_);
  }

  Clock* const clock_;
  const std::string prefix_;
  const std::size_t max_key_bytes_;
  const std::int64_t abandoned_;
  const std::unique_ptr<redis::Router> router_;
};

// ---- URLs ----

Status BadUrl(std::string_view url, std::string_view what) {
  return InvalidArgumentError("store URL \"" + core::RedactUrlPassword(url) +
                              "\": " + std::string(what));
}

Result<long long> ParseNumber(std::string_view url, std::string_view name, std::string_view value,
                              long long min, long long max) {
  long long n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || n < min ||
      n > max) {
    return BadUrl(url, std::string(name) + "=" + std::string(value) +
                           " is not a whole number from " + std::to_string(min) + " to " +
                           std::to_string(max));
  }
  return n;
}

// %XX escapes in the user and password.
Result<std::string> Unescape(std::string_view url, std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    int v = 0;
    if (i + 2 >= s.size()) return BadUrl(url, "a '%' escape is cut short");
    // Two hex digits (from_chars would also take a sign: "%-1").
    const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (!hex(s[i + 1]) || !hex(s[i + 2])) return BadUrl(url, "a bad '%' escape");
    const auto [end, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc() || end != s.data() + i + 3) return BadUrl(url, "a bad '%' escape");
    out.push_back(static_cast<char>(v));
    i += 2;
  }
  return out;
}

// Every record has a TTL: a node whose maxmemory-policy evicts keys with one (volatile-*) or any
// (allkeys-*) would forget completed keys under memory pressure, silently, and run their next
// delivery again. One whose policy cannot be read (INFO renamed away) is taken as it is.
Status RefuseEviction(redis::Router& router) {
  auto masters = router.Masters();
  if (!masters) return masters.error();
  for (redis::Node* node : *masters) {
    Result<redis::Reply> info =
        router.RunOn(*node, redis::Command().Arg("INFO").Arg("memory").Take());
    if (!info) return info.error();
    if ((*info)->type != REDIS_REPLY_STRING) continue;
    const std::string_view text((*info)->str, (*info)->len);
    constexpr std::string_view kField = "maxmemory_policy:";
    const std::size_t at = text.find(kField);
    if (at == std::string_view::npos) continue;
    std::string_view policy = text.substr(at + kField.size());
    policy = policy.substr(0, policy.find_first_of("\r\n"));
    if (policy == "noeviction") continue;
    return FailedPreconditionError(
        "redis " + node->endpoint().ToString() + ": maxmemory-policy is " + std::string(policy) +
        ", so under memory pressure Redis drops idem's records (each has a TTL) and their keys "
        "run again. Set maxmemory-policy noeviction (a full Redis then fails closed), or add "
        "allow_eviction=1 to the store URL to accept that");
  }
  return OkStatus();
}

}  // namespace

Result<RedisStoreOptions> ParseRedisStoreUrl(std::string_view url) {
  if (const std::size_t at = core::FirstControlByte(url); at != std::string_view::npos) {
    return InvalidArgumentError("Redis store URL: " + core::ControlByteMessage(url, at));
  }
  RedisStoreOptions o;
  std::string_view rest;
  if (url.substr(0, 8) == "redis://") {
    rest = url.substr(8);
  } else if (url.substr(0, 16) == "redis+cluster://") {
    rest = url.substr(16);
    o.cluster = true;
  } else if (url.substr(0, 9) == "rediss://") {
    return BadUrl(url, "TLS (rediss://) is not supported: hiredis 0.14 has no TLS");
  } else {
    return BadUrl(url, "not redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT");
  }
  std::string_view query;
  if (const std::size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
    if (query.empty()) return BadUrl(url, "an empty query after '?'");
  }
  std::string_view path;
  if (const std::size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  if (const std::size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const std::size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      return BadUrl(url, "write the password as :PASSWORD@ (or USER:PASSWORD@)");
    }
    auto user = Unescape(url, userinfo.substr(0, colon));
    if (!user) return user.error();
    auto password = Unescape(url, userinfo.substr(colon + 1));
    if (!password) return password.error();
    if (password->empty()) return BadUrl(url, "an empty password");
    o.user = std::move(*user);
    o.password = std::move(*password);
  }
  if (rest.empty()) return BadUrl(url, "no host");
  while (true) {
    const std::string_view one = rest.substr(0, rest.find(','));
    if (one.empty()) return BadUrl(url, "an empty address in the host list");
    auto endpoint = redis::ParseEndpoint(one, 6379);
    if (!endpoint) return BadUrl(url, endpoint.error().message());
    o.nodes.push_back(endpoint->ToString());
    if (one.size() == rest.size()) break;
    rest.remove_prefix(one.size() + 1);
  }
  if (!o.cluster && o.nodes.size() > 1) {
    return BadUrl(url, "redis:// takes one HOST:PORT; for a cluster write redis+cluster://");
  }
  if (!path.empty()) {
    if (o.cluster)
      return BadUrl(url, "a Redis Cluster has no databases: drop /" + std::string(path));
    auto db = ParseNumber(url, "database", path, 0, 1 << 20);
    if (!db) return db.error();
    o.database = static_cast<int>(*db);
  }
  using std::chrono::milliseconds;
  while (!query.empty()) {
    const std::string_view param = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), param.size() + 1));
    const std::size_t eq = param.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return BadUrl(url, "option \"" + std::string(param) + "\" is not NAME=VALUE");
    }
    const std::string_view name = param.substr(0, eq);
    const std::string_view value = param.substr(eq + 1);
    auto number = [&](long long min, long long max) {
      return ParseNumber(url, name, value, min, max);
    };
    constexpr long long kDay = 24LL * 3600 * 1000;
    if (name == "prefix") {
      if (value.empty()) return BadUrl(url, "prefix= is empty");
      auto p = Unescape(url, value);
      if (!p) return p.error();
      o.key_prefix = std::move(*p);
    } else if (name == "connect_timeout_ms") {
      auto n = number(1, kDay);
      if (!n) return n.error();
      o.connect_timeout = milliseconds(*n);
    } else if (name == "timeout_ms") {
      auto n = number(1, kDay);
      if (!n) return n.error();
      o.command_timeout = milliseconds(*n);
    } else if (name == "connections") {
      auto n = number(1, 1024);
      if (!n) return n.error();
      o.connections_per_node = static_cast<std::size_t>(*n);
    } else if (name == "wait_replicas") {
      auto n = number(0, 1000);
      if (!n) return n.error();
      o.wait_replicas = static_cast<int>(*n);
    } else if (name == "wait_timeout_ms") {
      auto n = number(1, kDay);
      if (!n) return n.error();
      o.wait_timeout = milliseconds(*n);
    } else if (name == "abandoned_retention_ms") {
      auto n = number(1, core::kMaxDuration.count());
      if (!n) return n.error();
      o.abandoned_retention = milliseconds(*n);
    } else if (name == "max_key_bytes") {
      auto n = number(1, 65535);
      if (!n) return n.error();
      o.max_key_bytes = static_cast<std::size_t>(*n);
    } else if (name == "allow_eviction") {
      auto n = number(0, 1);
      if (!n) return n.error();
      o.allow_eviction = *n == 1;
    } else {
      return BadUrl(url, "unknown option \"" + std::string(name) +
                             "\" (known: prefix, connect_timeout_ms, timeout_ms, connections, "
                             "wait_replicas, wait_timeout_ms, abandoned_retention_ms, "
                             "max_key_bytes, allow_eviction)");
    }
  }
  return o;
}

Result<std::unique_ptr<Store>> OpenRedisStore(const RedisStoreOptions& options) {
  if (options.nodes.empty()) return InvalidArgumentError("redis store: no nodes given");
  if (options.key_prefix.empty())
    return InvalidArgumentError("redis store: the key prefix is empty");
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0 ||
      options.wait_timeout.count() <= 0) {
    return InvalidArgumentError("redis store: timeouts must be positive");
  }
  if (Status s = core::CheckAbandonedRetention(options.abandoned_retention); !s.ok()) {
    return InvalidArgumentError("redis store: " + s.message());
  }
  if (options.wait_replicas < 0) {
    return InvalidArgumentError("redis store: wait_replicas must not be negative");
  }
  if (!options.cluster && options.nodes.size() != 1) {
    return InvalidArgumentError("redis store: one node, or set cluster for several");
  }
  redis::RouterOptions r;
  r.cluster = options.cluster;
  r.connections_per_node = std::max<std::size_t>(1, options.connections_per_node);
  r.connection.connect_timeout = options.connect_timeout;
  r.connection.command_timeout = options.command_timeout;
  r.connection.wait_replicas = options.wait_replicas;
  r.connection.wait_timeout = options.wait_timeout;
  r.connection.user = options.user;
  r.connection.password = options.password;
  r.connection.database = options.database;
  for (const std::string& node : options.nodes) {
    auto e = redis::ParseEndpoint(node, 6379);
    if (!e) return InvalidArgumentError("redis store: " + e.error().message());
    r.seeds.push_back(std::move(*e));
  }
  auto router = redis::Router::Open(r);
  if (!router.has_value()) {
    // A wrong password or database, at open, is the URL's fault (idemd exits 2); later the
    // same refusal fails a call closed (kUnavailable), like any node that does not serve.
    if (router.error().message().find(redis::kHelloRefused) != std::string::npos) {
      return InvalidArgumentError(router.error().message());
    }
    return router.error();
  }
  if (!options.allow_eviction) IDEM_RETURN_IF_ERROR(RefuseEviction(**router));
  return std::unique_ptr<Store>(std::make_unique<RedisStore>(options, std::move(*router)));
}

}  // namespace idem
