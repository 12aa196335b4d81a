// Pieces of the receiver (SPEC §3) that other receivers share: the plain Receiver
// (src/core/receiver.cc) and the PostgreSQL TransactionalReceiver
// (src/stores/postgres/transactional.cc) must fail closed, fingerprint and count alike.
#ifndef IDEM_CORE_RECEIVER_PARTS_H_
#define IDEM_CORE_RECEIVER_PARTS_H_

#include <chrono>
#include <optional>
#include <string_view>

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

// The payload's fingerprint per `mode` (nullopt for kNone); bad JSON is kInvalidArgument.
Result<std::optional<Fingerprint>> FingerprintFor(FingerprintMode mode, std::string_view payload);

// store.Begin(req), timed and counted in `metrics` when it is not null.
Result<BeginAnswer> TimedBegin(Store& store, const BeginRequest& req, Metrics* metrics);

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  std::chrono::nanoseconds Elapsed() const { return std::chrono::steady_clock::now() - start_; }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace idem::core

#endif  // IDEM_CORE_RECEIVER_PARTS_H_
