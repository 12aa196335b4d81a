#include "idem/receiver.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/lease_keeper.h"
#include "core/machine.h"
#include "core/receiver_parts.h"
#include "idem/fingerprint.h"

namespace idem {

std::string_view DeliveryName(Delivery d) {
  switch (d) {
    case Delivery::kExecuted:
      return "executed";
    case Delivery::kReplayed:
      return "replayed";
    case Delivery::kCoalesced:
      return "coalesced";
    case Delivery::kBusy:
      return "busy";
    case Delivery::kConflict:
      return "conflict";
    case Delivery::kStale:
      return "stale";
  }
  return "unknown";
}

namespace {

// A completion or release the store did not answer is tried this often in all, pausing
// kWriteRetryPause, then twice that.
constexpr int kWriteTries = 3;
constexpr std::chrono::milliseconds kWriteRetryPause{20};

bool HeaderNameEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a == b) return true;  // brokers mostly keep the name as it was written
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; };
    return lower(x) == lower(y);
  });
}

// What a Replay, a Conflict or a stale answer settles, without the handler: every Begin answer
// but Acquired and Busy, which the caller handles.
Delivered Settled(std::string key, BeginAnswer& answer) {
  if (auto* r = std::get_if<Replay>(&answer)) {
    return Delivered{.delivery = Delivery::kReplayed,
                     .key = std::move(key),
                     .outcome = r->outcome,
                     .response = std::move(r->response),
                     .attempt = r->attempt};
  }
  if (std::holds_alternative<Conflict>(answer)) {
    return Delivered{.delivery = Delivery::kConflict, .key = std::move(key)};
  }
  return Delivered{.delivery = Delivery::kStale, .key = std::move(key)};
}

using core::Stopwatch;
using core::StoreError;

}  // namespace

namespace core {

std::string RefusedOutcomeText(const HandlerResult& result, const Status& refused) {
  return "idem: the handler ran, but the store refused its outcome (" +
         std::string(result.outcome == Outcome::kSuccess ? "success" : "failure") + ", a " +
         std::to_string(result.response.size()) + "-byte response): " + refused.message();
}

Status StoreError(const Status& s, std::string_view what) {
  if (s.code() == StatusCode::kInvalidArgument) return s;
  return UnavailableError(std::string(what) + ": " + s.ToString());
}

Result<std::optional<Fingerprint>> FingerprintFor(FingerprintMode mode, std::string_view payload) {
  switch (mode) {
    case FingerprintMode::kNone:
      return std::optional<Fingerprint>();
    case FingerprintMode::kBytes:
      return std::optional<Fingerprint>(FingerprintBytes(payload));
    case FingerprintMode::kJson: {
      auto fp = FingerprintJson(payload);
      if (!fp) return Status(fp.error().code(), "payload: " + fp.error().message());
      return std::optional<Fingerprint>(*fp);
    }
  }
  return InternalError("unknown fingerprint mode");
}

namespace {
template <class Begin>
Result<BeginAnswer> Timed(Metrics* metrics, bool polls_on_busy, const Begin& begin) {
  Stopwatch sw;
  auto answer = begin();
  if (metrics == nullptr) return answer;
  metrics->store_begin_seconds->ObserveDuration(sw.Elapsed());
  CountBeginAnswer(metrics, answer, polls_on_busy);
  return answer;
}
}  // namespace

void CountBeginAnswer(Metrics* metrics, const Result<BeginAnswer>& answer, bool polls_on_busy) {
  if (metrics == nullptr) return;
  if (!polls_on_busy || !answer || !std::holds_alternative<Busy>(*answer)) {
    CountBegin(*metrics, answer);
  }
}

Result<BeginAnswer> TimedBegin(Store& store, const BeginRequest& req, Metrics* metrics,
                               bool polls_on_busy) {
  return Timed(metrics, polls_on_busy, [&] { return store.Begin(req); });
}

Result<BeginAnswer> TimedBegin(Store& store, const VersionedBeginRequest& req, Metrics* metrics,
                               bool polls_on_busy) {
  return Timed(metrics, polls_on_busy, [&] { return store.BeginVersioned(req); });
}

void CountBusy(Metrics* metrics) {
  if (metrics != nullptr) metrics->begin_busy->Inc();
}

Result<BeginAnswer> BeginWaitingOutBusy(Clock& clock, const ReceiverOptions& options,
                                        const std::function<Result<BeginAnswer>()>& begin) {
  auto answer = begin();
  if (options.busy_policy == BusyPolicy::kReject) return answer;
  const Timestamp deadline = clock.Now() + options.busy_wait;
  std::chrono::milliseconds backoff{1};
  constexpr std::chrono::milliseconds kMaxBackoff{50};
  while (answer && std::holds_alternative<Busy>(*answer)) {
    const Timestamp now = clock.Now();
    if (now >= deadline) {
      CountBusy(options.metrics);  // the answer this delivery ends with
      break;
    }
    clock.SleepFor(
        std::min(backoff, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)));
    backoff = std::min(backoff * 2, kMaxBackoff);
    answer = begin();
  }
  return answer;
}

