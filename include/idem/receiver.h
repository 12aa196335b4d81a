// Receiver: the gate in front of a handler (SPEC §3). It takes a message's key, reserves it in
// the store, runs the handler once, stores the outcome, and answers duplicates with it.
//
//   idem::Receiver receiver(*store, {.scope = "payments"});
//   auto r = receiver.Receive({.key = msg.id, .payload = msg.body},
//                             [&](const idem::HandlerContext& c) -> idem::HandlerResult {
//                               return {idem::Outcome::kSuccess, Charge(c.key, c.attempt)};
//                             });
//   if (!r) { /* kInvalidArgument: bad input, dead-letter it; else: do not ack, retry later */ }
//   else if (r->released) { /* the handler failed and its key was released: retry later */ }
//
// Answers (Delivered::delivery): kExecuted (the handler ran here), kReplayed (stored outcome),
// kCoalesced (a concurrent duplicate in this process waited for the first execution and got its
// outcome), kBusy (another worker holds the key: retry later), kConflict (key reused for a
// different payload), kStale (a versioned message at or below its entity's applied version:
// drop it; see Message::entity). A non-ok Result means "could not decide" and nothing may be
// acknowledged to the transport: kInvalidArgument (bad key, bad JSON), kUnavailable (the store
// failed; the handler did not run — or it ran and its outcome could not be stored, and a later
// delivery will run it again after the lease with attempt+1), kAborted (the handler ran but its
// lease was lost to a newer worker, which owns the outcome), kFailedPrecondition (the handler
// ran but the store refused its outcome, e.g. a response over the store's limit: a failure
// saying so is stored in its place, which duplicates replay, so the handler does not run again).
//
// Thread-safe. The store, clock and metrics must outlive the receiver (and every Receive still
// running). A handler must not Receive its own key: that answers Busy (at once with kReject,
// after busy_wait with kWait and kCoalesce).
#ifndef IDEM_RECEIVER_H_
#define IDEM_RECEIVER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/metrics.h"
#include "idem/record.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {
namespace core {
class LeaseKeeper;
}  // namespace core

enum class BusyPolicy : std::uint8_t {
  kReject,    // answer kBusy at once
  kWait,      // poll the store until the outcome is there or busy_wait runs out
  kCoalesce,  // duplicates in this process wait for the first execution (up to busy_wait of
              // real time, not the Clock's); others as kWait
};
enum class FailurePolicy : std::uint8_t {
  kRelease,   // a failed handler releases the key: the next delivery runs again (default)
  kRemember,  // a failure is final: stored with failure_retention and replayed
};
enum class FingerprintMode : std::uint8_t { kNone, kBytes, kJson };

// Where the key comes from when Message::key is empty.
struct KeySource {
  enum class Kind : std::uint8_t { kExplicit, kHeader, kJsonPointer, kFingerprint };
  Kind kind = Kind::kExplicit;
  std::string name{};  // header name (case-insensitive) or JSON pointer

  static KeySource Explicit() { return {}; }
  static KeySource Header(std::string name) { return {Kind::kHeader, std::move(name)}; }
  static KeySource JsonPointer(std::string ptr) { return {Kind::kJsonPointer, std::move(ptr)}; }
  // The hex fingerprint of the payload (per fingerprint mode; kBytes when kNone).
  static KeySource Fingerprint() { return {Kind::kFingerprint, {}}; }
};

using Header = std::pair<std::string_view, std::string_view>;

struct Message {
  std::string_view key{};  // when non-empty, the key; else taken per ReceiverOptions::key_source
  std::string_view payload{};
  std::span<const Header> headers{};
  // A message that names an entity and a version (SPEC §5) is gated by the entity's versions
  // instead of a key: it runs only if its version is above the highest applied one (else
  // kStale, counted), one version of an entity at a time (else Busy, per busy_policy;
  // kCoalesce waits as kWait). Success, or a failure under kRemember, applies the version; a
  // failure under kRelease lets a redelivery run again. The handler's key is "ENTITY#VERSION".
  // Entities have no lease extension: the handler must end within `lease`, or another worker
  // may take the version over.
  std::string_view entity{};
  std::uint64_t version = 0;  // above 0 when entity is given
  // A message of a client session (SPEC §4) is gated by the client's numbers instead of a key:
  // request `seq` (1, 2, 3, ...) of `client_id`, whose session the caller opened with
  // Store::OpenSession, acknowledging every number up to `ack` (0: none) first. It runs once;
  // its outcome is replayed to a duplicate until the client acknowledges it (whatever
  // `retention`); a number at or below the acknowledged one is kStale. An unknown or expired
  // session is kFailedPrecondition (open it again), a number past the window
  // kResourceExhausted: both errors, never an execution. Busy follows busy_policy (kCoalesce
  // waits as kWait); the fingerprint, when configured, makes a reused number with another
  // payload a kConflict. The handler's key is "CLIENT#SEQ". Sessions have no lease
  // extension: the handler must end within `lease`.
  std::string_view client_id{};
  std::uint64_t seq = 0;
  std::uint64_t ack = 0;
};

