#include "core/machine.h"

#include <string>

#include "idem/key.h"

namespace idem::core {
namespace {

std::uint32_t NextAttempt(std::uint32_t a) { return a >= kMaxAttempt ? kMaxAttempt : a + 1; }

bool Owns(const RecordHead* h, Token token, Timestamp now) {
  return h != nullptr && IsLive(*h, now) && h->state == RecordState::kInProgress &&
         h->token == token;
}

bool EntityLive(const EntityHead* e, Timestamp now) { return e != nullptr && now < e->expires; }

}  // namespace

BeginDecision DecideBegin(const RecordHead* current, const Fingerprint* stored_fp,
                          const Fingerprint* request_fp, std::chrono::milliseconds lease,
                          Timestamp now, Token fresh_token,
                          std::chrono::milliseconds abandoned_retention) {
  if (current == nullptr || !IsLive(*current, now)) {
    RecordHead next;
    next.state = RecordState::kInProgress;
    next.token = fresh_token;
    next.attempt = 1;
    next.created = now;
    next.lease_deadline = now + lease;
    next.expires = next.lease_deadline + abandoned_retention;
    return {BeginKind::kAcquired, next, false};
  }
  if (stored_fp != nullptr && request_fp != nullptr && !(*stored_fp == *request_fp)) {
    return {BeginKind::kConflict, *current, false};
  }
  if (current->state == RecordState::kCompleted) return {BeginKind::kReplay, *current, false};
  if (now < current->lease_deadline) return {BeginKind::kBusy, *current, false};
  // Takeover: the previous worker's lease ran out.
  RecordHead next = *current;
  next.token = fresh_token;
  next.attempt = NextAttempt(current->attempt);
  next.lease_deadline = now + lease;
  next.expires = next.lease_deadline + abandoned_retention;
  return {BeginKind::kAcquired, next, true};
}

WriteDecision DecideComplete(const RecordHead* current, Token token, Outcome outcome,
                             std::chrono::milliseconds retention, Timestamp now) {
  if (!Owns(current, token, now)) return {WriteAnswer::kLeaseLost, {}};
  RecordHead next = *current;
  next.state = RecordState::kCompleted;
  next.outcome = outcome;
  next.expires = now + retention;
  return {WriteAnswer::kApplied, next};
}

WriteAnswer DecideRelease(const RecordHead* current, Token token, Timestamp now) {
  return Owns(current, token, now) ? WriteAnswer::kApplied : WriteAnswer::kLeaseLost;
}

WriteDecision DecideExtend(const RecordHead* current, Token token, std::chrono::milliseconds lease,
                           Timestamp now, std::chrono::milliseconds abandoned_retention) {
  if (!Owns(current, token, now)) return {WriteAnswer::kLeaseLost, {}};
  RecordHead next = *current;
  next.lease_deadline = now + lease;
  next.expires = next.lease_deadline + abandoned_retention;
  return {WriteAnswer::kApplied, next};
}

SessionDecision DecideSequenced(const SessionHead* session, std::uint64_t seq, std::uint64_t ack,
                                Timestamp now) {
  if (session == nullptr || now >= session->expires) return {SessionGate::kUnknown, {}, 0};
  SessionHead next = *session;
  next.expires = now + session->ttl;
  std::uint64_t drop_through = 0;
  if (ack > next.low_water) {
    next.low_water = ack;
    drop_through = ack;
  }
  if (seq <= next.low_water) return {SessionGate::kStale, next, drop_through};
  if (seq - next.low_water > next.window) return {SessionGate::kWindowFull, *session, 0};
  return {SessionGate::kProceed, next, drop_through};
}

VersionDecision DecideVersioned(const EntityHead* current, std::uint64_t version,
                                std::chrono::milliseconds lease, Timestamp now, Token fresh_token,
                                std::chrono::milliseconds abandoned_retention) {
  EntityHead next;
  if (EntityLive(current, now)) next = *current;
  if (version <= next.applied) return {VersionKind::kStale, next, false};
  bool takeover = false;
  if (next.in_progress != 0) {
    if (now < next.lease_deadline) return {VersionKind::kBusy, next, false};
    takeover = true;
  }
  next.attempt = (takeover && next.in_progress == version) ? NextAttempt(next.attempt) : 1;
  next.in_progress = version;
  next.token = fresh_token;
  next.lease_deadline = now + lease;
  Timestamp hold = next.lease_deadline + abandoned_retention;
  if (next.expires < hold) next.expires = hold;
  return {VersionKind::kAcquired, next, takeover};
}

EntityWrite DecideCompleteVersioned(const EntityHead* current, Token token,
                                    std::chrono::milliseconds retention, Timestamp now) {
  if (!EntityLive(current, now) || current->in_progress == 0 || current->token != token) {
    return {WriteAnswer::kLeaseLost, {}};
  }
  EntityHead next = *current;
  next.applied = current->in_progress;
  next.in_progress = 0;
  next.expires = now + retention;
  return {WriteAnswer::kApplied, next};
}

EntityWrite DecideReleaseVersioned(const EntityHead* current, Token token, Timestamp now) {
  if (!EntityLive(current, now) || current->in_progress == 0 || current->token != token) {
    return {WriteAnswer::kLeaseLost, {}};
  }
  EntityHead next = *current;
  next.in_progress = 0;
  return {WriteAnswer::kApplied, next};
}

// ---- input checks ----

namespace {
Status CheckDuration(std::string_view what, std::chrono::milliseconds d) {
  if (d.count() <= 0) {
    return InvalidArgumentError(std::string(what) + " must be positive, got " +
                                std::to_string(d.count()) + "ms");
  }
  if (d > kMaxDuration) {
    return InvalidArgumentError(std::string(what) + " of " + std::to_string(d.count()) +
                                "ms is over the limit of " + std::string(kMaxDurationText));
  }
  return OkStatus();
}
}  // namespace

Status CheckLease(std::chrono::milliseconds lease) { return CheckDuration("lease", lease); }

Status CheckAbandonedRetention(std::chrono::milliseconds d) {
  return CheckDuration("abandoned_retention", d);
}

Status CheckRetention(std::chrono::milliseconds retention) {
  return CheckDuration("retention", retention);
}

Status CheckRecordId(std::string_view scope, std::string_view key, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(ValidateScope(scope));
  return ValidateKey(key, max_key_bytes);
}

Status BeginError(const BeginRequest& r, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(CheckRecordId(r.scope, r.key, max_key_bytes));
  return CheckLease(r.lease);
}

Status CompleteError(const CompleteRequest& r, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(CheckRecordId(r.scope, r.key, max_key_bytes));
  return CheckRetention(r.retention);
}

namespace {
Status CheckClient(std::string_view scope, std::string_view client_id, std::size_t max) {
  IDEM_RETURN_IF_ERROR(ValidateScope(scope));
  if (client_id.empty()) return InvalidArgumentError("client id is empty");
  if (client_id.size() > max) {
    return InvalidArgumentError("client id is " + std::to_string(client_id.size()) +
                                " bytes; the limit is " + std::to_string(max));
  }
  return OkStatus();
}
}  // namespace

Status CheckSession(const SessionRequest& r, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(CheckClient(r.scope, r.client_id, max_key_bytes));
  IDEM_RETURN_IF_ERROR(CheckDuration("session ttl", r.ttl));
  if (r.window == 0) return InvalidArgumentError("session window must be at least 1");
  return OkStatus();
}

Status CheckSequenced(const SequencedBeginRequest& r, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(CheckClient(r.scope, r.client_id, max_key_bytes));
  if (r.seq == 0) return InvalidArgumentError("sequence number 0: numbers start at 1");
  if (r.ack >= r.seq) {
    // It would drop the request's own record and answer it Stale, never having run it.
    return InvalidArgumentError("acknowledgement " + std::to_string(r.ack) +
                                " is not below the request's own number " + std::to_string(r.seq) +
                                ": a client acknowledges only responses it has received");
  }
  return CheckLease(r.lease);
}

Status CheckVersioned(const VersionedBeginRequest& r, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(ValidateScope(r.scope));
  if (r.entity.empty()) return InvalidArgumentError("entity is empty");
  if (r.entity.size() > max_key_bytes) {
    return InvalidArgumentError("entity is " + std::to_string(r.entity.size()) +
                                " bytes; the limit is " + std::to_string(max_key_bytes));
  }
  if (r.version == 0) return InvalidArgumentError("version 0: versions start at 1");
  return CheckLease(r.lease);
}

}  // namespace idem::core