LeaseHold::LeaseHold(LeaseKeeper* keeper, Store& store, Clock& clock,
                     const ReceiverOptions& options, std::string_view key, Token token)
    : store_(store), clock_(clock), options_(options), key_(key), token_(token) {
  if (keeper == nullptr) return;
  extended_ = clock_.Now();
  started_ = extended_;
  hold_.emplace(*keeper, [this] { Keep(); });
}

void LeaseHold::Keep() {
  const Timestamp now = clock_.Now();
  if (now - extended_ < options_.lease / 2) return;
  if (options_.keep_leases_for.count() > 0 && now - started_ >= options_.keep_leases_for) return;
  Stopwatch sw;
  auto r = store_.Extend(options_.scope, key_, token_, options_.lease);
  if (Metrics* m = options_.metrics; m != nullptr) {
    m->store_extend_seconds->ObserveDuration(sw.Elapsed());
    if (!r) m->store_errors->Inc();
  }
  if (!r) return;  // tried again at the keeper's next turn
  extended_ = *r == WriteAnswer::kApplied ? now : Timestamp::max();
}

// Durations the store would refuse only once the handler had run (Complete with a retention
// out of range): refused before any call instead.
Status CheckReceiverOptions(const ReceiverOptions& o) {
  for (Status s : {CheckLease(o.lease), CheckRetention(o.retention)}) {
    if (!s.ok()) return InvalidArgumentError("receiver options: " + s.message());
  }
  // CheckRetention names "retention": this one is failure_retention.
  if (Status s = CheckRetention(o.failure_retention); !s.ok()) {
    return InvalidArgumentError("receiver options: failure_" + s.message());
  }
  if (o.keep_leases_for.count() < 0) {
    return InvalidArgumentError("receiver options: keep_leases_for is negative");
  }
  if (o.busy_wait.count() < 0) {  // it waited not at all, silently
    return InvalidArgumentError("receiver options: busy_wait is negative, got " +
                                std::to_string(o.busy_wait.count()) + "ms");
  }
  return OkStatus();
}

}  // namespace core

// In-process executions of a key, for BusyPolicy::kCoalesce: the first caller runs, concurrent
// duplicates wait for its result.
struct Receiver::Flights {
  struct Flight {
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<Result<Delivered>> result;
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::shared_ptr<Flight>> by_key;
  };
  static constexpr std::size_t kShards = 16;
  std::array<Shard, kShards> shards;

  Shard& ShardOf(const std::string& key) { return shards[std::hash<std::string>{}(key) % kShards]; }

  // Only a duplicate with the same fingerprint shares an execution: one with another payload
  // is a different request, which the store answers Conflict (SPEC §2), not this one's
  // outcome. The receiver's fingerprint mode is fixed, so the fingerprint is either always or
  // never there, and always of one length: the name is unambiguous.
  static std::string FlightName(std::string_view key, const std::optional<Fingerprint>& fp) {
    if (!fp) return std::string(key);
    std::string name;
    name.reserve(key.size() + 1 + fp->bytes.size());
    name.append(key);
    name.push_back('\0');
    name.append(reinterpret_cast<const char*>(fp->bytes.data()), fp->bytes.size());
    return name;
  }

  // Ends the first execution: its followers get `result` and the next caller starts afresh.
  void Land(Shard& shard, const std::string& name, Flight& flight, Result<Delivered> result) {
    {
      std::lock_guard lock(shard.mu);
      shard.by_key.erase(name);
    }
    {
      std::lock_guard lock(flight.mu);
      flight.result = std::move(result);
      flight.done = true;
    }
    flight.done_cv.notify_all();
  }
};

