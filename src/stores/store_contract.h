// The store contract suite (SPEC §2, §4, §5): one set of parameterised tests that every store
// must pass. The tests are in store_contract_suite.cc; a store joins with INSTANTIATE lines in
// a test binary that links idem_store_contract_suite (store_contract_test.cc for the stores that
// need no server):
//
//   StoreContractTest  every store. Each test writes only under its own scope (Scope()), so
//                      stores that share one server can run it side by side.
//   StoreCountsTest    Stats, Purge and List without a scope filter see every record of the
//                      store; instantiate it for stores whose `make` returns a store that sees
//                      only what it wrote itself (memory, a fresh directory, a fresh key prefix
//                      or schema per call).
//   StoreReopenTest    durable stores: instantiate it for stores that set `reopen`.
//
// Time comes from a FakeClock owned by the fixture; no test sleeps or reads the wall clock.
#ifndef IDEM_STORES_STORE_CONTRACT_H_
#define IDEM_STORES_STORE_CONTRACT_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/record.h"
#include "idem/status.h"
#include "idem/store.h"
#include "tests/support/fake_clock.h"

namespace idem {

// How the suite builds one store.
struct StoreUnderTest {
  // Test-name suffix: letters, digits and '_' only.
  std::string name;
  // A new store using `clock`, rejecting keys, client ids and entities over `max_key_bytes`.
  // Called once per test (and again by tests that need a second store with another limit).
  std::function<std::unique_ptr<Store>(Clock& clock, std::size_t max_key_bytes)> make;
  // Durable stores: a store over the same data as the last one `make` built (which the suite
  // destroys first). Leave empty for stores whose data dies with them.
  std::function<std::unique_ptr<Store>(Clock& clock, std::size_t max_key_bytes)> reopen;
  // How long an IN_PROGRESS record is kept after its lease ran out (for a takeover with
  // attempt+1) before it is reclaimed as abandoned: its expiry is lease deadline + this.
  std::chrono::milliseconds abandoned_retention{24 * 3600 * 1000};
};

inline void PrintTo(const StoreUnderTest& s, std::ostream* os) { *os << s.name; }

// For INSTANTIATE_TEST_SUITE_P: names each test after its store.
inline std::string StoreUnderTestName(const ::testing::TestParamInfo<StoreUnderTest>& info) {
  return info.param.name;
}

// ---- printing (gtest finds these by ADL) ----------------------------------------------------

// "start+1500ms": a time relative to FakeClock::kStart.
std::string ShowTime(Timestamp t);
// Short, escaped, with the size: a 1 MiB response must not flood a failure message.
std::string ShowBytes(std::string_view bytes);
std::string ShowFingerprint(const std::optional<Fingerprint>& fp);

void PrintTo(const Fingerprint& fp, std::ostream* os);
void PrintTo(RecordState s, std::ostream* os);
void PrintTo(Outcome o, std::ostream* os);
void PrintTo(WriteAnswer a, std::ostream* os);
void PrintTo(StatusCode c, std::ostream* os);
void PrintTo(const Status& s, std::ostream* os);
void PrintTo(const Record& r, std::ostream* os);
void PrintTo(const Acquired& a, std::ostream* os);
void PrintTo(const Busy& b, std::ostream* os);
void PrintTo(const Replay& r, std::ostream* os);
void PrintTo(const Conflict& c, std::ostream* os);
void PrintTo(const Stale& s, std::ostream* os);
void PrintTo(const BeginAnswer& a, std::ostream* os);
void PrintTo(const SessionInfo& s, std::ostream* os);
void PrintTo(const EntityVersion& e, std::ostream* os);

template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
  if (r.has_value()) {
    *os << ::testing::PrintToString(*r);
  } else {
    *os << "error " << r.error().ToString();
  }
}

// ---- comparing what a store holds -------------------------------------------------------------

