// Store: where records live. Every store (memory, log, Redis, PostgreSQL) obeys this contract,
// and src/stores/store_contract_suite.cc runs the same suite against each of them.
//
// Contract (SPEC §2):
// - Every call is atomic per (scope, key): two concurrent Begins for one key never both get
//   Acquired while a lease runs.
// - A store that cannot decide returns a non-ok Status (kUnavailable for I/O and timeouts);
//   it never guesses. Malformed input is kInvalidArgument and changes nothing.
// - Time comes from the Clock the store was built with.
// - Thread-safe: any number of threads may call any method concurrently.
#ifndef IDEM_STORE_H_
#define IDEM_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/record.h"
#include "idem/status.h"

namespace idem {

struct ListFilter {
  std::optional<RecordState> state{};
  std::optional<std::string> scope{};
  // Only records created before this time ("IN_PROGRESS older than X").
  std::optional<Timestamp> created_before{};
  std::size_t limit = 1000;
};

// Counts of what the store holds. Records, sessions and entities that expired count until the
// reaper (or Purge) reclaims them, at most reclaim_interval later where the store has one.
struct StoreStats {
  std::uint64_t in_progress = 0;
  std::uint64_t completed = 0;
  std::uint64_t sessions = 0;
  std::uint64_t entities = 0;
  std::uint64_t bytes = 0;  // memory or disk the store uses for records, best estimate
};

// The answers of Store::StartBatch.
struct BatchAnswers {
  std::vector<Result<BeginAnswer>> begins;
  std::vector<Result<WriteAnswer>> completes;
};

class Store {
 public:
  virtual ~Store() = default;
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // A short name for logs and metrics labels: "memory", "log", "redis", "postgres".
  virtual std::string_view Name() const = 0;

  // Not ok when the store has failed for good: it answers nothing until it is opened again.
  // The log store after a full disk or an I/O error is so (it cannot know what its memory holds
  // that the disk does not without replaying its files); a store whose server is down is not
  // (it comes back by itself). A process serving such a store should restart: idemd's /healthz
  // answers 503 with this message. Cheap; never blocks. Default: ok.
  virtual Status Broken() const;

  // Ok when the store can answer now, writes included: what a readiness probe asks (idemd's
  // /readyz). May wait for the store's own timeouts. Default: a read of a key that never exists.
  // The PostgreSQL store also refuses a database that would refuse writes (a standby, or
  // default_transaction_read_only).
  virtual Status Ready();

  // ---- records (SPEC §2) ----
  virtual Result<BeginAnswer> Begin(const BeginRequest& req) = 0;
  // IN_PROGRESS with that token -> COMPLETED, kept for `retention`.
  virtual Result<WriteAnswer> Complete(const CompleteRequest& req) = 0;
  // IN_PROGRESS with that token -> absent, so a retry runs again.
  virtual Result<WriteAnswer> Release(std::string_view scope, std::string_view key,
                                      Token token) = 0;
  // Pushes the lease deadline of IN_PROGRESS with that token to now + lease.
  virtual Result<WriteAnswer> Extend(std::string_view scope, std::string_view key, Token token,
                                     std::chrono::milliseconds lease) = 0;

  // Batches: one answer per request, in order. A shared store does a batch in one round trip.
  // The default runs the requests one by one.
  virtual std::vector<Result<BeginAnswer>> BeginBatch(std::span<const BeginRequest> reqs);
  virtual std::vector<Result<WriteAnswer>> CompleteBatch(std::span<const CompleteRequest> reqs);
  // Extends in one call (a consumer keeping a whole batch's leases): one round trip for a
  // shared store, one group commit for the log store.
  virtual std::vector<Result<WriteAnswer>> ExtendBatch(std::span<const ExtendRequest> reqs);
  // Both batch forms in one call, for callers that must not block (an event loop). The
  // answers are those of CompleteBatch(completes) followed by BeginBatch(begins) (finish what
  // is done, then start what is new: a begin of a key completed in the same call replays it),
  // and the two share one group commit where the store has one. The requests are read before
  // StartBatch returns; `done` gets the answers once they may be given (for a durable store: once
  // the changes behind them are durable), exactly once, on any thread, possibly before StartBatch
  // returns. It must not block: hand the answers over and return. A store whose calls would
  // block the caller (on a network round trip) returns false without calling `done`; the
  // caller then uses the blocking calls on threads of its own. The default returns false.
  virtual bool StartBatch(std::span<const BeginRequest> begins,
                          std::span<const CompleteRequest> completes,
                          std::function<void(BatchAnswers)> done);

  // ---- operator calls ----
  // The live record, or nullopt when absent or expired.
  virtual Result<std::optional<Record>> Get(std::string_view scope, std::string_view key) = 0;
  // Live records matching the filter, at most filter.limit, in no particular order.
  virtual Result<std::vector<Record>> List(const ListFilter& filter) = 0;
  // Removes the record whatever its state; true if there was a live one.
  virtual Result<bool> Erase(std::string_view scope, std::string_view key) = 0;
  virtual Result<StoreStats> Stats() = 0;
  // Reclaims now every record whose retention is over (the background reaper does the same
  // in small steps); returns how many were reclaimed.
  virtual Result<std::uint64_t> Purge() = 0;

  // ---- client sessions (SPEC §4) ----
  // Registers the session, or refreshes its expiry (and window) if it exists.
  virtual Result<SessionInfo> OpenSession(const SessionRequest& req) = 0;
  // seq 0 -> kInvalidArgument. Unknown or expired session -> kFailedPrecondition.
  // seq <= low water -> Stale. seq > low water + window -> kResourceExhausted.
  // Otherwise answers as Begin does for that number's record. The request's `ack` is applied
  // first (so it may make room for seq), except when the request is refused: a refused request
  // changes nothing, its ack included; the client's next request carries the ack again.
  virtual Result<BeginAnswer> BeginSequenced(const SequencedBeginRequest& req) = 0;
  // The record is kept until acknowledged or until the session expires.
  virtual Result<WriteAnswer> CompleteSequenced(const SequencedCompleteRequest& req) = 0;
  virtual Result<WriteAnswer> ReleaseSequenced(std::string_view scope, std::string_view client_id,
                                               std::uint64_t seq, Token token) = 0;
  // Drops every record at or below `ack` and raises the low-water mark.
  virtual Result<SessionInfo> Acknowledge(std::string_view scope, std::string_view client_id,
                                          std::uint64_t ack) = 0;

  // ---- versioned entities (SPEC §5) ----
  // version 0 -> kInvalidArgument. version <= applied -> Stale. Another version in progress
  // with a running lease -> Busy. Otherwise Acquired (a takeover if the lease ran out).
  virtual Result<BeginAnswer> BeginVersioned(const VersionedBeginRequest& req) = 0;
  // Raises the applied version to the one in progress under that token.
  virtual Result<WriteAnswer> CompleteVersioned(const VersionedCompleteRequest& req) = 0;
  virtual Result<WriteAnswer> ReleaseVersioned(std::string_view scope, std::string_view entity,
                                               Token token) = 0;
  virtual Result<std::optional<EntityVersion>> GetVersion(std::string_view scope,
                                                          std::string_view entity) = 0;
};

}  // namespace idem

#endif  // IDEM_STORE_H_