Receiver::Receiver(Store& store, ReceiverOptions options)
    : store_(store),
      options_(std::move(options)),
      options_status_(core::CheckReceiverOptions(options_)),
      clock_(options_.clock != nullptr ? *options_.clock : Clock::System()),
      flights_(std::make_unique<Flights>()) {
  if (options_.keep_leases && options_status_.ok()) {
    keeper_ = std::make_unique<core::LeaseKeeper>(options_.lease / 8);
  }
}

Receiver::~Receiver() = default;

Result<std::optional<Fingerprint>> Receiver::FingerprintOf(const Message& message) const {
  return core::FingerprintFor(options_.fingerprint, message.payload);
}

Result<std::string> Receiver::KeyOf(const Message& message) const {
  std::string storage;
  auto key = KeyOf(message, storage);
  if (!key) return key.error();
  return std::string(*key);
}

Result<std::string_view> Receiver::KeyOf(const Message& message, std::string& storage,
                                         KeyFault* fault) const {
  auto fails = [&](KeyFault f, std::string why) {
    if (fault != nullptr) *fault = f;
    return InvalidArgumentError(std::move(why));
  };
  std::string_view key;
  if (!message.key.empty()) {
    key = message.key;
  } else {
    const KeySource& src = options_.key_source;
    switch (src.kind) {
      case KeySource::Kind::kExplicit:
        break;  // empty: rejected below
      case KeySource::Kind::kHeader: {
        auto it =
            std::find_if(message.headers.begin(), message.headers.end(),
                         [&](const Header& h) { return HeaderNameEquals(h.first, src.name); });
        if (it == message.headers.end()) {
          return fails(KeyFault::kNoKey, "no idempotency key: header " + src.name + " is missing");
        }
        key = it->second;
        break;
      }
      case KeySource::Kind::kJsonPointer: {
        auto text = JsonPointerText(message.payload, src.name);
        if (!text) {
          // A payload that does not parse is bad as a whole, not missing a key (as in the
          // fingerprint's case below).
          const std::string& why = text.error().message();
          if (why.starts_with("invalid JSON"))
            return fails(KeyFault::kBadPayload, "payload: " + why);
          return fails(KeyFault::kNoKey,
                       "no idempotency key at JSON pointer \"" + src.name + "\": " + why);
        }
        storage = std::move(*text);
        key = storage;
        break;
      }
      case KeySource::Kind::kFingerprint: {
        if (options_.fingerprint == FingerprintMode::kJson) {
          auto fp = FingerprintJson(message.payload);
          if (!fp) return fails(KeyFault::kBadPayload, "payload: " + fp.error().message());
          storage = fp->Hex();
        } else {
          storage = FingerprintBytes(message.payload).Hex();
        }
        key = storage;
        break;
      }
    }
  }
  if (Status valid = ValidateKey(key, options_.max_key_bytes); !valid.ok()) {
    return fails(KeyFault::kBadKey, valid.message());
  }
  return key;
}