// The fields in which `got` differs from `want`, "" when none. Only the fields the contract
// defines for `want.state` are compared: lease_deadline for IN_PROGRESS, outcome and response
// for COMPLETED.
std::string RecordDiff(const Record& got, const Record& want);
std::string ReplayDiff(const Replay& got, const Replay& want);
std::string SessionDiff(const SessionInfo& got, const SessionInfo& want);
// token, attempt and lease_deadline are compared only while a version is in progress.
std::string VersionDiff(const EntityVersion& got, const EntityVersion& want);

MATCHER_P(RecordIs, want, "is " + ::testing::PrintToString(want)) {
  const std::string diff = ::idem::RecordDiff(arg, want);
  if (!diff.empty()) *result_listener << "which differs: " << diff;
  return diff.empty();
}
MATCHER_P(ReplayIs, want, "is " + ::testing::PrintToString(want)) {
  const std::string diff = ::idem::ReplayDiff(arg, want);
  if (!diff.empty()) *result_listener << "which differs: " << diff;
  return diff.empty();
}
MATCHER_P(SessionIs, want, "is " + ::testing::PrintToString(want)) {
  const std::string diff = ::idem::SessionDiff(arg, want);
  if (!diff.empty()) *result_listener << "which differs: " << diff;
  return diff.empty();
}
MATCHER_P(VersionIs, want, "is " + ::testing::PrintToString(want)) {
  const std::string diff = ::idem::VersionDiff(arg, want);
  if (!diff.empty()) *result_listener << "which differs: " << diff;
  return diff.empty();
}
MATCHER_P(At, want, "is at " + ::idem::ShowTime(want)) {
  *result_listener << "which is at " << ::idem::ShowTime(arg);
  return arg == want;
}

// A Result<T> holding a value that matches `m`.
MATCHER_P(HoldsValue, m,
          "holds a value that " +
              ::testing::DescribeMatcher<typename std::decay_t<arg_type>::value_type>(m)) {
  if (!arg.has_value()) {
    *result_listener << "which is the error " << arg.error().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(m, *arg, result_listener);
}

inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}

// A Status or Result<T> failing with `code` and a message that matches `message`.
MATCHER_P2(StatusIs, code, message,
           "fails with " + std::string(::idem::StatusCodeName(code)) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message)) {
  const Status s = ::idem::StatusOf(arg);
  *result_listener << "whose status is " << (s.ok() ? std::string("OK") : s.ToString());
  return s.code() == code && ::testing::Matches(message)(s.message());
}

inline auto IsApplied() { return HoldsValue(WriteAnswer::kApplied); }
inline auto IsLeaseLost() { return HoldsValue(WriteAnswer::kLeaseLost); }

// Each returns the answer if it is of that kind; otherwise it records a failure that names
// the answer or the Status it got, and returns a default value.
Acquired ExpectAcquired(const Result<BeginAnswer>& r,
                        std::source_location loc = std::source_location::current());
Busy ExpectBusy(const Result<BeginAnswer>& r,
                std::source_location loc = std::source_location::current());
Replay ExpectReplay(const Result<BeginAnswer>& r,
                    std::source_location loc = std::source_location::current());
void ExpectConflict(const Result<BeginAnswer>& r,
                    std::source_location loc = std::source_location::current());
void ExpectStale(const Result<BeginAnswer>& r,
                 std::source_location loc = std::source_location::current());

// ---- fixtures -------------------------------------------------------------------------------

class StoreContractTest : public ::testing::TestWithParam<StoreUnderTest> {
 protected:
  using FakeClock = ::idem::testing::FakeClock;

