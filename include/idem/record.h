// The record contract (SPEC §2, §4, §5): what a store keeps and what it answers.
#ifndef IDEM_RECORD_H_
#define IDEM_RECORD_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "idem/clock.h"
#include "idem/fingerprint.h"

namespace idem {

enum class RecordState : std::uint8_t { kInProgress = 1, kCompleted = 2 };
enum class Outcome : std::uint8_t { kSuccess = 0, kFailure = 1 };

std::string_view RecordStateName(RecordState s);  // "in_progress", "completed"
std::string_view OutcomeName(Outcome o);          // "success", "failure"

// A fencing token: larger than any token handed out for the same key before.
using Token = std::uint64_t;

// What a store holds for (scope, key). Operator calls return it.
struct Record {
  std::string scope{};
  std::string key{};
  RecordState state = RecordState::kInProgress;
  std::optional<Fingerprint> fingerprint{};
  Token token = 0;
  std::uint32_t attempt = 0;
  Timestamp created{};
  Timestamp lease_deadline{};           // kInProgress: when another worker may take over.
  Timestamp expires{};                  // When the record behaves as absent and may be reclaimed.
  Outcome outcome = Outcome::kSuccess;  // kCompleted only.
  std::string response{};               // kCompleted only.
};

// ---- begin -------------------------------------------------------------------------------

struct BeginRequest {
  std::string_view scope{};
  std::string_view key{};
  std::optional<Fingerprint> fingerprint{};
  std::chrono::milliseconds lease{30'000};
};

// The caller owns the key until it completes, releases or loses the lease.
// `attempt` counts the runs of this key (of this version, for a versioned entity): > 1 means a
// takeover of an earlier worker's run whose lease ran out. The count stops at 65535 on the
// memory and log stores, at 2^32 - 1 on Redis and PostgreSQL.
// `takeover`: an earlier worker held the key (the entity) and its lease ran out. That is every
// attempt > 1, and also a versioned begin of another version than the one whose lease ran out,
// which starts at attempt 1.
struct Acquired {
  Token token = 0;
  std::uint32_t attempt = 1;
  Timestamp lease_deadline{};
  bool takeover = false;
};
// Another worker holds the key; its lease runs until `lease_deadline`.
struct Busy {
  Timestamp lease_deadline{};
};
// The key is finished; here is its stored outcome. The handler must not run.
struct Replay {
  Outcome outcome = Outcome::kSuccess;
  std::string response{};
  std::uint32_t attempt = 1;
};
// The key was used before for a request with a different fingerprint.
struct Conflict {};
// Sessions and versions only: the request is at or below what was already acknowledged or
// applied. Never executed again.
struct Stale {};

using BeginAnswer = std::variant<Acquired, Busy, Replay, Conflict, Stale>;

// "acquired", "busy", "replay", "conflict", "stale".
std::string_view BeginAnswerName(const BeginAnswer& a);

// ---- complete / release / extend ------------------------------------------------------------

struct CompleteRequest {
  std::string_view scope{};
  std::string_view key{};
  Token token = 0;
  Outcome outcome = Outcome::kSuccess;
  std::string_view response{};
  std::chrono::milliseconds retention{24 * 3600 * 1000};
};

// One Extend of a batch (Store::ExtendBatch): pushes the lease deadline of IN_PROGRESS with
// that token to now + lease.
struct ExtendRequest {
  std::string_view scope{};
  std::string_view key{};
  Token token = 0;
  std::chrono::milliseconds lease{30'000};
};

// kApplied: the change was made. kLeaseLost: the token is not the record's current one (or
// the record is gone); nothing changed, and a newer worker may own the key.
enum class WriteAnswer : std::uint8_t { kApplied = 0, kLeaseLost = 1 };
std::string_view WriteAnswerName(WriteAnswer a);  // "applied", "lease_lost"

// ---- client sessions (SPEC §4) --------------------------------------------------------------

struct SessionRequest {
  std::string_view scope{};
  std::string_view client_id{};
  std::chrono::milliseconds ttl{24 * 3600 * 1000};  // idle time after which it expires
  std::uint32_t window = 1024;                      // max outstanding numbers above low water
};

struct SessionInfo {
  std::string scope{};
  std::string client_id{};
  std::uint64_t low_water = 0;  // highest acknowledged number
  std::uint32_t window = 0;
  std::uint32_t outstanding = 0;  // records held above low water
  Timestamp expires{};
};

// Request `seq` (1, 2, 3, ...) of a client. `ack`, when non-zero, acknowledges every number
// at or below it first (their records are dropped).
struct SequencedBeginRequest {
  std::string_view scope{};
  std::string_view client_id{};
  std::uint64_t seq = 0;
  std::uint64_t ack = 0;
  std::optional<Fingerprint> fingerprint{};
  std::chrono::milliseconds lease{30'000};
};

struct SequencedCompleteRequest {
  std::string_view scope{};
  std::string_view client_id{};
  std::uint64_t seq = 0;
  Token token = 0;
  Outcome outcome = Outcome::kSuccess;
  std::string_view response{};
};

// ---- versioned entities (SPEC §5) ------------------------------------------------------------

struct VersionedBeginRequest {
  std::string_view scope{};
  std::string_view entity{};
  std::uint64_t version = 0;
  std::chrono::milliseconds lease{30'000};
};

struct VersionedCompleteRequest {
  std::string_view scope{};
  std::string_view entity{};
  Token token = 0;
  // How long the entity's highest applied version is remembered after this completion.
  std::chrono::milliseconds retention{7 * 24 * 3600 * 1000LL};
};

struct EntityVersion {
  std::string scope{};
  std::string entity{};
  std::uint64_t applied = 0;  // highest applied version (0: none yet)
  std::optional<std::uint64_t> in_progress{};
  Token token = 0;
  std::uint32_t attempt = 0;
  Timestamp lease_deadline{};
  Timestamp expires{};
};

}  // namespace idem

#endif  // IDEM_RECORD_H_