Result<Delivered> Receiver::Receive(const Message& message, const Handler& handler) {
  if (!options_status_.ok()) return options_status_;
  const bool versioned = !message.entity.empty() || message.version != 0;
  const bool sequenced = !message.client_id.empty() || message.seq != 0 || message.ack != 0;
  if (versioned && sequenced) {
    return InvalidArgumentError("a message names an entity version or a client's number, not both");
  }
  if (versioned) return RunVersioned(message, handler);
  if (sequenced) return RunSequenced(message, handler);
  auto fp = FingerprintOf(message);
  if (!fp) return fp.error();
  auto key = KeyOf(message);
  if (!key) return key.error();

  if (options_.busy_policy != BusyPolicy::kCoalesce)
    return Run(std::move(*key), *fp, message, handler);

  const std::string name = Flights::FlightName(*key, *fp);
  auto& shard = flights_->ShardOf(name);
  std::shared_ptr<Flights::Flight> flight;
  bool leader = false;
  {
    std::lock_guard lock(shard.mu);
    auto [it, inserted] = shard.by_key.try_emplace(name);
    if (inserted) it->second = std::make_shared<Flights::Flight>();
    flight = it->second;
    leader = inserted;
  }
  if (!leader) {
    std::unique_lock lock(flight->mu);
    bool done = flight->done_cv.wait_for(lock, options_.busy_wait, [&] { return flight->done; });
    // A follower made no Begin: it counts the answer its delivery ends with (metrics.h).
    Metrics* m = options_.metrics;
    if (!done) {
      core::CountBusy(m);
      return Delivered{.delivery = Delivery::kBusy, .key = std::move(*key)};
    }
    Result<Delivered> copy = *flight->result;
    if (copy && (copy->delivery == Delivery::kExecuted || copy->delivery == Delivery::kReplayed)) {
      copy->delivery = Delivery::kCoalesced;
      if (m != nullptr) m->coalesced->Inc();
    } else if (copy && m != nullptr) {
      // The first execution's Busy or Conflict is this delivery's answer too.
      (copy->delivery == Delivery::kBusy ? m->begin_busy : m->begin_conflict)->Inc();
    }
    return copy;
  }
  // However the first execution ends, a throw from the store included, its flight lands: a
  // flight left in the air would make every later caller of the key a follower that waits out
  // busy_wait and answers Busy, for as long as the process lives.
  try {
    Result<Delivered> result = Run(*key, *fp, message, handler);
    flights_->Land(shard, name, *flight, result);
    return result;
  } catch (...) {
    flights_->Land(shard, name, *flight,
                   InternalError("the first execution of this key ended with an exception"));
    throw;
  }
}

void CountBegin(Metrics& m, const Result<BeginAnswer>& answer) {
  if (!answer) {
    // kInvalidArgument: the store refused the request's input (a key over its own limit), an
    // error of the caller's, not the store's.
    if (answer.error().code() != StatusCode::kInvalidArgument) m.store_errors->Inc();
    return;
  }
  std::visit(
      [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, Acquired>) {
          m.begin_acquired->Inc();
          if (a.takeover) m.takeovers->Inc();
        } else if constexpr (std::is_same_v<T, Busy>) {
          m.begin_busy->Inc();
        } else if constexpr (std::is_same_v<T, Replay>) {
          m.begin_replay->Inc();
        } else if constexpr (std::is_same_v<T, Conflict>) {
          m.begin_conflict->Inc();
        } else {
          m.begin_stale->Inc();
        }
      },
      *answer);
}

Result<BeginAnswer> Receiver::TimedBegin(const BeginRequest& req) {
  return core::TimedBegin(store_, req, options_.metrics,
                          options_.busy_policy != BusyPolicy::kReject);
}

Result<Delivered> Receiver::Run(std::string key, const std::optional<Fingerprint>& fp,
                                const Message& message, const Handler& handler) {
  const BeginRequest req{options_.scope, key, fp, options_.lease};
  auto answer = core::BeginWaitingOutBusy(clock_, options_, [&] { return TimedBegin(req); });
  if (!answer) return StoreError(answer.error(), "begin failed; handler not run");
  if (auto* a = std::get_if<Acquired>(&*answer)) {
    return Execute(std::move(key), *a, message, handler);
  }
  if (std::holds_alternative<Busy>(*answer)) {
    return Delivered{.delivery = Delivery::kBusy, .key = std::move(key)};
  }
  return Settled(std::move(key), *answer);
}

Result<Delivered> Receiver::RunVersioned(const Message& message, const Handler& handler) {
  if (message.entity.empty() || message.version == 0) {
    return InvalidArgumentError("a versioned message names an entity and a version above 0");
  }
  const VersionedBeginRequest req{options_.scope, message.entity, message.version, options_.lease};
  auto answer = core::BeginWaitingOutBusy(clock_, options_, [&] {
    return core::TimedBegin(store_, req, options_.metrics,
                            options_.busy_policy != BusyPolicy::kReject);
  });
  const std::string entity(message.entity);
  // The handler's key, and the answer's, names the version, so that a downstream call made with
  // it is one per version.
  std::string version_key = entity + "#" + std::to_string(message.version);
  if (!answer) return StoreError(answer.error(), "begin failed; handler not run");
  const auto* acquired = std::get_if<Acquired>(&*answer);
  if (acquired == nullptr) {
    return Delivered{
        .delivery = std::holds_alternative<Busy>(*answer) ? Delivery::kBusy : Delivery::kStale,
        .key = std::move(version_key)};
  }
  // Entities have no Extend: the lease is not kept, so the handler must end within it.
  HandlerResult result = Invoke(version_key, *acquired, message, handler, /*keeper=*/nullptr);
  const Token token = acquired->token;
  // kRemember: a failure is final here too. The version counts as applied and a redelivery of
  // it is Stale: an entity keeps its highest applied version, not outcomes.
  return Finish(
      version_key, acquired->attempt, std::move(result),
      [&](const HandlerResult&) { return store_.ReleaseVersioned(options_.scope, entity, token); },
      [&](const HandlerResult&, std::chrono::milliseconds retention) {
        return store_.CompleteVersioned({options_.scope, entity, token, retention});
      });
}