struct ReceiverOptions {
  std::string scope{};
  std::chrono::milliseconds lease{30'000};
  // While a handler runs, a thread of the receiver's own extends its lease once half of it is
  // gone (it checks every lease / 8), so a handler may run longer than the lease: the key is
  // taken over only if this process stops extending it (it died, or the store did not
  // answer). false: a handler that outlives its lease may be run by another worker too.
  bool keep_leases = true;
  // 0: the lease is kept as long as the handler runs. Else the keeper stops extending it this
  // long after the handler started, so a handler that hangs does not hold its key for the life
  // of the process: once the last extension runs out the key is taken over (and the hung
  // handler's completion gets LeaseLost). Negative: every Receive fails with kInvalidArgument.
  std::chrono::milliseconds keep_leases_for{0};
  std::chrono::milliseconds retention{24 * 3600 * 1000};
  std::chrono::milliseconds failure_retention{3600 * 1000};
  BusyPolicy busy_policy = BusyPolicy::kReject;
  std::chrono::milliseconds busy_wait{5'000};  // bound for kWait and kCoalesce
  FailurePolicy failure_policy = FailurePolicy::kRelease;
  FingerprintMode fingerprint = FingerprintMode::kNone;
  KeySource key_source{};
  std::size_t max_key_bytes = kDefaultMaxKeyBytes;
  Clock* clock = nullptr;      // nullptr: Clock::System()
  Metrics* metrics = nullptr;  // nullptr: not counted
};

// What the handler is given: the key, the attempt number and the fencing token, so downstream
// calls can be made idempotent too (pass the key to a payment provider).
struct HandlerContext {
  std::string_view scope{};
  std::string_view key{};
  std::uint32_t attempt = 1;
  Token token = 0;
  std::string_view payload{};
};

struct HandlerResult {
  Outcome outcome = Outcome::kSuccess;
  std::string response{};
};

// A handler that throws is treated as returning kFailure with the exception's message.
using Handler = std::function<HandlerResult(const HandlerContext&)>;

enum class Delivery : std::uint8_t { kExecuted, kReplayed, kCoalesced, kBusy, kConflict, kStale };
std::string_view DeliveryName(Delivery d);

struct Delivered {
  Delivery delivery = Delivery::kExecuted;
  std::string key{};  // the key used (after extraction); ENTITY#VERSION, CLIENT#SEQ
  Outcome outcome = Outcome::kSuccess;  // kExecuted, kReplayed, kCoalesced
  std::string response{};               // kExecuted, kReplayed, kCoalesced
  std::uint32_t attempt = 0;            // the attempt that produced the outcome
  bool released = false;                // kExecuted with a failure under kRelease
};

// Counts one answer of Store::Begin in `metrics` (SPEC §7): its idem_begin_total answer (and a
// lease takeover when Acquired::takeover), or a store error (not kInvalidArgument: input the store
// refused is the caller's error). Every caller of Begin that reports metrics (the receiver, the
// transactional receiver, idemd) counts through this, once per delivery: a caller that polls a
// busy key counts only the answer the delivery ended with.
void CountBegin(Metrics& metrics, const Result<BeginAnswer>& answer);

class Receiver {
 public:
  Receiver(Store& store, ReceiverOptions options);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // kInvalidArgument, before anything else, when the options' lease or retentions are out of
  // range (above 0, at most 10 years).
  Result<Delivered> Receive(const Message& message, const Handler& handler);

  // The key Receive would use for `message`, validated.
  Result<std::string> KeyOf(const Message& message) const;
  // Why KeyOf refused a message: it has no key (a missing header, nothing at the JSON
  // pointer), its key is not valid (empty, too long), or its payload does not parse where the
  // key is taken from it.
  enum class KeyFault : std::uint8_t { kNoKey, kBadKey, kBadPayload };

  // The same without a copy where it can: a view into `message` (its key, or a header's
  // value), or into `storage` when the key had to be made (a JSON pointer's text, a
  // fingerprint), valid while both are. On an error, `*fault` (when given) says which kind.
  Result<std::string_view> KeyOf(const Message& message, std::string& storage,
                                 KeyFault* fault = nullptr) const;

  const ReceiverOptions& options() const { return options_; }

 private:
  struct Flights;
  Result<Delivered> Run(std::string key, const std::optional<Fingerprint>& fp,
                        const Message& message, const Handler& handler);
  Result<Delivered> RunVersioned(const Message& message, const Handler& handler);
  Result<Delivered> RunSequenced(const Message& message, const Handler& handler);
  Result<Delivered> Execute(std::string key, const Acquired& acquired, const Message& message,
                            const Handler& handler);
  // Runs the handler (holding its lease in `keeper` when not null), timed.
  HandlerResult Invoke(std::string_view key, const Acquired& acquired, const Message& message,
                       const Handler& handler, core::LeaseKeeper* keeper);
  // Stores a handler's result through `release` or `complete` (per the failure policy),
  // counted; the answer, or why it could not be given.
  using Release = std::function<Result<WriteAnswer>(const HandlerResult&)>;
  using Complete =
      std::function<Result<WriteAnswer>(const HandlerResult&, std::chrono::milliseconds)>;
  Result<Delivered> Finish(std::string_view key, std::uint32_t attempt, HandlerResult result,
                           const Release& release, const Complete& complete);
  Result<BeginAnswer> TimedBegin(const BeginRequest& req);
  Result<std::optional<Fingerprint>> FingerprintOf(const Message& message) const;

  Store& store_;
  ReceiverOptions options_;
  Status options_status_;  // not ok: every Receive fails with it (durations out of range)
  Clock& clock_;
  std::unique_ptr<Flights> flights_;
  std::unique_ptr<core::LeaseKeeper> keeper_;  // keep_leases
};

}  // namespace idem

#endif  // IDEM_RECEIVER_H_
