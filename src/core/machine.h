// The record state machine (SPEC §2, §4, §5) as pure functions over (record, request, now).
// Every store decides with these and only stores what they return, so stores cannot drift.
// No I/O, no clocks, no allocation.
#ifndef IDEM_CORE_MACHINE_H_
#define IDEM_CORE_MACHINE_H_

#include <chrono>
#include <cstdint>
#include <string_view>

#include "idem/key.h"
#include "idem/record.h"
#include "idem/status.h"

namespace idem::core {

// The fixed-size part of a record: what decisions read and write. The fingerprint, key and
// response bytes stay with the store.
struct RecordHead {
  RecordState state = RecordState::kInProgress;
  Outcome outcome = Outcome::kSuccess;
  Token token = 0;
  std::uint32_t attempt = 0;
  Timestamp created;
  Timestamp lease_deadline;
  Timestamp expires;
};

// A record past its expiry behaves as absent.
inline bool IsLive(const RecordHead& h, Timestamp now) { return now < h.expires; }

enum class BeginKind : std::uint8_t { kAcquired, kBusy, kReplay, kConflict };

struct BeginDecision {
  BeginKind kind;
  // kAcquired: the record to store. Otherwise the current record, unchanged.
  RecordHead next;
  bool takeover = false;  // kAcquired over an IN_PROGRESS record whose lease ran out.
};

// `current` is null when the store holds nothing. `stored_fp`/`request_fp` are null when
// absent. `fresh_token` must exceed every token handed out for this key before; it is used
// only when the answer is kAcquired. An acquired record is kept until its lease deadline plus
// `abandoned_retention`, so a takeover after a crash still sees attempt+1.
BeginDecision DecideBegin(const RecordHead* current, const Fingerprint* stored_fp,
                          const Fingerprint* request_fp, std::chrono::milliseconds lease,
                          Timestamp now, Token fresh_token,
                          std::chrono::milliseconds abandoned_retention);

struct WriteDecision {
  WriteAnswer answer;
  RecordHead next;  // kApplied for Complete/Extend: the record to store.
};

// IN_PROGRESS, live, same token -> COMPLETED until now + retention. Else kLeaseLost.
WriteDecision DecideComplete(const RecordHead* current, Token token, Outcome outcome,
                             std::chrono::milliseconds retention, Timestamp now);
// IN_PROGRESS, live, same token -> kApplied (the store erases the record). Else kLeaseLost.
WriteAnswer DecideRelease(const RecordHead* current, Token token, Timestamp now);
// IN_PROGRESS, live, same token -> lease deadline now + lease. Else kLeaseLost.
WriteDecision DecideExtend(const RecordHead* current, Token token, std::chrono::milliseconds lease,
                           Timestamp now, std::chrono::milliseconds abandoned_retention);

// ---- sessions (SPEC §4) ----

struct SessionHead {
  std::uint64_t low_water = 0;
  std::uint32_t window = 0;
  std::chrono::milliseconds ttl{0};
  Timestamp expires;
};

enum class SessionGate : std::uint8_t {
  kProceed,     // answer with the record of `seq`
  kStale,       // seq <= low water
  kUnknown,     // no session, or it expired
  kWindowFull,  // seq > low water + window
};

struct SessionDecision {
  SessionGate gate;
  // kProceed/kStale: the session to store (low water raised by `ack`, expiry refreshed).
  SessionHead next;
  // Records at or below this number (and above the old low water) must be dropped.
  std::uint64_t drop_through = 0;
};

SessionDecision DecideSequenced(const SessionHead* session, std::uint64_t seq, std::uint64_t ack,
                                Timestamp now);

// ---- versioned entities (SPEC §5) ----

struct EntityHead {
  std::uint64_t applied = 0;
  std::uint64_t in_progress = 0;  // 0: none
  Token token = 0;
  std::uint32_t attempt = 0;
  Timestamp lease_deadline;
  Timestamp expires;
};

enum class VersionKind : std::uint8_t { kAcquired, kBusy, kStale };

struct VersionDecision {
  VersionKind kind;
  EntityHead next;  // kAcquired: the entity to store.
  bool takeover = false;
};

VersionDecision DecideVersioned(const EntityHead* current, std::uint64_t version,
                                std::chrono::milliseconds lease, Timestamp now, Token fresh_token,
                                std::chrono::milliseconds abandoned_retention);
struct EntityWrite {
  WriteAnswer answer;
  EntityHead next;  // kApplied: the entity to store.
};

// In progress under `token` -> applied = that version, remembered until now + retention.
EntityWrite DecideCompleteVersioned(const EntityHead* current, Token token,
                                    std::chrono::milliseconds retention, Timestamp now);
// In progress under `token` -> nothing in progress (the applied version stays).
EntityWrite DecideReleaseVersioned(const EntityHead* current, Token token, Timestamp now);

// The attempt count a takeover stops raising: the memory store (and so the log store) keeps it
// in 16 bits. A key taken over this often is stuck, not retried. (Redis and PostgreSQL count to
// 2^32 - 1 in scripts of their own.)
inline constexpr std::uint32_t kMaxAttempt = 0xFFFF;

// ---- input checks shared by every store ----

// The longest lease or retention a store accepts. The memory store (and so the log store)
// keeps deadlines as 40-bit millisecond offsets (about 17 years, slot_pool.h): a longer one
// would be cut short silently, forgetting a record early. Longer ones are mistakes anyway.
inline constexpr std::chrono::milliseconds kMaxDuration{10LL * 366 * 24 * 3600 * 1000};
inline constexpr std::string_view kMaxDurationText = "10 years";

// Every call checks its input, so the common case (all in range) is decided inline and the
// error, with its message, is built out of line.
inline bool RecordIdInRange(std::string_view scope, std::string_view key,
                            std::size_t max_key_bytes) {
  return scope.size() <= kMaxScopeBytes && !key.empty() && key.size() <= max_key_bytes;
}
inline bool DurationInRange(std::chrono::milliseconds d) {
  return d.count() > 0 && d <= kMaxDuration;
}
Status BeginError(const BeginRequest& r, std::size_t max_key_bytes);
Status CompleteError(const CompleteRequest& r, std::size_t max_key_bytes);

inline Status CheckBegin(const BeginRequest& r, std::size_t max_key_bytes) {
  if (RecordIdInRange(r.scope, r.key, max_key_bytes) && DurationInRange(r.lease)) [[likely]] {
    return OkStatus();
  }
  return BeginError(r, max_key_bytes);
}
inline Status CheckComplete(const CompleteRequest& r, std::size_t max_key_bytes) {
  if (RecordIdInRange(r.scope, r.key, max_key_bytes) && DurationInRange(r.retention)) [[likely]] {
    return OkStatus();
  }
  return CompleteError(r, max_key_bytes);
}
Status CheckRecordId(std::string_view scope, std::string_view key, std::size_t max_key_bytes);
Status CheckLease(std::chrono::milliseconds lease);
inline Status CheckExtend(const ExtendRequest& r, std::size_t max_key_bytes) {
  IDEM_RETURN_IF_ERROR(CheckRecordId(r.scope, r.key, max_key_bytes));
  return CheckLease(r.lease);
}
Status CheckRetention(std::chrono::milliseconds retention);
// A store's abandoned_retention option: above 0, at most kMaxDuration.
Status CheckAbandonedRetention(std::chrono::milliseconds d);
Status CheckSession(const SessionRequest& r, std::size_t max_key_bytes);
Status CheckSequenced(const SequencedBeginRequest& r, std::size_t max_key_bytes);
Status CheckVersioned(const VersionedBeginRequest& r, std::size_t max_key_bytes);

}  // namespace idem::core

#endif  // IDEM_CORE_MACHINE_H_