Result<Delivered> Receiver::RunSequenced(const Message& message, const Handler& handler) {
  if (message.client_id.empty() || message.seq == 0) {
    return InvalidArgumentError("a client's message names a client id and a number above 0");
  }
  auto fp = FingerprintOf(message);
  if (!fp) return fp.error();
  const SequencedBeginRequest req{options_.scope, message.client_id, message.seq, message.ack, *fp,
                                  options_.lease};
  Metrics* m = options_.metrics;
  auto answer = core::BeginWaitingOutBusy(clock_, options_, [&] {
    Stopwatch sw;
    auto a = store_.BeginSequenced(req);
    if (m == nullptr) return a;
    m->store_begin_seconds->ObserveDuration(sw.Elapsed());
    if (a) {
      if (options_.busy_policy == BusyPolicy::kReject || !std::holds_alternative<Busy>(*a)) {
        CountBegin(*m, a);
      }
    } else if (a.error().code() != StatusCode::kFailedPrecondition &&
               a.error().code() != StatusCode::kResourceExhausted) {
      CountBegin(*m, a);  // (counts a store error; kInvalidArgument is the caller's)
    }
    return a;
  });
  const std::string key = std::string(message.client_id) + "#" + std::to_string(message.seq);
  if (!answer) {
    // An unknown or expired session, a number past the window: the session's answers, passed
    // on as they are, not a store failure.
    const StatusCode code = answer.error().code();
    if (code == StatusCode::kFailedPrecondition || code == StatusCode::kResourceExhausted) {
      return answer.error();
    }
    return StoreError(answer.error(), "begin failed; handler not run");
  }
  const auto* acquired = std::get_if<Acquired>(&*answer);
  if (acquired == nullptr) {
    if (std::holds_alternative<Busy>(*answer)) {
      return Delivered{.delivery = Delivery::kBusy, .key = key};
    }
    return Settled(key, *answer);
  }
  // Sessions have no Extend: the lease is not kept, so the handler must end within it.
  HandlerResult result = Invoke(key, *acquired, message, handler, /*keeper=*/nullptr);
  const Token token = acquired->token;
  return Finish(
      key, acquired->attempt, std::move(result),
      [&](const HandlerResult&) {
        return store_.ReleaseSequenced(options_.scope, message.client_id, message.seq, token);
      },
      [&](const HandlerResult& r, std::chrono::milliseconds) {
        // Kept until the client acknowledges it (or the session expires), not for a retention.
        return store_.CompleteSequenced(
            {options_.scope, message.client_id, message.seq, token, r.outcome, r.response});
      });
}

HandlerResult Receiver::Invoke(std::string_view key, const Acquired& acquired,
                               const Message& message, const Handler& handler,
                               core::LeaseKeeper* keeper) {
  HandlerContext ctx{options_.scope, key, acquired.attempt, acquired.token, message.payload};
  HandlerResult result;
  Stopwatch sw;
  try {
    const core::LeaseHold held(keeper, store_, clock_, options_, key, acquired.token);
    result = handler(ctx);
  } catch (const std::exception& e) {
    result = {Outcome::kFailure, std::string("handler threw: ") + e.what()};
  } catch (...) {
    result = {Outcome::kFailure, "handler threw a non-standard exception"};
  }
  if (options_.metrics != nullptr) options_.metrics->handler_seconds->ObserveDuration(sw.Elapsed());
  return result;
}

