// Pieces of the receiver (SPEC §3) that other receivers share: the plain Receiver
// (src/core/receiver.cc) and the PostgreSQL TransactionalReceiver
// (src/stores/postgres/transactional.cc) must fail closed, fingerprint and count alike.
#ifndef IDEM_CORE_RECEIVER_PARTS_H_
#define IDEM_CORE_RECEIVER_PARTS_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "core/lease_keeper.h"
#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/metrics.h"
#include "idem/receiver.h"
#include "idem/record.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::core {

// Store errors become kUnavailable (retry the call) unless they say the input is bad: the
// receiver fails closed and never turns a store error into a guess.
Status StoreError(const Status& s, std::string_view what);

// What is stored, as a failure, in place of an outcome the store refused (kInvalidArgument: a
// response over its limit) after the handler ran: the key must not be released, or the handler
// would run again.
std::string RefusedOutcomeText(const HandlerResult& result, const Status& refused);

// options' durations and limits, checked before any store call (kInvalidArgument naming the
// option): the receivers refuse every Receive with it.
Status CheckReceiverOptions(const ReceiverOptions& options);

// The payload's fingerprint per `mode` (nullopt for kNone); bad JSON is kInvalidArgument.
Result<std::optional<Fingerprint>> FingerprintFor(FingerprintMode mode, std::string_view payload);

// store.Begin(req), timed and counted in `metrics` when it is not null. `polls_on_busy`: the
// caller waits out a Busy answer by asking again, so a Busy is not counted: idem_begin_total
// counts one answer per delivery, the one it ended with, and the caller counts a Busy itself
// when it gives up (CountBusy).
Result<BeginAnswer> TimedBegin(Store& store, const BeginRequest& req, Metrics* metrics,
                               bool polls_on_busy = false);
Result<BeginAnswer> TimedBegin(Store& store, const VersionedBeginRequest& req, Metrics* metrics,
                               bool polls_on_busy = false);
void CountBusy(Metrics* metrics);
// CountBegin(*metrics, answer) when `metrics` is not null, but a Busy is left out when the
// caller polls on it (`polls_on_busy`): the rule TimedBegin counts by, for a caller that began
// otherwise (a batch).
void CountBeginAnswer(Metrics* metrics, const Result<BeginAnswer>& answer, bool polls_on_busy);

// begin(), and while it answers Busy under a waiting busy_policy (kWait, kCoalesce), again with
// backoff (1 ms doubling to 50 ms) until options.busy_wait has passed on `clock`; a Busy given
// up on is counted then (CountBusy). Stops at the first store error.
Result<BeginAnswer> BeginWaitingOutBusy(Clock& clock, const ReceiverOptions& options,
                                        const std::function<Result<BeginAnswer>()>& begin);

// While a handler runs: holds its key's lease in `keeper` (when not null), extending it through
// `store` once half of options.lease has gone since the Begin (about now), until
// options.keep_leases_for (when set) has passed. A store error is
// counted and tried again at the keeper's next turn; once LeaseLost, the hold stops extending
// (the handler's completion is then refused and says so). `key` and `token` must outlive the
// hold.
class LeaseHold {
 public:
  LeaseHold(LeaseKeeper* keeper, Store& store, Clock& clock, const ReceiverOptions& options,
            std::string_view key, Token token);
  LeaseHold(const LeaseHold&) = delete;
  LeaseHold& operator=(const LeaseHold&) = delete;

 private:
  void Keep();  // on the keeper's thread

  Store& store_;
  Clock& clock_;
  const ReceiverOptions& options_;
  const std::string_view key_;
  const Token token_;
  Timestamp extended_;  // the lease runs from here; max: lost, nothing more to extend
  Timestamp started_;   // for options.keep_leases_for
  std::optional<LeaseKeeper::Hold> hold_;  // last: destroyed (waiting for Keep) first
};

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  std::chrono::nanoseconds Elapsed() const { return std::chrono::steady_clock::now() - start_; }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace idem::core

#endif  // IDEM_CORE_RECEIVER_PARTS_H_