  static constexpr std::chrono::milliseconds kLease{30'000};
  static constexpr std::chrono::milliseconds kRetention{3600'000};

  void SetUp() override;

  // A second store over its own data, sharing the fixture's clock.
  std::unique_ptr<Store> MakeStore(std::size_t max_key_bytes);

  // Unique to this test and this run: every record, session and entity the test makes lives
  // under it (or, in the empty scope, under a key that starts with it).
  const std::string& Scope() const { return scope_; }
  std::chrono::milliseconds AbandonedRetention() const { return GetParam().abandoned_retention; }

  // Requests in Scope().
  BeginRequest BeginOf(std::string_view key, std::optional<Fingerprint> fp = std::nullopt,
                       std::chrono::milliseconds lease = kLease) const;
  CompleteRequest CompleteOf(std::string_view key, Token token, std::string_view response = "ok",
                             Outcome outcome = Outcome::kSuccess,
                             std::chrono::milliseconds retention = kRetention) const;

  SessionRequest SessionOf(std::string_view client_id,
                           std::chrono::milliseconds ttl = SessionRequest{}.ttl,
                           std::uint32_t window = SessionRequest{}.window) const;
  SequencedBeginRequest SeqOf(std::string_view client_id, std::uint64_t seq, std::uint64_t ack = 0,
                              std::optional<Fingerprint> fp = std::nullopt,
                              std::chrono::milliseconds lease = kLease) const;
  SequencedCompleteRequest SeqDoneOf(std::string_view client_id, std::uint64_t seq, Token token,
                                     std::string_view response = "ok",
                                     Outcome outcome = Outcome::kSuccess) const;
  VersionedBeginRequest VersionOf(std::string_view entity, std::uint64_t version,
                                  std::chrono::milliseconds lease = kLease) const;
  VersionedCompleteRequest VersionDoneOf(
      std::string_view entity, Token token,
      std::chrono::milliseconds retention = VersionedCompleteRequest{}.retention) const;

  // Begin that must answer Acquired; returns it.
  Acquired Acquire(std::string_view key, std::optional<Fingerprint> fp = std::nullopt,
                   std::chrono::milliseconds lease = kLease,
                   std::source_location loc = std::source_location::current());
  // Complete that must answer kApplied.
  void Finish(std::string_view key, Token token, std::string_view response = "ok",
              Outcome outcome = Outcome::kSuccess, std::chrono::milliseconds retention = kRetention,
              std::source_location loc = std::source_location::current());

  // The record Begin leaves for `a`, acquired at `created` (the record's creation time, which
  // a takeover keeps).
  Record Held(std::string_view key, const Acquired& a, Timestamp created,
              std::optional<Fingerprint> fp = std::nullopt) const;
  // `held` completed at `at`.
  static Record Completed(Record held, Timestamp at, std::string_view response,
                          Outcome outcome = Outcome::kSuccess,
                          std::chrono::milliseconds retention = kRetention);

  // Get(Scope(), key) holds exactly `want` / nothing.
  void ExpectStored(std::string_view key, const Record& want,
                    std::source_location loc = std::source_location::current());
  void ExpectAbsent(std::string_view key,
                    std::source_location loc = std::source_location::current());

  // The race tests' core: many threads begin every key at once (each key must be acquired
  // once, at `attempt`, with a token above `earlier`'s; the rest answer Busy), then complete
  // every key at once with both the winners' and `earlier`'s tokens (only a winner's applies).
  // `created`: when the keys' records were first made. Checks the records left.
  void RaceBeginsThenCompletes(const std::vector<std::string>& keys,
                               const std::vector<Token>& earlier, std::uint32_t attempt,
                               Timestamp created);

  FakeClock clock_;
  std::unique_ptr<Store> store_;

 private:
  std::string scope_;
};

// Stats, Purge and unfiltered List: needs a store that sees only its own records.
class StoreCountsTest : public StoreContractTest {};

// Durable stores: data survives the store being destroyed and reopened.
class StoreReopenTest : public StoreContractTest {
 protected:
  // Destroys the store and opens a new one over the same data with the same clock.
  void Reopen();
};

}  // namespace idem

#endif  // IDEM_STORES_STORE_CONTRACT_H_