Result<Delivered> Receiver::Execute(std::string key, const Acquired& acquired,
                                    const Message& message, const Handler& handler) {
  HandlerResult result = Invoke(key, acquired, message, handler, keeper_.get());
  const Token token = acquired.token;
  return Finish(
      key, acquired.attempt, std::move(result),
      [&](const HandlerResult&) { return store_.Release(options_.scope, key, token); },
      [&](const HandlerResult& r, std::chrono::milliseconds retention) {
        return store_.Complete({options_.scope, key, token, r.outcome, r.response, retention});
      });
}

Result<Delivered> Receiver::Finish(std::string_view key, std::uint32_t attempt,
                                   HandlerResult result, const Release& release,
                                   const Complete& complete) {
  Metrics* m = options_.metrics;
  Delivered out{.delivery = Delivery::kExecuted,
                .key = std::string(key),
                .outcome = result.outcome,
                .response = {},
                .attempt = attempt};
  // The handler ran: a write the store did not answer would keep the key IN_PROGRESS until its
  // lease ends, and the next delivery would run the handler again. So it is tried again, as the
  // consumer and the gateway do. Writes are fenced by the token: after a try that failed
  // mid-way, "not yours" most likely means that try landed.
  // Each store call is timed on its own (`seconds`), without the pauses between tries.
  const auto tried = [&](Histogram* Metrics::*seconds, const auto& write) {
    const auto timed = [&] {
      Stopwatch sw;
      Result<WriteAnswer> w = write();
      if (m != nullptr) (m->*seconds)->ObserveDuration(sw.Elapsed());
      return w;
    };
    Result<WriteAnswer> w = timed();
    // kInvalidArgument: the store refuses the write itself (a response over its limit), and
    // would again.
    for (int t = 1; t < kWriteTries && !w && w.error().code() != StatusCode::kInvalidArgument;
         ++t) {
      if (m != nullptr) m->store_errors->Inc();
      clock_.SleepFor(kWriteRetryPause * t);
      w = timed();
      if (w && *w == WriteAnswer::kLeaseLost) w = WriteAnswer::kApplied;
    }
    return w;
  };
  Result<WriteAnswer> written = WriteAnswer::kApplied;
  if (result.outcome == Outcome::kFailure && options_.failure_policy == FailurePolicy::kRelease) {
    written = tried(&Metrics::store_release_seconds, [&] { return release(result); });
    out.released = true;
    if (written && *written == WriteAnswer::kApplied && m != nullptr) m->releases->Inc();
  } else {
    written = tried(&Metrics::store_complete_seconds, [&] {
      return complete(result, result.outcome == Outcome::kSuccess ? options_.retention
                                                                  : options_.failure_retention);
    });
    if (m != nullptr && written && *written == WriteAnswer::kApplied) {
      (result.outcome == Outcome::kSuccess ? m->complete_success : m->complete_failure)->Inc();
    }
    if (!written && written.error().code() == StatusCode::kInvalidArgument) {
      // The store will never take this outcome, and releasing the key would run the handler
      // again: a failure that says why is stored in its place, for duplicates to replay.
      const Status refused = written.error();
      const HandlerResult in_place{Outcome::kFailure, core::RefusedOutcomeText(result, refused)};
      written = tried(&Metrics::store_complete_seconds,
                      [&] { return complete(in_place, options_.failure_retention); });
      if (written && *written == WriteAnswer::kApplied) {
        if (m != nullptr) m->complete_failure->Inc();
        return FailedPreconditionError(
            "handler ran (attempt " + std::to_string(attempt) +
            ") but the store refused its outcome (" + refused.message() +
            "); a failure saying so was stored instead, which duplicates replay: the handler "
            "will not run again for this key");
      }
    }
  }
  if (!written) {
    if (written.error().code() == StatusCode::kInvalidArgument) {
      return FailedPreconditionError(
          "handler ran but the store refused its outcome: " + written.error().message() +
          "; the key stays in progress until its lease ends");
    }
    if (m != nullptr) m->store_errors->Inc();
    return StoreError(written.error(), "handler ran but its outcome could not be stored");
  }
  if (*written == WriteAnswer::kLeaseLost) {
    if (m != nullptr) m->lease_lost->Inc();
    return AbortedError("handler ran but the lease on key was lost to a newer worker (attempt " +
                        std::to_string(attempt) + ")");
  }
  out.response = std::move(result.response);
  return out;
}

}  // namespace idem
