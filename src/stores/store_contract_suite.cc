// The store contract (SPEC §2, §4, §5), run against every store. See store_contract.h for the
// three groups and how a store joins them. This file holds the tests only and is compiled once
// (the object library idem_store_contract_suite); each test binary brings the INSTANTIATE lines
// for its stores: store_contract_test.cc (memory, log), redis/redis_contract_test.cc,
// postgres/postgres_contract_test.cc.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/machine.h"
#include "idem/key.h"
#include "idem/record.h"
#include "idem/status.h"
#include "idem/store.h"
#include "stores/store_contract.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Optional;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

// Races: kRaceThreads threads on the same kRaceKeys keys (and session numbers, and entity
// rounds). Kept moderate so that stores behind a network finish quickly too.
constexpr int kRaceThreads = 16;
constexpr std::size_t kRaceKeys = 200;
constexpr std::uint64_t kRaceSeqs = 200;
constexpr int kRaceRounds = 20;
constexpr milliseconds kRaceRetention = 1h;

constexpr milliseconds kSessionTtl = 10min;
constexpr std::uint32_t kWindow = 8;

Fingerprint Fp(std::uint8_t fill) {
  Fingerprint f;
  f.bytes.fill(fill);
  f.bytes[31] = static_cast<std::uint8_t>(fill ^ 0x5a);
  return f;
}
const Fingerprint kFpA = Fp(0xa1);
const Fingerprint kFpB = Fp(0xb2);

// Every byte value, NULs included, twice.
std::string BinaryBytes() {
  std::string s;
  for (int round = 0; round < 2; ++round) {
    for (int b = 0; b < 256; ++b) s.push_back(static_cast<char>(b));
  }
  return s;
}

std::string MebibyteBytes() {
  std::string s(std::size_t{1} << 20, '\0');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 131 + i / 4093) & 0xff);
  return s;
}

// Runs body(0) .. body(threads-1) on their own threads, released together.
void RunConcurrently(int threads, const std::function<void(int)>& body) {
  std::latch start(threads);
  std::vector<std::thread> running;
  running.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&start, &body, t] {
      start.arrive_and_wait();
      body(t);
    });
  }
  for (std::thread& th : running) th.join();
}

// Collects problems found after a race and reports the first few, not thousands of lines.
class Problems {
 public:
  void Add(const std::string& p) {
    if (count_++ < 10) text_ += p + "\n";
  }
  bool empty() const { return count_ == 0; }
  std::string Report() const { return std::to_string(count_) + " problem(s):\n" + text_; }

 private:
  std::size_t count_ = 0;
  std::string text_;
};

std::string Show(const Result<BeginAnswer>& r) { return ::testing::PrintToString(r); }
std::string Show(const Result<WriteAnswer>& r) { return ::testing::PrintToString(r); }

MATCHER(IsNone, "is empty") { return !arg.has_value(); }

bool IsAcquired(const Result<BeginAnswer>& r) {
  return r.has_value() && std::holds_alternative<Acquired>(*r);
}

// ==== begin: every row of SPEC §2's table ======================================================

TEST_P(StoreContractTest, BeginOnAbsentKeyAcquiresAttemptOne) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->Begin(BeginOf("k", kFpA)));
  EXPECT_EQ(a.attempt, 1u);
  EXPECT_THAT(a.lease_deadline, At(t0 + kLease));
  ExpectStored("k", Held("k", a, t0, kFpA));
}

TEST_P(StoreContractTest, BeginWithoutFingerprintAcquiresAndStoresNone) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->Begin(BeginOf("k", std::nullopt, 5s)));
  EXPECT_EQ(a.attempt, 1u);
  EXPECT_THAT(a.lease_deadline, At(t0 + 5s));
  ExpectStored("k", Held("k", a, t0));
}

// After retention the key is new again, whatever fingerprint the old record had.
TEST_P(StoreContractTest, BeginAfterRetentionAcquiresAttemptOneWithLargerToken) {
  const std::pair<std::string, Fingerprint> cases[] = {{"same-fingerprint", kFpA},
                                                       {"other-fingerprint", kFpB}};
  for (const auto& [key, fp] : cases) {
    SCOPED_TRACE(key);
    const Acquired first = Acquire(key, kFpA);
    Finish(key, first.token, "old", Outcome::kSuccess, 10s);
    clock_.Advance(10s);
    const Timestamp t1 = clock_.Now();
    const Acquired a = ExpectAcquired(store_->Begin(BeginOf(key, fp)));
    EXPECT_EQ(a.attempt, 1u);
    EXPECT_GT(a.token, first.token);
    EXPECT_THAT(a.lease_deadline, At(t1 + kLease));
    ExpectStored(key, Held(key, a, t1, fp));
  }
}

TEST_P(StoreContractTest, BusyWhileLeaseRunsWithSameFingerprint) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  clock_.Advance(kLease - 1ms);
  const Busy b = ExpectBusy(store_->Begin(BeginOf("k", kFpA)));
  EXPECT_THAT(b.lease_deadline, At(t0 + kLease));
  ExpectStored("k", Held("k", a, t0, kFpA));
}

TEST_P(StoreContractTest, BusyWhileLeaseRunsWithoutFingerprints) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  const Busy b = ExpectBusy(store_->Begin(BeginOf("k", std::nullopt, 1h)));
  EXPECT_THAT(b.lease_deadline, At(t0 + kLease));
  ExpectStored("k", Held("k", a, t0));
}

TEST_P(StoreContractTest, BusyWhenOnlyStoredRecordHasFingerprint) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  clock_.Advance(1s);
  const Busy b = ExpectBusy(store_->Begin(BeginOf("k")));
  EXPECT_THAT(b.lease_deadline, At(t0 + kLease));
  ExpectStored("k", Held("k", a, t0, kFpA));
}

TEST_P(StoreContractTest, BusyWhenOnlyRequestHasFingerprint) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  clock_.Advance(1s);
  const Busy b = ExpectBusy(store_->Begin(BeginOf("k", kFpA)));
  EXPECT_THAT(b.lease_deadline, At(t0 + kLease));
  ExpectStored("k", Held("k", a, t0));  // the request's fingerprint is not adopted
}

TEST_P(StoreContractTest, TakeoverWhenLeaseIsOver) {
  const Timestamp t0 = clock_.Now();
  const Acquired first = Acquire("k", kFpA);
  EXPECT_FALSE(first.takeover);
  clock_.Advance(kLease);  // the deadline itself is over
  const Timestamp t1 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->Begin(BeginOf("k", kFpA, 2min)));
  EXPECT_EQ(a.attempt, 2u);
  EXPECT_TRUE(a.takeover);
  EXPECT_GT(a.token, first.token);
  EXPECT_THAT(a.lease_deadline, At(t1 + 2min));
  ExpectStored("k", Held("k", a, t0, kFpA));  // created is the first acquisition's
}

TEST_P(StoreContractTest, TakeoverWithoutFingerprints) {
  const Timestamp t0 = clock_.Now();
  const Acquired first = Acquire("k");
  clock_.Advance(kLease + 1h);
  const Timestamp t1 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->Begin(BeginOf("k")));
  EXPECT_EQ(a.attempt, 2u);
  EXPECT_GT(a.token, first.token);
  EXPECT_THAT(a.lease_deadline, At(t1 + kLease));
  ExpectStored("k", Held("k", a, t0));
}

TEST_P(StoreContractTest, EveryTakeoverCountsAnAttempt) {
  const Timestamp t0 = clock_.Now();
  Acquired a = Acquire("k", kFpA);
  for (std::uint32_t attempt = 2; attempt <= 4; ++attempt) {
    clock_.Advance(kLease);
    const Acquired next = ExpectAcquired(store_->Begin(BeginOf("k", kFpA)));
    EXPECT_EQ(next.attempt, attempt);
    EXPECT_TRUE(next.takeover);
    EXPECT_GT(next.token, a.token);
    a = next;
  }
  ExpectStored("k", Held("k", a, t0, kFpA));
  const Timestamp tc = clock_.Now();
  Finish("k", a.token, "done");
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("k", kFpA))),
              ReplayIs(Replay{Outcome::kSuccess, "done", 4}));
  ExpectStored("k", Completed(Held("k", a, t0, kFpA), tc, "done"));
}

TEST_P(StoreContractTest, ReplayWithSameFingerprint) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  clock_.Advance(2s);
  const Timestamp tc = clock_.Now();
  Finish("k", a.token, "response");
  clock_.Advance(1s);
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("k", kFpA))),
              ReplayIs(Replay{Outcome::kSuccess, "response", 1}));
  ExpectStored("k", Completed(Held("k", a, t0, kFpA), tc, "response"));
}

// Fingerprints are compared only when both the stored record and the request have one.
TEST_P(StoreContractTest, ReplayWhenEitherSideHasNoFingerprint) {
  struct Case {
    std::string key;
    std::optional<Fingerprint> stored, request;
  };
  const Case cases[] = {{"neither", std::nullopt, std::nullopt},
                        {"only-stored", kFpA, std::nullopt},
                        {"only-request", std::nullopt, kFpB}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const Timestamp t0 = clock_.Now();
    const Acquired a = Acquire(c.key, c.stored);
    Finish(c.key, a.token, "response");
    EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf(c.key, c.request))),
                ReplayIs(Replay{Outcome::kSuccess, "response", 1}));
    ExpectStored(c.key, Completed(Held(c.key, a, t0, c.stored), t0, "response"));
  }
}

TEST_P(StoreContractTest, ConflictWhileInProgress) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  ExpectConflict(store_->Begin(BeginOf("k", kFpB)));
  ExpectStored("k", Held("k", a, t0, kFpA));
}

TEST_P(StoreContractTest, ConflictAfterLeaseIsOverDoesNotTakeOver) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  clock_.Advance(kLease + 1s);
  ExpectConflict(store_->Begin(BeginOf("k", kFpB)));
  ExpectStored("k", Held("k", a, t0, kFpA));
  const Acquired b = ExpectAcquired(store_->Begin(BeginOf("k", kFpA)));
  EXPECT_EQ(b.attempt, 2u);
}

TEST_P(StoreContractTest, ConflictWhenCompleted) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  Finish("k", a.token, "response");
  ExpectConflict(store_->Begin(BeginOf("k", kFpB)));
  ExpectStored("k", Completed(Held("k", a, t0, kFpA), t0, "response"));
}

TEST_P(StoreContractTest, FailureOutcomeReplaysAsFailure) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  Finish("k", a.token, "card declined", Outcome::kFailure, 1min);
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("k", kFpA))),
              ReplayIs(Replay{Outcome::kFailure, "card declined", 1}));
  ExpectStored("k",
               Completed(Held("k", a, t0, kFpA), t0, "card declined", Outcome::kFailure, 1min));
}

// ==== complete ================================================================================

// Binary (every byte value), empty and 1 MiB responses come back byte for byte.
TEST_P(StoreContractTest, CompleteStoresAnyResponseBytes) {
  const std::pair<std::string, std::string> cases[] = {
      {"binary", BinaryBytes()}, {"empty", ""}, {"mebibyte", MebibyteBytes()}};
  for (const auto& [key, bytes] : cases) {
    SCOPED_TRACE(key);
    const Timestamp t0 = clock_.Now();
    const Acquired a = Acquire(key);
    EXPECT_THAT(store_->Complete(CompleteOf(key, a.token, bytes)), IsApplied());
    EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf(key))),
                ReplayIs(Replay{Outcome::kSuccess, bytes, 1}));
    ExpectStored(key, Completed(Held(key, a, t0), t0, bytes));
  }
}

TEST_P(StoreContractTest, CompleteWithWrongTokenIsLeaseLostAndChangesNothing) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  for (Token wrong : {a.token + 1, a.token - 1, Token{0}, std::numeric_limits<Token>::max()}) {
    if (wrong == a.token) continue;
    SCOPED_TRACE("token " + std::to_string(wrong));
    EXPECT_THAT(store_->Complete(CompleteOf("k", wrong, "thief")), IsLeaseLost());
    ExpectStored("k", Held("k", a, t0, kFpA));
  }
  Finish("k", a.token, "owner");
  ExpectStored("k", Completed(Held("k", a, t0, kFpA), t0, "owner"));
}

TEST_P(StoreContractTest, CompleteOnAbsentKeyIsLeaseLost) {
  EXPECT_THAT(store_->Complete(CompleteOf("k", 1, "x")), IsLeaseLost());
  EXPECT_THAT(store_->Complete(CompleteOf("k", 0, "x")), IsLeaseLost());
  ExpectAbsent("k");
  const Acquired a = Acquire("k");
  EXPECT_EQ(a.attempt, 1u);
}

TEST_P(StoreContractTest, CompleteTwiceIsLeaseLost) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  Finish("k", a.token, "first");
  clock_.Advance(1s);
  EXPECT_THAT(store_->Complete(CompleteOf("k", a.token, "second", Outcome::kFailure, 2h)),
              IsLeaseLost());
  ExpectStored("k", Completed(Held("k", a, t0), t0, "first"));
}

TEST_P(StoreContractTest, OldWorkerIsFencedAfterTakeover) {
  const Timestamp t0 = clock_.Now();
  const Acquired old_worker = Acquire("k", kFpA);
  clock_.Advance(kLease);
  const Acquired new_worker = ExpectAcquired(store_->Begin(BeginOf("k", kFpA)));
  ASSERT_EQ(new_worker.attempt, 2u);
  const Record held = Held("k", new_worker, t0, kFpA);

  EXPECT_THAT(store_->Complete(CompleteOf("k", old_worker.token, "old")), IsLeaseLost());
  ExpectStored("k", held);
  EXPECT_THAT(store_->Extend(Scope(), "k", old_worker.token, 1h), IsLeaseLost());
  ExpectStored("k", held);
  EXPECT_THAT(store_->Release(Scope(), "k", old_worker.token), IsLeaseLost());
  ExpectStored("k", held);

  clock_.Advance(1s);
  const Timestamp tc = clock_.Now();
  Finish("k", new_worker.token, "new");
  ExpectStored("k", Completed(held, tc, "new"));
  EXPECT_THAT(store_->Complete(CompleteOf("k", old_worker.token, "old")), IsLeaseLost());
  ExpectStored("k", Completed(held, tc, "new"));
}

TEST_P(StoreContractTest, CompleteAfterLeaseEndsBeforeTakeoverIsApplied) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  clock_.Advance(kLease + 1h);  // nobody took over: the token is still the current one
  const Timestamp tc = clock_.Now();
  Finish("k", a.token, "late");
  ExpectStored("k", Completed(Held("k", a, t0), tc, "late"));
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("k"))),
              ReplayIs(Replay{Outcome::kSuccess, "late", 1}));
}

// ==== release ==================================================================================

TEST_P(StoreContractTest, ReleaseMakesKeyAbsent) {
  const Acquired first = Acquire("k", kFpA);
  EXPECT_THAT(store_->Release(Scope(), "k", first.token), IsApplied());
  ExpectAbsent("k");
  EXPECT_THAT(store_->Release(Scope(), "k", first.token), IsLeaseLost());
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->Begin(BeginOf("k", kFpB)));
  EXPECT_EQ(a.attempt, 1u);
  EXPECT_GT(a.token, first.token);
  ExpectStored("k", Held("k", a, t1, kFpB));
}

TEST_P(StoreContractTest, ReleaseWithWrongTokenIsLeaseLost) {
  EXPECT_THAT(store_->Release(Scope(), "k", 1), IsLeaseLost());
  ExpectAbsent("k");
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  for (Token wrong : {a.token + 1, a.token - 1, Token{0}}) {
    if (wrong == a.token) continue;
    SCOPED_TRACE("token " + std::to_string(wrong));
    EXPECT_THAT(store_->Release(Scope(), "k", wrong), IsLeaseLost());
    ExpectStored("k", Held("k", a, t0, kFpA));
  }
}

TEST_P(StoreContractTest, ReleaseOfCompletedRecordIsLeaseLost) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  Finish("k", a.token, "done");
  EXPECT_THAT(store_->Release(Scope(), "k", a.token), IsLeaseLost());
  ExpectStored("k", Completed(Held("k", a, t0), t0, "done"));
}

// ==== extend ===================================================================================

TEST_P(StoreContractTest, ExtendPushesLeaseDeadline) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  clock_.Advance(20s);
  const Timestamp t1 = clock_.Now();
  EXPECT_THAT(store_->Extend(Scope(), "k", a.token, 1min), IsApplied());
  const Acquired extended{a.token, 1, t1 + 1min};
  ExpectStored("k", Held("k", extended, t0, kFpA));
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("k", kFpA))).lease_deadline, At(t1 + 1min));

  clock_.Set(t0 + kLease);  // the old deadline: no takeover
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("k", kFpA))).lease_deadline, At(t1 + 1min));
  clock_.Set(t1 + 1min - 1ms);
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("k", kFpA))).lease_deadline, At(t1 + 1min));
  ExpectStored("k", Held("k", extended, t0, kFpA));

  clock_.Set(t1 + 1min);
  const Acquired b = ExpectAcquired(store_->Begin(BeginOf("k", kFpA)));
  EXPECT_EQ(b.attempt, 2u);
  EXPECT_GT(b.token, a.token);
}

TEST_P(StoreContractTest, ExtendCanShortenLease) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", std::nullopt, 1h);
  EXPECT_THAT(store_->Extend(Scope(), "k", a.token, 1s), IsApplied());
  ExpectStored("k", Held("k", Acquired{a.token, 1, t0 + 1s}, t0));
  clock_.Advance(1s);
  EXPECT_EQ(ExpectAcquired(store_->Begin(BeginOf("k"))).attempt, 2u);
}

TEST_P(StoreContractTest, ExtendWithWrongTokenIsLeaseLost) {
  EXPECT_THAT(store_->Extend(Scope(), "absent", 1, 1h), IsLeaseLost());
  ExpectAbsent("absent");

  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  for (Token wrong : {a.token + 1, a.token - 1, Token{0}}) {
    if (wrong == a.token) continue;
    SCOPED_TRACE("token " + std::to_string(wrong));
    EXPECT_THAT(store_->Extend(Scope(), "k", wrong, 1h), IsLeaseLost());
    ExpectStored("k", Held("k", a, t0));
  }

  Finish("k", a.token, "done");
  EXPECT_THAT(store_->Extend(Scope(), "k", a.token, 1h), IsLeaseLost());
  ExpectStored("k", Completed(Held("k", a, t0), t0, "done"));
}

TEST_P(StoreContractTest, ExtendAfterLeaseEndsBeforeTakeoverIsApplied) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  clock_.Advance(kLease + 5s);
  const Timestamp t1 = clock_.Now();
  EXPECT_THAT(store_->Extend(Scope(), "k", a.token, kLease), IsApplied());
  ExpectStored("k", Held("k", Acquired{a.token, 1, t1 + kLease}, t0));
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("k"))).lease_deadline, At(t1 + kLease));
}

TEST_P(StoreContractTest, ExtendAfterTakeoverIsLeaseLost) {
  const Timestamp t0 = clock_.Now();
  const Acquired old_worker = Acquire("k");
  clock_.Advance(kLease);
  const Acquired new_worker = ExpectAcquired(store_->Begin(BeginOf("k")));
  EXPECT_THAT(store_->Extend(Scope(), "k", old_worker.token, 1h), IsLeaseLost());
  ExpectStored("k", Held("k", new_worker, t0));
}

// ==== tokens ===================================================================================

TEST_P(StoreContractTest, TokensGrowAcrossEveryAcquisitionOfAKey) {
  std::vector<Token> tokens;
  Acquired a = Acquire("k");
  tokens.push_back(a.token);

  ASSERT_THAT(store_->Release(Scope(), "k", a.token), IsApplied());  // release, reacquire
  a = Acquire("k");
  tokens.push_back(a.token);

  clock_.Advance(kLease);  // takeover
  a = Acquire("k");
  EXPECT_EQ(a.attempt, 2u);
  tokens.push_back(a.token);

  Finish("k", a.token, "x", Outcome::kSuccess, 1s);  // retention over, reacquire
  clock_.Advance(1s);
  a = Acquire("k");
  EXPECT_EQ(a.attempt, 1u);
  tokens.push_back(a.token);

  clock_.Advance(kLease + AbandonedRetention());  // abandoned, reacquire
  a = Acquire("k");
  EXPECT_EQ(a.attempt, 1u);
  tokens.push_back(a.token);

  ASSERT_THAT(store_->Erase(Scope(), "k"), HoldsValue(true));  // erase, reacquire
  a = Acquire("k");
  tokens.push_back(a.token);

  for (std::size_t i = 1; i < tokens.size(); ++i) {
    EXPECT_GT(tokens[i], tokens[i - 1]) << "acquisition " << i;
  }
}

// ==== retention ================================================================================

TEST_P(StoreContractTest, CompletedRecordReplaysUntilRetentionEnds) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  clock_.Advance(5s);
  const Timestamp tc = clock_.Now();
  Finish("k", a.token, "r", Outcome::kSuccess, 10s);  // kept for 10s from completion
  const Record done = Completed(Held("k", a, t0, kFpA), tc, "r", Outcome::kSuccess, 10s);

  clock_.Set(tc + 10s - 1ms);
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("k", kFpA))),
              ReplayIs(Replay{Outcome::kSuccess, "r", 1}));
  ExpectStored("k", done);

  clock_.Set(tc + 10s);
  ExpectAbsent("k");
  const Acquired b = ExpectAcquired(store_->Begin(BeginOf("k", kFpA)));
  EXPECT_EQ(b.attempt, 1u);
  EXPECT_GT(b.token, a.token);
  ExpectStored("k", Held("k", b, tc + 10s, kFpA));
}

// The longest lease and retention a store accepts are kept whole (the memory store, and so the
// log store, packs deadlines into 40-bit offsets of about 17 years); longer ones are refused,
// never cut short into a lease another worker could take over early or a record forgotten
// early.
TEST_P(StoreContractTest, TheLongestLeaseAndRetentionAreKeptAndLongerOnesRefused) {
  constexpr milliseconds kMax = core::kMaxDuration;
  const auto over = StatusIs(StatusCode::kInvalidArgument, HasSubstr("over the limit of 10 years"));
  EXPECT_THAT(store_->Begin(BeginOf("held", kFpA, kMax + 1ms)), over);
  ExpectAbsent("held");
  const Timestamp t0 = clock_.Now();
  const Acquired held = Acquire("held", kFpA, kMax);
  EXPECT_THAT(held.lease_deadline, At(t0 + kMax));

  const Acquired done = Acquire("done", kFpA);
  EXPECT_THAT(store_->Complete(CompleteOf("done", done.token, "r", Outcome::kSuccess, kMax + 1ms)),
              over);
  Finish("done", done.token, "r", Outcome::kSuccess, kMax);

  clock_.Set(t0 + kMax - 1ms);
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("held", kFpA))).lease_deadline, At(t0 + kMax));
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("done", kFpA))),
              ReplayIs(Replay{Outcome::kSuccess, "r", 1}));
  clock_.Set(t0 + kMax);
  EXPECT_EQ(ExpectAcquired(store_->Begin(BeginOf("held", kFpA))).attempt, 2u);
  ExpectAbsent("done");
}

TEST_P(StoreContractTest, ExpiredRecordIsAbsentBeforePurge) {
  const Acquired a = Acquire("k");
  Finish("k", a.token, "r", Outcome::kSuccess, 1min);
  clock_.Advance(1min);
  ExpectAbsent("k");
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope()}), HoldsValue(IsEmpty()));
  EXPECT_THAT(store_->Erase(Scope(), "k"), HoldsValue(false));
  EXPECT_THAT(store_->Complete(CompleteOf("k", a.token)), IsLeaseLost());
}

TEST_P(StoreContractTest, AbandonedRecordIsReclaimedAfterLeasePlusAbandonedRetention) {
  const Timestamp t0 = clock_.Now();
  const Acquired a1 = Acquire("k1");
  const Acquired a2 = Acquire("k2");
  const Timestamp end = t0 + kLease + AbandonedRetention();

  clock_.Set(end - 1ms);
  ExpectStored("k1", Held("k1", a1, t0));
  const Acquired takeover = ExpectAcquired(store_->Begin(BeginOf("k2")));
  EXPECT_EQ(takeover.attempt, 2u);
  EXPECT_GT(takeover.token, a2.token);

  clock_.Set(end);
  ExpectAbsent("k1");
  EXPECT_THAT(store_->Complete(CompleteOf("k1", a1.token)), IsLeaseLost());
  const Acquired fresh = ExpectAcquired(store_->Begin(BeginOf("k1")));
  EXPECT_EQ(fresh.attempt, 1u);
  EXPECT_GT(fresh.token, a1.token);
  ExpectStored("k1", Held("k1", fresh, end));
  ExpectStored("k2", Held("k2", takeover, t0));  // the takeover kept k2 alive
}

// ==== batches ==================================================================================

TEST_P(StoreContractTest, BeginBatchAnswersEachRequestInOrder) {
  const Timestamp t0 = clock_.Now();
  const Acquired busy = Acquire("busy");
  const Acquired replay = Acquire("replay");
  Finish("replay", replay.token, "stored");
  const Acquired conflict = Acquire("conflict", kFpA);
  Finish("conflict", conflict.token, "a");
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();

  const std::vector<BeginRequest> reqs = {
      BeginOf("new1", kFpA), BeginOf("busy"),           BeginOf(""),
      BeginOf("replay"),     BeginOf("conflict", kFpB), BeginOf("new2", std::nullopt, 1min),
  };
  const std::vector<Result<BeginAnswer>> got = store_->BeginBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));

  const Acquired new1 = ExpectAcquired(got[0]);
  EXPECT_EQ(new1.attempt, 1u);
  EXPECT_THAT(new1.lease_deadline, At(t1 + kLease));
  EXPECT_THAT(ExpectBusy(got[1]).lease_deadline, At(t0 + kLease));
  EXPECT_THAT(got[2], StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is empty")));
  EXPECT_THAT(ExpectReplay(got[3]), ReplayIs(Replay{Outcome::kSuccess, "stored", 1}));
  ExpectConflict(got[4]);
  const Acquired new2 = ExpectAcquired(got[5]);
  EXPECT_THAT(new2.lease_deadline, At(t1 + 1min));

  ExpectStored("new1", Held("new1", new1, t1, kFpA));
  ExpectStored("busy", Held("busy", busy, t0));
  ExpectStored("replay", Completed(Held("replay", replay, t0), t0, "stored"));
  ExpectStored("conflict", Completed(Held("conflict", conflict, t0, kFpA), t0, "a"));
  ExpectStored("new2", Held("new2", new2, t1));
}

TEST_P(StoreContractTest, BeginBatchWithDuplicateKeyAcquiresOnce) {
  const Timestamp t0 = clock_.Now();
  const std::vector<BeginRequest> reqs = {BeginOf("k"), BeginOf("k", std::nullopt, 1h),
                                          BeginOf("f", kFpA), BeginOf("f", kFpB)};
  const std::vector<Result<BeginAnswer>> got = store_->BeginBatch(reqs);
  ASSERT_THAT(got, SizeIs(4u));
  const Acquired k = ExpectAcquired(got[0]);
  EXPECT_THAT(ExpectBusy(got[1]).lease_deadline, At(t0 + kLease));
  const Acquired f = ExpectAcquired(got[2]);
  ExpectConflict(got[3]);
  ExpectStored("k", Held("k", k, t0));
  ExpectStored("f", Held("f", f, t0, kFpA));
}

// The same lease for every request (a store may send it once): new keys with and without a
// fingerprint, a duplicate, a takeover and keys that hold something.
TEST_P(StoreContractTest, BeginBatchWithOneLeaseAnswersEachRequestInOrder) {
  const Timestamp t0 = clock_.Now();
  const Acquired busy = Acquire("busy", kFpA);
  const Acquired replay = Acquire("replay");
  Finish("replay", replay.token, "stored");
  const Acquired conflict = Acquire("conflict", kFpA);
  Finish("conflict", conflict.token, "a");
  const Acquired lapsed = Acquire("lapsed", std::nullopt, 500ms);
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();

  const std::vector<BeginRequest> reqs = {
      BeginOf("new1", kFpA),     BeginOf("busy", kFpA), BeginOf("new2"),   BeginOf("replay"),
      BeginOf("conflict", kFpB), BeginOf("new2"),       BeginOf("lapsed"), BeginOf("new3", kFpB),
  };
  const std::vector<Result<BeginAnswer>> got = store_->BeginBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));

  const Acquired new1 = ExpectAcquired(got[0]);
  EXPECT_EQ(new1.attempt, 1u);
  EXPECT_THAT(new1.lease_deadline, At(t1 + kLease));
  EXPECT_THAT(ExpectBusy(got[1]).lease_deadline, At(t0 + kLease));
  const Acquired new2 = ExpectAcquired(got[2]);
  EXPECT_THAT(ExpectReplay(got[3]), ReplayIs(Replay{Outcome::kSuccess, "stored", 1}));
  ExpectConflict(got[4]);
  EXPECT_THAT(ExpectBusy(got[5]).lease_deadline, At(t1 + kLease));
  const Acquired takeover = ExpectAcquired(got[6]);
  EXPECT_EQ(takeover.attempt, 2u);
  EXPECT_GT(takeover.token, lapsed.token);
  EXPECT_THAT(takeover.lease_deadline, At(t1 + kLease));
  const Acquired new3 = ExpectAcquired(got[7]);

  ExpectStored("new1", Held("new1", new1, t1, kFpA));
  ExpectStored("busy", Held("busy", busy, t0, kFpA));
  ExpectStored("new2", Held("new2", new2, t1));
  ExpectStored("replay", Completed(Held("replay", replay, t0), t0, "stored"));
  ExpectStored("conflict", Completed(Held("conflict", conflict, t0, kFpA), t0, "a"));
  ExpectStored("lapsed", Held("lapsed", takeover, t0));
  ExpectStored("new3", Held("new3", new3, t1, kFpB));
}

TEST_P(StoreContractTest, CompleteBatchAnswersEachRequestInOrder) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("a");
  const Acquired b = Acquire("b");
  const Acquired c = Acquire("c");
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();

  const std::vector<CompleteRequest> reqs = {
      CompleteOf("a", a.token, "A"),
      CompleteOf("b", b.token + 1, "thief"),
      CompleteOf("", a.token, "x"),
      CompleteOf("absent", 1, "x"),
      CompleteOf("c", c.token, "x", Outcome::kSuccess, 0ms),
      CompleteOf("c", c.token, "C", Outcome::kFailure, 1min),
  };
  const std::vector<Result<WriteAnswer>> got = store_->CompleteBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));
  EXPECT_THAT(got[0], IsApplied());
  EXPECT_THAT(got[1], IsLeaseLost());
  EXPECT_THAT(got[2], StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is empty")));
  EXPECT_THAT(got[3], IsLeaseLost());
  EXPECT_THAT(got[4],
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("retention must be positive")));
  EXPECT_THAT(got[5], IsApplied());

  ExpectStored("a", Completed(Held("a", a, t0), t1, "A"));
  ExpectStored("b", Held("b", b, t0));
  ExpectAbsent("absent");
  ExpectStored("c", Completed(Held("c", c, t0), t1, "C", Outcome::kFailure, 1min));
}

// Distinct keys, one outcome and retention (a store may read them all at once and send the
// outcome and retention once): with and without a response or a fingerprint, a wrong token, a
// key that is absent, one already completed, one whose lease has run out.
TEST_P(StoreContractTest, CompleteBatchOfDistinctKeysAnswersEachRequestInOrder) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("a");
  const Acquired b = Acquire("b");
  const Acquired e = Acquire("e");
  const Acquired f = Acquire("f", kFpA);
  const Acquired done = Acquire("done");
  Finish("done", done.token, "D");
  const Acquired late = Acquire("late", std::nullopt, 500ms);
  const Acquired taken = Acquire("taken", std::nullopt, 500ms);
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();
  const Acquired taker = Acquire("taken");

  const std::vector<CompleteRequest> reqs = {
      CompleteOf("a", a.token, "A", Outcome::kFailure, 1min),
      CompleteOf("b", b.token + 1, "thief", Outcome::kFailure, 1min),
      CompleteOf("absent", 1, "x", Outcome::kFailure, 1min),
      CompleteOf("e", e.token, "", Outcome::kFailure, 1min),
      CompleteOf("f", f.token, "F", Outcome::kFailure, 1min),
      CompleteOf("done", done.token, "again", Outcome::kFailure, 1min),
      CompleteOf("late", late.token, "L", Outcome::kFailure, 1min),
      CompleteOf("taken", taken.token, "T", Outcome::kFailure, 1min),
  };
  const std::vector<Result<WriteAnswer>> got = store_->CompleteBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));
  EXPECT_THAT(got[0], IsApplied());
  EXPECT_THAT(got[1], IsLeaseLost());
  EXPECT_THAT(got[2], IsLeaseLost());
  EXPECT_THAT(got[3], IsApplied());
  EXPECT_THAT(got[4], IsApplied());
  EXPECT_THAT(got[5], IsLeaseLost());
  EXPECT_THAT(got[6], IsApplied());  // the lease ran out, but no one took over
  EXPECT_THAT(got[7], IsLeaseLost());

  ExpectStored("a", Completed(Held("a", a, t0), t1, "A", Outcome::kFailure, 1min));
  ExpectStored("b", Held("b", b, t0));
  ExpectAbsent("absent");
  ExpectStored("e", Completed(Held("e", e, t0), t1, "", Outcome::kFailure, 1min));
  ExpectStored("f", Completed(Held("f", f, t0, kFpA), t1, "F", Outcome::kFailure, 1min));
  ExpectStored("done", Completed(Held("done", done, t0), t0, "D"));
  ExpectStored("late", Completed(Held("late", late, t0), t1, "L", Outcome::kFailure, 1min));
  ExpectStored("taken", Held("taken", taker, t0));  // a takeover keeps the creation time
}

TEST_P(StoreContractTest, CompleteBatchWithDuplicateKeyAppliesOnce) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  const std::vector<CompleteRequest> reqs = {CompleteOf("k", a.token, "first"),
                                             CompleteOf("k", a.token, "second")};
  const std::vector<Result<WriteAnswer>> got = store_->CompleteBatch(reqs);
  ASSERT_THAT(got, SizeIs(2u));
  EXPECT_THAT(got[0], IsApplied());
  EXPECT_THAT(got[1], IsLeaseLost());
  ExpectStored("k", Completed(Held("k", a, t0), t0, "first"));
}

// A batch of many distinct keys, of every kind, each named again later in the batch (a store may
// answer a batch's distinct keys in one set-based statement and the repeats after it): each
// request is answered as the same Begins one after another would be.
TEST_P(StoreContractTest, ALargeBeginBatchWithRepeatsAnswersAsBeginsInTurn) {
  const Timestamp t0 = clock_.Now();
  const Acquired busy = Acquire("busy", kFpA);
  const Acquired replay = Acquire("replay");
  Finish("replay", replay.token, "stored");
  const Acquired conflict = Acquire("conflict", kFpA);
  Finish("conflict", conflict.token, "a");
  const Acquired lapsed = Acquire("lapsed", std::nullopt, 500ms);
  const Acquired gone = Acquire("gone");
  Finish("gone", gone.token, "old", Outcome::kSuccess, 500ms);
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();

  // Enough distinct keys for a set-based statement (the PostgreSQL store's starts at 32).
  constexpr std::size_t kHalf = 20;
  std::vector<std::string> fresh;
  for (std::size_t i = 0; i < 2 * kHalf; ++i) fresh.push_back("new" + std::to_string(i));
  std::vector<BeginRequest> reqs;
  for (std::size_t i = 0; i < kHalf; ++i) reqs.push_back(BeginOf(fresh[i]));
  const std::size_t m = reqs.size();
  reqs.push_back(BeginOf("busy", kFpA));              // m
  reqs.push_back(BeginOf("replay"));                  // m + 1
  reqs.push_back(BeginOf("conflict", kFpB));          // m + 2
  reqs.push_back(BeginOf("lapsed"));                  // m + 3: a takeover
  reqs.push_back(BeginOf("gone", kFpB));              // m + 4: expired, so new
  reqs.push_back(BeginOf(""));                        // m + 5: invalid
  reqs.push_back(BeginOf("new3", std::nullopt, 1h));  // m + 6: repeats a new key
  reqs.push_back(BeginOf("lapsed"));                  // m + 7: repeats the takeover
  reqs.push_back(BeginOf("gone", kFpA));              // m + 8: repeats with another fingerprint
  for (std::size_t i = kHalf; i < 2 * kHalf; ++i) reqs.push_back(BeginOf(fresh[i], kFpB));
  reqs.push_back(BeginOf("new0"));  // last: repeats the first key
  const std::vector<Result<BeginAnswer>> got = store_->BeginBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));

  std::vector<Acquired> news;
  for (std::size_t n = 0; n < 2 * kHalf; ++n) {
    news.push_back(ExpectAcquired(got[n < kHalf ? n : m + 9 + (n - kHalf)]));
    EXPECT_EQ(news.back().attempt, 1u);
    EXPECT_THAT(news.back().lease_deadline, At(t1 + kLease));
  }
  EXPECT_THAT(ExpectBusy(got[m]).lease_deadline, At(t0 + kLease));
  EXPECT_THAT(ExpectReplay(got[m + 1]), ReplayIs(Replay{Outcome::kSuccess, "stored", 1}));
  ExpectConflict(got[m + 2]);
  const Acquired takeover = ExpectAcquired(got[m + 3]);
  EXPECT_EQ(takeover.attempt, 2u);
  EXPECT_GT(takeover.token, lapsed.token);
  const Acquired renewed = ExpectAcquired(got[m + 4]);
  EXPECT_EQ(renewed.attempt, 1u);
  EXPECT_GT(renewed.token, gone.token);
  EXPECT_THAT(got[m + 5], StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is empty")));
  EXPECT_THAT(ExpectBusy(got[m + 6]).lease_deadline, At(t1 + kLease));
  EXPECT_THAT(ExpectBusy(got[m + 7]).lease_deadline, At(t1 + kLease));
  ExpectConflict(got[m + 8]);
  EXPECT_THAT(ExpectBusy(got.back()).lease_deadline, At(t1 + kLease));

  for (std::size_t n = 0; n < kHalf; ++n) ExpectStored(fresh[n], Held(fresh[n], news[n], t1));
  for (std::size_t n = kHalf; n < 2 * kHalf; ++n) {
    ExpectStored(fresh[n], Held(fresh[n], news[n], t1, kFpB));
  }
  ExpectStored("busy", Held("busy", busy, t0, kFpA));
  ExpectStored("lapsed", Held("lapsed", takeover, t0));
  ExpectStored("gone", Held("gone", renewed, t1, kFpB));
}

// The same for completions: distinct keys of every kind, then repeats (a wrong token before
// the right one, the right one twice).
TEST_P(StoreContractTest, ALargeCompleteBatchWithRepeatsAnswersAsCompletesInTurn) {
  const Timestamp t0 = clock_.Now();
  std::vector<std::string> keys;
  std::vector<Acquired> held;
  for (int i = 0; i < 40; ++i) {  // enough for a set-based statement (PostgreSQL: 32)
    keys.push_back("k" + std::to_string(i));
    held.push_back(Acquire(keys.back()));
  }
  const Acquired done = Acquire("done");
  Finish("done", done.token, "D");
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();

  std::vector<std::string> responses;
  for (const std::string& k : keys) responses.push_back("R" + k);
  std::vector<CompleteRequest> reqs;
  reqs.push_back(CompleteOf("k3", held[3].token + 1, "thief"));  // 0: wrong token first
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i != 3) reqs.push_back(CompleteOf(keys[i], held[i].token, responses[i]));  // 1..n-1
  }
  const std::size_t n = keys.size();
  reqs.push_back(CompleteOf("done", done.token, "again"));                         // n
  reqs.push_back(CompleteOf("absent", 1, "x"));                                    // n + 1
  reqs.push_back(CompleteOf("k3", held[3].token, "R3", Outcome::kFailure, 1min));  // n + 2
  reqs.push_back(CompleteOf("k4", held[4].token, "second"));                       // n + 3
  const std::vector<Result<WriteAnswer>> got = store_->CompleteBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));
  EXPECT_THAT(got[0], IsLeaseLost());
  for (std::size_t i = 1; i < n; ++i) EXPECT_THAT(got[i], IsApplied()) << i;
  EXPECT_THAT(got[n], IsLeaseLost());
  EXPECT_THAT(got[n + 1], IsLeaseLost());
  EXPECT_THAT(got[n + 2], IsApplied());
  EXPECT_THAT(got[n + 3], IsLeaseLost());

  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i == 3) continue;
    ExpectStored(keys[i], Completed(Held(keys[i], held[i], t0), t1, responses[i]));
  }
  ExpectStored("k3", Completed(Held("k3", held[3], t0), t1, "R3", Outcome::kFailure, 1min));
  ExpectStored("done", Completed(Held("done", done, t0), t0, "D"));
  ExpectAbsent("absent");
}

// StartBatch answers as CompleteBatch then BeginBatch do (completes first: a begin of a key
// the same call completes replays it), or declines without calling back and changes nothing.
TEST_P(StoreContractTest, StartBatchAnswersAsCompleteBatchThenBeginBatch) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("a");
  const Acquired b = Acquire("b");
  const Acquired replay = Acquire("replay");
  Finish("replay", replay.token, "stored");
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();

  const std::vector<BeginRequest> begins = {BeginOf("new1"), BeginOf("a"), BeginOf(""),
                                            BeginOf("replay")};
  const std::vector<CompleteRequest> completes = {CompleteOf("a", a.token, "A"),
                                                  CompleteOf("b", b.token + 1, "thief")};
  // Shared with the callback, which may outlive a failed test.
  auto promise = std::make_shared<std::promise<BatchAnswers>>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  std::future<BatchAnswers> future = promise->get_future();
  const bool started =
      store_->StartBatch(begins, completes, [promise, calls](BatchAnswers answers) {
        if (calls->fetch_add(1) == 0) promise->set_value(std::move(answers));
      });
  if (!started) {
    EXPECT_EQ(calls->load(), 0);
    ExpectAbsent("new1");
    ExpectStored("a", Held("a", a, t0));
    return;
  }
  ASSERT_EQ(future.wait_for(30s), std::future_status::ready) << "done was never called";
  const BatchAnswers got = future.get();
  ASSERT_THAT(got.begins, SizeIs(begins.size()));
  ASSERT_THAT(got.completes, SizeIs(completes.size()));
  const Acquired new1 = ExpectAcquired(got.begins[0]);
  EXPECT_THAT(ExpectReplay(got.begins[1]), ReplayIs(Replay{Outcome::kSuccess, "A", 1}));
  EXPECT_THAT(got.begins[2], StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is empty")));
  EXPECT_THAT(ExpectReplay(got.begins[3]), ReplayIs(Replay{Outcome::kSuccess, "stored", 1}));
  EXPECT_THAT(got.completes[0], IsApplied());
  EXPECT_THAT(got.completes[1], IsLeaseLost());
  EXPECT_EQ(calls->load(), 1);

  ExpectStored("new1", Held("new1", new1, t1));
  ExpectStored("a", Completed(Held("a", a, t0), t1, "A"));
  ExpectStored("b", Held("b", b, t0));

  // Either side may be empty.
  auto only_begins = std::make_shared<std::promise<BatchAnswers>>();
  std::future<BatchAnswers> f2 = only_begins->get_future();
  ASSERT_TRUE(store_->StartBatch(
      std::vector<BeginRequest>{BeginOf("new2")}, {},
      [only_begins](BatchAnswers answers) { only_begins->set_value(std::move(answers)); }));
  ASSERT_EQ(f2.wait_for(30s), std::future_status::ready);
  const BatchAnswers got2 = f2.get();
  ASSERT_THAT(got2.begins, SizeIs(1u));
  EXPECT_THAT(got2.completes, IsEmpty());
  ExpectAcquired(got2.begins[0]);
}

// ExtendBatch answers as Extend would, request by request, in order: a held key, a wrong
// token, a bad request (changes nothing, the rest still answered), an absent key, a completed
// one, a key taken over after its lease ran out, one whose lease ran out with no taker (still
// its own), and a repeat of a key in the same batch.
TEST_P(StoreContractTest, ExtendBatchAnswersEachRequestInOrder) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("a", kFpA);
  const Acquired b = Acquire("b");
  const Acquired done = Acquire("done");
  Finish("done", done.token, "D");
  const Acquired late = Acquire("late", std::nullopt, 500ms);
  const Acquired taken = Acquire("taken", std::nullopt, 500ms);
  clock_.Advance(1s);
  const Timestamp t1 = clock_.Now();
  const Acquired taker = Acquire("taken");

  const auto extend = [&](std::string_view key, Token token, std::chrono::milliseconds lease) {
    return ExtendRequest{.scope = Scope(), .key = key, .token = token, .lease = lease};
  };
  const std::vector<ExtendRequest> reqs = {
      extend("a", a.token, 1min),         extend("b", b.token + 1, 1min),
      extend("", a.token, 1min),          extend("b", b.token, 0ms),
      extend("absent", 1, 1min),          extend("done", done.token, 1min),
      extend("taken", taken.token, 1min), extend("late", late.token, 2min),
      extend("a", a.token, 3min),
  };
  const std::vector<Result<WriteAnswer>> got = store_->ExtendBatch(reqs);
  ASSERT_THAT(got, SizeIs(reqs.size()));
  EXPECT_THAT(got[0], IsApplied());
  EXPECT_THAT(got[1], IsLeaseLost());
  EXPECT_THAT(got[2], StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is empty")));
  EXPECT_THAT(got[3], StatusIs(StatusCode::kInvalidArgument, HasSubstr("lease")));
  EXPECT_THAT(got[4], IsLeaseLost());
  EXPECT_THAT(got[5], IsLeaseLost());
  EXPECT_THAT(got[6], IsLeaseLost());
  EXPECT_THAT(got[7], IsApplied());  // the lease ran out, but no one took over
  EXPECT_THAT(got[8], IsApplied());  // the later request for a key wins

  ExpectStored("a", Held("a", Acquired{a.token, 1, t1 + 3min}, t0, kFpA));
  ExpectStored("b", Held("b", b, t0));
  ExpectAbsent("absent");
  ExpectStored("done", Completed(Held("done", done, t0), t0, "D"));
  ExpectStored("taken", Held("taken", taker, t0));
  ExpectStored("late", Held("late", Acquired{late.token, 1, t1 + 2min}, t0));
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("late"))).lease_deadline, At(t1 + 2min));
}

TEST_P(StoreContractTest, EmptyBatchesAnswerNothing) {
  EXPECT_THAT(store_->BeginBatch({}), IsEmpty());
  EXPECT_THAT(store_->CompleteBatch({}), IsEmpty());
  EXPECT_THAT(store_->ExtendBatch({}), IsEmpty());
}

// ==== operator calls ===========================================================================

TEST_P(StoreContractTest, GetReturnsEveryField) {
  clock_.Advance(123ms);
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("order-42", kFpA, 45s);
  Record want;
  want.scope = Scope();
  want.key = "order-42";
  want.state = RecordState::kInProgress;
  want.fingerprint = kFpA;
  want.token = a.token;
  want.attempt = 1;
  want.created = t0;
  want.lease_deadline = t0 + 45s;
  want.expires = t0 + 45s + AbandonedRetention();
  ExpectStored("order-42", want);

  clock_.Advance(7s);
  ASSERT_THAT(
      store_->Complete(CompleteOf("order-42", a.token, "{\"id\":42}", Outcome::kFailure, 2h)),
      IsApplied());
  want.state = RecordState::kCompleted;
  want.outcome = Outcome::kFailure;
  want.response = "{\"id\":42}";
  want.expires = t0 + 7s + 2h;
  ExpectStored("order-42", want);
}

TEST_P(StoreContractTest, GetOfAbsentKeyIsEmpty) {
  EXPECT_THAT(store_->Get(Scope(), "never"), HoldsValue(IsNone()));
}

TEST_P(StoreContractTest, ListFiltersByState) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("a");
  const Acquired b = Acquire("b", kFpA);
  const Acquired c = Acquire("c");
  Finish("c", c.token, "C");

  EXPECT_THAT(store_->List(ListFilter{.state = RecordState::kInProgress, .scope = Scope()}),
              HoldsValue(UnorderedElementsAre(RecordIs(Held("a", a, t0)),
                                              RecordIs(Held("b", b, t0, kFpA)))));
  EXPECT_THAT(store_->List(ListFilter{.state = RecordState::kCompleted, .scope = Scope()}),
              HoldsValue(UnorderedElementsAre(RecordIs(Completed(Held("c", c, t0), t0, "C")))));
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope()}), HoldsValue(SizeIs(3u)));
}

TEST_P(StoreContractTest, ListFiltersByScope) {
  const std::string other = Scope() + "/other";
  const Timestamp t0 = clock_.Now();
  const Acquired mine = Acquire("k");
  const Acquired theirs = ExpectAcquired(store_->Begin(BeginRequest{.scope = other, .key = "k"}));
  Record theirs_record = Held("k", theirs, t0);
  theirs_record.scope = other;

  EXPECT_THAT(store_->List(ListFilter{.scope = Scope()}),
              HoldsValue(UnorderedElementsAre(RecordIs(Held("k", mine, t0)))));
  EXPECT_THAT(store_->List(ListFilter{.scope = other}),
              HoldsValue(UnorderedElementsAre(RecordIs(theirs_record))));
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope() + "/none"}), HoldsValue(IsEmpty()));
}

TEST_P(StoreContractTest, ListFiltersByCreatedBefore) {
  const Timestamp t0 = clock_.Now();
  const Acquired old1 = Acquire("old", std::nullopt, 1h);
  clock_.Advance(10s);
  const Timestamp t1 = clock_.Now();
  const Acquired mid = Acquire("mid", std::nullopt, 1h);
  clock_.Advance(10s);
  Acquire("new", std::nullopt, 1h);

  // "IN_PROGRESS older than X": created strictly before X.
  EXPECT_THAT(store_->List(ListFilter{
                  .state = RecordState::kInProgress, .scope = Scope(), .created_before = t1}),
              HoldsValue(UnorderedElementsAre(RecordIs(Held("old", old1, t0)))));
  EXPECT_THAT(store_->List(ListFilter{
                  .state = RecordState::kInProgress, .scope = Scope(), .created_before = t1 + 1ms}),
              HoldsValue(UnorderedElementsAre(RecordIs(Held("old", old1, t0)),
                                              RecordIs(Held("mid", mid, t1)))));
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope(), .created_before = t0}),
              HoldsValue(IsEmpty()));
}

TEST_P(StoreContractTest, ListHonoursLimit) {
  for (const char* key : {"a", "b", "c", "d", "e"}) Acquire(key);
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope(), .limit = 2}), HoldsValue(SizeIs(2u)));
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope(), .limit = 5}), HoldsValue(SizeIs(5u)));
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope(), .limit = 100}), HoldsValue(SizeIs(5u)));
}

TEST_P(StoreContractTest, ListSkipsExpiredRecords) {
  const Acquired a = Acquire("short");
  Finish("short", a.token, "", Outcome::kSuccess, 1s);
  const Acquired b = Acquire("long");
  Finish("long", b.token, "", Outcome::kSuccess, 1h);
  clock_.Advance(1s);
  const Result<std::vector<Record>> got = store_->List(ListFilter{.scope = Scope()});
  ASSERT_TRUE(got.has_value()) << got.error().ToString();
  ASSERT_THAT(*got, SizeIs(1u));
  EXPECT_EQ((*got)[0].key, "long");
}

TEST_P(StoreContractTest, EraseRemovesRecordWhateverItsState) {
  const Acquired held = Acquire("held");
  const Acquired done = Acquire("done");
  Finish("done", done.token, "x");

  EXPECT_THAT(store_->Erase(Scope(), "held"), HoldsValue(true));
  ExpectAbsent("held");
  EXPECT_THAT(store_->Complete(CompleteOf("held", held.token)), IsLeaseLost());
  EXPECT_THAT(store_->Erase(Scope(), "held"), HoldsValue(false));

  EXPECT_THAT(store_->Erase(Scope(), "done"), HoldsValue(true));
  ExpectAbsent("done");
  EXPECT_THAT(store_->Erase(Scope(), "never"), HoldsValue(false));

  const Timestamp t1 = clock_.Now();
  const Acquired again = ExpectAcquired(store_->Begin(BeginOf("done")));
  EXPECT_EQ(again.attempt, 1u);
  EXPECT_GT(again.token, done.token);
  ExpectStored("done", Held("done", again, t1));
}

// ==== scopes ===================================================================================

TEST_P(StoreContractTest, SameKeyInTwoScopesIsTwoRecords) {
  const std::string other = Scope() + "/tenant-b";
  const Timestamp t0 = clock_.Now();
  const Acquired mine = Acquire("k", kFpA);
  const Acquired theirs =
      ExpectAcquired(store_->Begin(BeginRequest{.scope = other, .key = "k", .fingerprint = kFpB}));
  EXPECT_EQ(theirs.attempt, 1u);

  Finish("k", mine.token, "mine");
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginRequest{.scope = other, .key = "k"})).lease_deadline,
              At(t0 + kLease));
  EXPECT_THAT(store_->Complete(CompleteRequest{.scope = other, .key = "k", .token = mine.token}),
              IsLeaseLost());

  ExpectStored("k", Completed(Held("k", mine, t0, kFpA), t0, "mine"));
  Record theirs_record = Held("k", theirs, t0, kFpB);
  theirs_record.scope = other;
  EXPECT_THAT(store_->Get(other, "k"), HoldsValue(Optional(RecordIs(theirs_record))));
}

TEST_P(StoreContractTest, EmptyScopeIsAllowed) {
  const std::string key = Scope();  // unique, since the empty scope is shared by every test
  const Timestamp t0 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->Begin(BeginRequest{.scope = "", .key = key}));
  EXPECT_THAT(store_->Complete(CompleteRequest{
                  .scope = "", .key = key, .token = a.token, .response = "empty scope"}),
              IsApplied());
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginRequest{.scope = "", .key = key})),
              ReplayIs(Replay{Outcome::kSuccess, "empty scope", 1}));
  Record want = Completed(Held(key, a, t0), t0, "empty scope", Outcome::kSuccess,
                          CompleteRequest{}.retention);
  want.scope = "";
  EXPECT_THAT(store_->Get("", key), HoldsValue(Optional(RecordIs(want))));
  ExpectAbsent(key);  // not in Scope()
  EXPECT_THAT(store_->Erase("", key), HoldsValue(true));
}

// ==== bad input: a specific code and message, and nothing changes ==============================

TEST_P(StoreContractTest, EmptyKeyIsRejected) {
  const auto empty_key = StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is empty"));
  EXPECT_THAT(store_->Begin(BeginOf("")), empty_key);
  EXPECT_THAT(store_->Complete(CompleteOf("", 1)), empty_key);
  EXPECT_THAT(store_->Release(Scope(), "", 1), empty_key);
  EXPECT_THAT(store_->Extend(Scope(), "", 1, kLease), empty_key);
  EXPECT_THAT(store_->Get(Scope(), ""), empty_key);
  EXPECT_THAT(store_->Erase(Scope(), ""), empty_key);
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope()}), HoldsValue(IsEmpty()));
}

TEST_P(StoreContractTest, KeyOverDefaultLimitIsRejected) {
  const std::string too_long(kDefaultMaxKeyBytes + 1, 'k');
  const std::string longest(kDefaultMaxKeyBytes, 'k');
  const auto rejected =
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is 256 bytes; the limit is 255"));
  EXPECT_THAT(store_->Begin(BeginOf(too_long)), rejected);
  EXPECT_THAT(store_->Complete(CompleteOf(too_long, 1)), rejected);
  EXPECT_THAT(store_->Release(Scope(), too_long, 1), rejected);
  EXPECT_THAT(store_->Extend(Scope(), too_long, 1, kLease), rejected);
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope()}), HoldsValue(IsEmpty()));

  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire(longest);
  Finish(longest, a.token, "ok");
  ExpectStored(longest, Completed(Held(longest, a, t0), t0, "ok"));
}

TEST_P(StoreContractTest, KeyLimitIsConfigurable) {
  store_ = MakeStore(16);
  ASSERT_NE(store_, nullptr);
  const auto rejected =
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("key is 17 bytes; the limit is 16"));
  EXPECT_THAT(store_->Begin(BeginOf("0123456789abcdefg")), rejected);
  EXPECT_THAT(store_->Complete(CompleteOf("0123456789abcdefg", 1)), rejected);
  EXPECT_THAT(store_->List(ListFilter{.scope = Scope()}), HoldsValue(IsEmpty()));

  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("0123456789abcdef");
  Finish("0123456789abcdef", a.token, "ok");
  ExpectStored("0123456789abcdef", Completed(Held("0123456789abcdef", a, t0), t0, "ok"));
}

TEST_P(StoreContractTest, KeyLimitAppliesToClientIdAndEntity) {
  store_ = MakeStore(16);
  ASSERT_NE(store_, nullptr);
  const std::string_view too_long = "0123456789abcdefg";
  const std::string_view longest = "0123456789abcdef";
  EXPECT_THAT(store_->OpenSession(SessionOf(too_long)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("client id is 17 bytes")));
  EXPECT_THAT(store_->BeginSequenced(SeqOf(too_long, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("client id is 17 bytes")));
  EXPECT_THAT(store_->BeginVersioned(VersionOf(too_long, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("entity is 17 bytes")));

  ASSERT_TRUE(store_->OpenSession(SessionOf(longest)).has_value());
  ExpectAcquired(store_->BeginSequenced(SeqOf(longest, 1)));
  ExpectAcquired(store_->BeginVersioned(VersionOf(longest, 1)));
}

TEST_P(StoreContractTest, ScopeOverLimitIsRejected) {
  std::string longest = Scope();
  longest.resize(kMaxScopeBytes, 's');
  const std::string too_long = longest + "s";
  const auto rejected =
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("scope is 256 bytes; the limit is 255"));
  EXPECT_THAT(store_->Begin(BeginRequest{.scope = too_long, .key = "k"}), rejected);
  EXPECT_THAT(store_->Complete(CompleteRequest{.scope = too_long, .key = "k", .token = 1}),
              rejected);
  EXPECT_THAT(store_->Get(too_long, "k"), rejected);
  EXPECT_THAT(store_->OpenSession({.scope = too_long, .client_id = "c"}), rejected);
  EXPECT_THAT(store_->BeginVersioned({.scope = too_long, .entity = "e", .version = 1}), rejected);

  const Acquired a = ExpectAcquired(store_->Begin(BeginRequest{.scope = longest, .key = "k"}));
  EXPECT_THAT(store_->Get(longest, "k"),
              HoldsValue(Optional(::testing::Field(&Record::token, a.token))));
}

TEST_P(StoreContractTest, NonPositiveLeaseIsRejected) {
  const auto rejected = StatusIs(StatusCode::kInvalidArgument, HasSubstr("lease must be positive"));
  EXPECT_THAT(store_->Begin(BeginOf("k", std::nullopt, 0ms)), rejected);
  EXPECT_THAT(store_->Begin(BeginOf("k", std::nullopt, -1ms)), rejected);
  ExpectAbsent("k");

  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("held");
  EXPECT_THAT(store_->Extend(Scope(), "held", a.token, 0ms), rejected);
  EXPECT_THAT(store_->Extend(Scope(), "held", a.token, -5s), rejected);
  ExpectStored("held", Held("held", a, t0));

  ASSERT_TRUE(store_->OpenSession(SessionOf("c")).has_value());
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 1, 0, std::nullopt, 0ms)), rejected);
  EXPECT_THAT(store_->OpenSession(SessionOf("c")),
              HoldsValue(::testing::Field(&SessionInfo::outstanding, 0u)));
  EXPECT_THAT(store_->BeginVersioned(VersionOf("e", 1, -1ms)), rejected);
  EXPECT_THAT(store_->GetVersion(Scope(), "e"), HoldsValue(IsNone()));
}

TEST_P(StoreContractTest, NonPositiveRetentionIsRejected) {
  const auto rejected =
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("retention must be positive"));
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k");
  EXPECT_THAT(store_->Complete(CompleteOf("k", a.token, "x", Outcome::kSuccess, 0ms)), rejected);
  EXPECT_THAT(store_->Complete(CompleteOf("k", a.token, "x", Outcome::kSuccess, -1h)), rejected);
  ExpectStored("k", Held("k", a, t0));
  Finish("k", a.token, "ok");

  const Acquired v = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1)));
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", v.token, 0ms)), rejected);
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(::testing::Field(&EntityVersion::in_progress, Optional(1u)))));
}

TEST_P(StoreContractTest, SequenceNumberZeroIsRejected) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c")).has_value());
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 0)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("sequence number 0")));
  EXPECT_THAT(store_->OpenSession(SessionOf("c")),
              HoldsValue(::testing::Field(&SessionInfo::outstanding, 0u)));
}

TEST_P(StoreContractTest, BadSessionSettingsAreRejected) {
  EXPECT_THAT(store_->OpenSession(SessionOf("c", 0ms)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("session ttl must be positive")));
  EXPECT_THAT(store_->OpenSession(SessionOf("c", -1s)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("session ttl must be positive")));
  EXPECT_THAT(
      store_->OpenSession(SessionOf("c", kSessionTtl, 0)),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("session window must be at least 1")));
  // Nothing was registered.
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 1)),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
}

TEST_P(StoreContractTest, EmptyClientIdIsRejected) {
  const auto rejected = StatusIs(StatusCode::kInvalidArgument, HasSubstr("client id is empty"));
  EXPECT_THAT(store_->OpenSession(SessionOf("")), rejected);
  EXPECT_THAT(store_->BeginSequenced(SeqOf("", 1)), rejected);
}

TEST_P(StoreContractTest, VersionZeroIsRejected) {
  EXPECT_THAT(store_->BeginVersioned(VersionOf("e", 0)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("version 0")));
  EXPECT_THAT(store_->GetVersion(Scope(), "e"), HoldsValue(IsNone()));
}

TEST_P(StoreContractTest, EmptyEntityIsRejected) {
  EXPECT_THAT(store_->BeginVersioned(VersionOf("", 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("entity is empty")));
}

// ==== client sessions (SPEC §4) ================================================================

TEST_P(StoreContractTest, OpenSessionReturnsInfo) {
  const Timestamp t0 = clock_.Now();
  EXPECT_THAT(store_->OpenSession(SessionOf("c", kSessionTtl, kWindow)),
              HoldsValue(SessionIs(SessionInfo{Scope(), "c", 0, kWindow, 0, t0 + kSessionTtl})));
  // Opening again refreshes the expiry and takes the new window.
  clock_.Advance(1min);
  EXPECT_THAT(store_->OpenSession(SessionOf("c", kSessionTtl, 3)),
              HoldsValue(SessionIs(SessionInfo{Scope(), "c", 0, 3, 0, t0 + 1min + kSessionTtl})));
}

TEST_P(StoreContractTest, SequencedRequestsAreAcquiredAndCompleted) {
  const Timestamp t0 = clock_.Now();
  ASSERT_TRUE(store_->OpenSession(SessionOf("c", kSessionTtl, kWindow)).has_value());
  for (std::uint64_t seq = 1; seq <= 5; ++seq) {
    const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq, 0)));
    EXPECT_EQ(a.attempt, 1u);
    EXPECT_THAT(a.lease_deadline, At(t0 + kLease));
    EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", seq, a.token, "r" + std::to_string(seq))),
                IsApplied());
  }
  for (std::uint64_t seq = 1; seq <= 5; ++seq) {
    EXPECT_THAT(ExpectReplay(store_->BeginSequenced(SeqOf("c", seq))),
                ReplayIs(Replay{Outcome::kSuccess, "r" + std::to_string(seq), 1}));
  }
  EXPECT_THAT(store_->OpenSession(SessionOf("c", kSessionTtl, kWindow)),
              HoldsValue(SessionIs(SessionInfo{Scope(), "c", 0, kWindow, 5, t0 + kSessionTtl})));
}

TEST_P(StoreContractTest, SequencedRecordAnswersAsBegin) {
  const Timestamp t0 = clock_.Now();
  ASSERT_TRUE(store_->OpenSession(SessionOf("c")).has_value());
  const SequencedBeginRequest one = SeqOf("c", 1, 0, kFpA);
  const Acquired a = ExpectAcquired(store_->BeginSequenced(one));
  EXPECT_THAT(ExpectBusy(store_->BeginSequenced(one)).lease_deadline, At(t0 + kLease));
  SequencedBeginRequest other = one;
  other.fingerprint = kFpB;
  ExpectConflict(store_->BeginSequenced(other));

  clock_.Advance(kLease);  // takeover
  const Acquired b = ExpectAcquired(store_->BeginSequenced(one));
  EXPECT_EQ(b.attempt, 2u);
  EXPECT_TRUE(b.takeover);
  EXPECT_FALSE(a.takeover);
  EXPECT_GT(b.token, a.token);
  EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, a.token, "old")), IsLeaseLost());
  EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, b.token, "declined", Outcome::kFailure)),
              IsApplied());
  EXPECT_THAT(ExpectReplay(store_->BeginSequenced(one)),
              ReplayIs(Replay{Outcome::kFailure, "declined", 2}));
  ExpectConflict(store_->BeginSequenced(other));
}

TEST_P(StoreContractTest, SequencedNumbersMayArriveOutOfOrder) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c", kSessionTtl, kWindow)).has_value());
  std::map<std::uint64_t, Token> tokens;
  for (std::uint64_t seq : {5u, 2u, 8u, 1u}) {
    const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq)));
    EXPECT_EQ(a.attempt, 1u) << "seq " << seq;
    tokens[seq] = a.token;
  }
  for (auto [seq, token] : tokens) {
    EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", seq, token, std::to_string(seq))),
                IsApplied());
  }
  EXPECT_THAT(ExpectReplay(store_->BeginSequenced(SeqOf("c", 8))).response, "8");
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 0),
              HoldsValue(::testing::Field(&SessionInfo::outstanding, 4u)));
}

TEST_P(StoreContractTest, AcknowledgeDropsRecordsAndMakesThemStale) {
  const Timestamp t0 = clock_.Now();
  ASSERT_TRUE(store_->OpenSession(SessionOf("c", kSessionTtl, kWindow)).has_value());
  for (std::uint64_t seq = 1; seq <= 4; ++seq) {
    const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq)));
    if (seq != 4) {
      EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", seq, a.token)), IsApplied());
    }
  }
  const Result<SessionInfo> info = store_->Acknowledge(Scope(), "c", 2);
  ASSERT_TRUE(info.has_value()) << info.error().ToString();
  EXPECT_EQ(info->low_water, 2u);
  EXPECT_EQ(info->outstanding, 2u);
  EXPECT_EQ(info->window, kWindow);

  // Acknowledged numbers are never executed again.
  ExpectStale(store_->BeginSequenced(SeqOf("c", 1)));
  ExpectStale(store_->BeginSequenced(SeqOf("c", 2)));
  EXPECT_THAT(ExpectReplay(store_->BeginSequenced(SeqOf("c", 3))).attempt, 1u);
  ExpectBusy(store_->BeginSequenced(SeqOf("c", 4)));

  // A lower acknowledgement does not lower the mark.
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 1),
              HoldsValue(::testing::Field(&SessionInfo::low_water, 2u)));
  EXPECT_THAT(store_->OpenSession(SessionOf("c", kSessionTtl, kWindow)),
              HoldsValue(SessionIs(SessionInfo{Scope(), "c", 2, kWindow, 2, t0 + kSessionTtl})));
}

TEST_P(StoreContractTest, WindowBoundsOutstandingNumbers) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c", kSessionTtl, 4)).has_value());
  const Acquired one = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 1)));
  ExpectAcquired(store_->BeginSequenced(SeqOf("c", 4)));
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 5)),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("window")));
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 100)),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("window")));
  // Refused, not recorded.
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 0),
              HoldsValue(::testing::Field(&SessionInfo::outstanding, 2u)));

  ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, one.token)), IsApplied());
  ASSERT_TRUE(store_->Acknowledge(Scope(), "c", 1).has_value());
  const Acquired five = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 5)));
  EXPECT_EQ(five.attempt, 1u);
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 6)),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("window")));
}

TEST_P(StoreContractTest, AckInsideBeginSequencedIsAppliedFirst) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c", kSessionTtl, 4)).has_value());
  for (std::uint64_t seq = 1; seq <= 2; ++seq) {
    const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq)));
    ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c", seq, a.token)), IsApplied());
  }
  // 6 is past the window of 4 above 0, but not above the acknowledged 2.
  const Acquired six = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 6, 2)));
  EXPECT_EQ(six.attempt, 1u);
  ExpectStale(store_->BeginSequenced(SeqOf("c", 2)));
  ExpectStale(store_->BeginSequenced(SeqOf("c", 1)));
  const Result<SessionInfo> info = store_->Acknowledge(Scope(), "c", 0);
  ASSERT_TRUE(info.has_value()) << info.error().ToString();
  EXPECT_EQ(info->low_water, 2u);
  EXPECT_EQ(info->outstanding, 1u);
  // A request cannot acknowledge itself or a later number (the client cannot have their
  // responses): that was answered Stale, so a request that never ran was dropped.
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 6, 6)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("acknowledgement 6 is not below")));
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 3, 9)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("acknowledgement 9 is not below")));
  // Refused whole: the acknowledgement was not applied either.
  const Result<SessionInfo> after = store_->Acknowledge(Scope(), "c", 0);
  ASSERT_TRUE(after.has_value()) << after.error().ToString();
  EXPECT_EQ(after->low_water, 2u);
  EXPECT_EQ(after->outstanding, 1u);
}

TEST_P(StoreContractTest, UnknownSessionIsRefused) {
  EXPECT_THAT(store_->BeginSequenced(SeqOf("nobody", 1)),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
  EXPECT_THAT(store_->Acknowledge(Scope(), "nobody", 1),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
  // A session is per scope.
  ASSERT_TRUE(store_->OpenSession(SessionOf("c")).has_value());
  EXPECT_THAT(store_->BeginSequenced({.scope = Scope() + "/other", .client_id = "c", .seq = 1}),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
}

TEST_P(StoreContractTest, SessionExpiresAfterIdleTtl) {
  const SessionRequest open = SessionOf("c", 10s);
  ASSERT_TRUE(store_->OpenSession(open).has_value());
  const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 1)));
  ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, a.token)), IsApplied());

  // Activity keeps it alive far past one ttl: requests and re-opening both count.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(10s - 1ms);
    ExpectReplay(store_->BeginSequenced(SeqOf("c", 1)));
    clock_.Advance(10s - 1ms);
    const Timestamp now = clock_.Now();
    EXPECT_THAT(store_->OpenSession(open),
                HoldsValue(::testing::Field(&SessionInfo::expires, At(now + 10s))));
  }

  clock_.Advance(10s);  // idle for a whole ttl
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 1)),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
  EXPECT_THAT(store_->BeginSequenced(SeqOf("c", 2)),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 1),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("session")));
}

TEST_P(StoreContractTest, ReopenAfterExpiryStartsFresh) {
  const SessionRequest open = SessionOf("c", 10s, kWindow);
  ASSERT_TRUE(store_->OpenSession(open).has_value());
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq)));
    ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c", seq, a.token)), IsApplied());
  }
  ASSERT_TRUE(store_->Acknowledge(Scope(), "c", 1).has_value());
  clock_.Advance(10s);
  const Timestamp t1 = clock_.Now();
  EXPECT_THAT(store_->OpenSession(open),
              HoldsValue(SessionIs(SessionInfo{Scope(), "c", 0, kWindow, 0, t1 + 10s})));
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    EXPECT_EQ(ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq))).attempt, 1u) << "seq " << seq;
  }
}

TEST_P(StoreContractTest, SequencedRecordsLiveAsLongAsTheSession) {
  const SessionRequest open = SessionOf("c", 36h);
  ASSERT_TRUE(store_->OpenSession(open).has_value());
  const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 1)));
  ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, a.token, "kept")), IsApplied());
  // Thirty days, re-opened once a day: far past every retention but the session's.
  for (int day = 0; day < 30; ++day) {
    clock_.Advance(24h);
    ASSERT_TRUE(store_->OpenSession(open).has_value());
  }
  EXPECT_THAT(ExpectReplay(store_->BeginSequenced(SeqOf("c", 1))),
              ReplayIs(Replay{Outcome::kSuccess, "kept", 1}));
}

TEST_P(StoreContractTest, ReleaseSequencedLetsTheNumberRunAgain) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c")).has_value());
  const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 1)));
  EXPECT_THAT(store_->ReleaseSequenced(Scope(), "c", 1, a.token + 1), IsLeaseLost());
  ExpectBusy(store_->BeginSequenced(SeqOf("c", 1)));
  EXPECT_THAT(store_->ReleaseSequenced(Scope(), "c", 1, a.token), IsApplied());
  EXPECT_THAT(store_->ReleaseSequenced(Scope(), "c", 1, a.token), IsLeaseLost());
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 0),
              HoldsValue(::testing::Field(&SessionInfo::outstanding, 0u)));

  const Acquired b = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 1)));
  EXPECT_EQ(b.attempt, 1u);
  EXPECT_GT(b.token, a.token);
}

TEST_P(StoreContractTest, SequencedWritesWithWrongTokenAreLeaseLost) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c")).has_value());
  EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, 1)), IsLeaseLost());
  EXPECT_THAT(store_->ReleaseSequenced(Scope(), "c", 1, 1), IsLeaseLost());

  const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", 1)));
  EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, a.token + 1)), IsLeaseLost());
  ExpectBusy(store_->BeginSequenced(SeqOf("c", 1)));
  EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, a.token, "done")), IsApplied());
  EXPECT_THAT(store_->CompleteSequenced(SeqDoneOf("c", 1, a.token, "again")), IsLeaseLost());
  EXPECT_THAT(store_->ReleaseSequenced(Scope(), "c", 1, a.token), IsLeaseLost());
  EXPECT_THAT(ExpectReplay(store_->BeginSequenced(SeqOf("c", 1))).response, "done");
}

TEST_P(StoreContractTest, SessionsArePerClient) {
  ASSERT_TRUE(store_->OpenSession(SessionOf("c1")).has_value());
  ASSERT_TRUE(store_->OpenSession(SessionOf("c2")).has_value());
  const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c1", 1)));
  ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c1", 1, a.token)), IsApplied());
  ASSERT_TRUE(store_->Acknowledge(Scope(), "c1", 1).has_value());
  EXPECT_EQ(ExpectAcquired(store_->BeginSequenced(SeqOf("c2", 1))).attempt, 1u);
}

// ==== versioned entities (SPEC §5) =============================================================

TEST_P(StoreContractTest, VersionIsAcquiredThenApplied) {
  EXPECT_THAT(store_->GetVersion(Scope(), "e"), HoldsValue(IsNone()));
  const Timestamp t0 = clock_.Now();
  const Acquired a = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1, 1min)));
  EXPECT_EQ(a.attempt, 1u);
  EXPECT_THAT(a.lease_deadline, At(t0 + 1min));
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(VersionIs(EntityVersion{Scope(), "e", 0, 1, a.token, 1, t0 + 1min,
                                                          t0 + 1min + AbandonedRetention()}))));

  clock_.Advance(1s);
  const Timestamp tc = clock_.Now();
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token, 2h)), IsApplied());
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(
                  VersionIs(EntityVersion{Scope(), "e", 1, std::nullopt, 0, 0, {}, tc + 2h}))));
}

TEST_P(StoreContractTest, AppliedVersionAgainIsStale) {
  const Acquired a = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1)));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token)), IsApplied());
  ExpectStale(store_->BeginVersioned(VersionOf("e", 1)));
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(::testing::Field(&EntityVersion::applied, 1u))));
}

TEST_P(StoreContractTest, LowerVersionAfterHigherIsStale) {
  const Acquired v3 = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 3)));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", v3.token)), IsApplied());
  ExpectStale(store_->BeginVersioned(VersionOf("e", 2)));
  ExpectStale(store_->BeginVersioned(VersionOf("e", 3)));
  const Acquired v4 = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 4)));
  EXPECT_GT(v4.token, v3.token);
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(
                  ::testing::AllOf(::testing::Field(&EntityVersion::applied, 3u),
                                   ::testing::Field(&EntityVersion::in_progress, Optional(4u))))));
}

TEST_P(StoreContractTest, OneVersionInProgressAtATime) {
  const Timestamp t0 = clock_.Now();
  const Acquired v1 = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1)));
  EXPECT_THAT(ExpectBusy(store_->BeginVersioned(VersionOf("e", 2))).lease_deadline,
              At(t0 + kLease));
  EXPECT_THAT(ExpectBusy(store_->BeginVersioned(VersionOf("e", 1))).lease_deadline,
              At(t0 + kLease));
  EXPECT_THAT(
      store_->GetVersion(Scope(), "e"),
      HoldsValue(Optional(VersionIs(EntityVersion{Scope(), "e", 0, 1, v1.token, 1, t0 + kLease,
                                                  t0 + kLease + AbandonedRetention()}))));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", v1.token)), IsApplied());
  const Acquired v2 = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 2)));
  EXPECT_EQ(v2.attempt, 1u);
  EXPECT_FALSE(v2.takeover);
}

TEST_P(StoreContractTest, VersionTakeoverAfterLease) {
  const Acquired first = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 5)));
  EXPECT_FALSE(first.takeover);
  clock_.Advance(kLease);
  const Timestamp t1 = clock_.Now();
  const Acquired again = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 5)));
  EXPECT_EQ(again.attempt, 2u);
  EXPECT_TRUE(again.takeover);
  EXPECT_GT(again.token, first.token);
  EXPECT_THAT(again.lease_deadline, At(t1 + kLease));
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", first.token)), IsLeaseLost());
  EXPECT_THAT(store_->ReleaseVersioned(Scope(), "e", first.token), IsLeaseLost());

  // A different version taking over starts at attempt 1, and is a takeover all the same.
  clock_.Advance(kLease);
  const Acquired other = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 6)));
  EXPECT_EQ(other.attempt, 1u);
  EXPECT_TRUE(other.takeover);
  EXPECT_GT(other.token, again.token);
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", again.token)), IsLeaseLost());
  const Timestamp tc = clock_.Now();
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", other.token, 1h)), IsApplied());
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(
                  VersionIs(EntityVersion{Scope(), "e", 6, std::nullopt, 0, 0, {}, tc + 1h}))));
  ExpectStale(store_->BeginVersioned(VersionOf("e", 5)));
}

TEST_P(StoreContractTest, CompleteVersionedWithStaleTokenIsLeaseLost) {
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", 1)), IsLeaseLost());
  EXPECT_THAT(store_->GetVersion(Scope(), "e"), HoldsValue(IsNone()));
  const Acquired a = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1)));
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token + 1)), IsLeaseLost());
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(
                  ::testing::AllOf(::testing::Field(&EntityVersion::applied, 0u),
                                   ::testing::Field(&EntityVersion::in_progress, Optional(1u))))));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token)), IsApplied());
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token)), IsLeaseLost());
}

TEST_P(StoreContractTest, ReleaseVersionedLetsNextBeginAcquire) {
  const Acquired v1 = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1)));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", v1.token)), IsApplied());
  const Acquired v2 = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 2)));
  EXPECT_THAT(store_->ReleaseVersioned(Scope(), "e", v2.token + 1), IsLeaseLost());
  EXPECT_THAT(store_->ReleaseVersioned(Scope(), "e", v2.token), IsApplied());
  EXPECT_THAT(store_->ReleaseVersioned(Scope(), "e", v2.token), IsLeaseLost());
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(
                  ::testing::AllOf(::testing::Field(&EntityVersion::applied, 1u),
                                   ::testing::Field(&EntityVersion::in_progress, IsNone())))));
  const Acquired again = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 2)));
  EXPECT_EQ(again.attempt, 1u);
  EXPECT_FALSE(again.takeover);  // released, not abandoned
  EXPECT_GT(again.token, v2.token);
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", v2.token)), IsLeaseLost());
}

TEST_P(StoreContractTest, EntityIsForgottenAfterRetention) {
  const Acquired a = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 7)));
  const Timestamp tc = clock_.Now();
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token, 1h)), IsApplied());
  clock_.Set(tc + 1h - 1ms);
  ExpectStale(store_->BeginVersioned(VersionOf("e", 7)));
  clock_.Set(tc + 1h);
  EXPECT_THAT(store_->GetVersion(Scope(), "e"), HoldsValue(IsNone()));
  const Acquired b = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 3)));
  EXPECT_EQ(b.attempt, 1u);
  EXPECT_GT(b.token, a.token);
}

TEST_P(StoreContractTest, EntitiesArePerScopeAndName) {
  const Acquired a = ExpectAcquired(store_->BeginVersioned(VersionOf("e1", 2)));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e1", a.token)), IsApplied());
  ExpectAcquired(store_->BeginVersioned(VersionOf("e2", 1)));
  ExpectAcquired(
      store_->BeginVersioned({.scope = Scope() + "/other", .entity = "e1", .version = 1}));
}

// ==== races: real threads, no sleeps ===========================================================

std::vector<std::string> RaceKeys() {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < kRaceKeys; ++i) keys.push_back("key-" + std::to_string(i));
  return keys;
}

struct Seen {
  std::size_t index;
  Result<BeginAnswer> answer;
};

// Every thread begins every key, starting at a different one.
std::vector<std::vector<Seen>> RaceBegins(Store& store, const std::string& scope,
                                          const std::vector<std::string>& keys,
                                          milliseconds lease) {
  std::vector<std::vector<Seen>> seen(kRaceThreads);
  RunConcurrently(kRaceThreads, [&](int t) {
    auto& mine = seen[static_cast<std::size_t>(t)];
    mine.reserve(keys.size());
    for (std::size_t j = 0; j < keys.size(); ++j) {
      const std::size_t i = (j + static_cast<std::size_t>(t) * 13) % keys.size();
      mine.push_back(
          Seen{i, store.Begin(BeginRequest{.scope = scope, .key = keys[i], .lease = lease})});
    }
  });
  return seen;
}

// The one Acquired per key (else a problem), checking every other answer is Busy until
// `deadline`.
std::vector<Acquired> Winners(const std::vector<std::vector<Seen>>& seen, std::size_t keys,
                              Timestamp deadline, Problems& problems) {
  std::vector<Acquired> winners(keys);
  std::vector<int> count(keys, 0);
  for (const auto& thread : seen) {
    for (const Seen& s : thread) {
      if (IsAcquired(s.answer)) {
        ++count[s.index];
        winners[s.index] = std::get<Acquired>(*s.answer);
      } else if (!s.answer.has_value() || !std::holds_alternative<Busy>(*s.answer) ||
                 std::get<Busy>(*s.answer).lease_deadline != deadline) {
        problems.Add("key " + std::to_string(s.index) + ": " + Show(s.answer));
      }
    }
  }
  for (std::size_t i = 0; i < keys; ++i) {
    if (count[i] != 1) {
      problems.Add("key " + std::to_string(i) + " acquired " + std::to_string(count[i]) + " times");
    }
  }
  return winners;
}

// Every thread completes every key twice, once with `stale[i]` and once with `current[i]`
// (in an order that depends on the thread), writing its own number as the response. Returns,
// per key, the thread whose completion was applied (-1: none, -2: more than one).
std::vector<int> RaceCompletes(Store& store, const std::string& scope,
                               const std::vector<std::string>& keys,
                               const std::vector<Token>& stale, const std::vector<Token>& current,
                               Problems& problems) {
  std::vector<std::atomic<int>> applied(keys.size());
  for (auto& a : applied) a.store(-1);
  std::vector<std::vector<std::string>> errors(kRaceThreads);
  RunConcurrently(kRaceThreads, [&](int t) {
    const std::string response = std::to_string(t);
    for (std::size_t j = 0; j < keys.size(); ++j) {
      const std::size_t i = (j + static_cast<std::size_t>(t) * 7) % keys.size();
      for (int pass = 0; pass < 2; ++pass) {
        const bool use_current = (pass == 0) == (t % 2 == 0);
        const Token token = use_current ? current[i] : stale[i];
        const Result<WriteAnswer> r = store.Complete(CompleteRequest{.scope = scope,
                                                                     .key = keys[i],
                                                                     .token = token,
                                                                     .response = response,
                                                                     .retention = kRaceRetention});
        if (!r.has_value()) {
          errors[static_cast<std::size_t>(t)].push_back("key " + std::to_string(i) + ": " +
                                                        Show(r));
        } else if (*r == WriteAnswer::kApplied) {
          if (!use_current) {
            errors[static_cast<std::size_t>(t)].push_back("key " + std::to_string(i) +
                                                          ": stale token applied");
          }
          int expected = -1;
          if (!applied[i].compare_exchange_strong(expected, t)) applied[i].store(-2);
        }
      }
    }
  });
  for (const auto& e : errors) {
    for (const std::string& p : e) problems.Add(p);
  }
  std::vector<int> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out.push_back(applied[i].load());
    if (out.back() < 0) {
      problems.Add("key " + std::to_string(i) +
                   (out.back() == -1 ? ": no completion applied" : ": two completions applied"));
    }
  }
  return out;
}

}  // namespace

void StoreContractTest::RaceBeginsThenCompletes(const std::vector<std::string>& keys,
                                                const std::vector<Token>& earlier,
                                                std::uint32_t attempt, Timestamp created) {
  const Timestamp now = clock_.Now();
  Problems begin_problems;
  const std::vector<Acquired> winners =
      Winners(RaceBegins(*store_, Scope(), keys, 1h), keys.size(), now + 1h, begin_problems);
  EXPECT_TRUE(begin_problems.empty()) << begin_problems.Report();
  std::vector<Token> current;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(winners[i].attempt, attempt);
    EXPECT_GT(winners[i].token, earlier[i]);
    current.push_back(winners[i].token);
  }

  Problems complete_problems;
  const std::vector<int> by =
      RaceCompletes(*store_, Scope(), keys, earlier, current, complete_problems);
  EXPECT_TRUE(complete_problems.empty()) << complete_problems.Report();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (by[i] < 0) continue;
    ExpectStored(keys[i], Completed(Held(keys[i], winners[i], created), now, std::to_string(by[i]),
                                    Outcome::kSuccess, kRaceRetention));
  }
}

namespace {

TEST_P(StoreContractTest, ConcurrentBeginsAcquireEachKeyOnce) {
  const std::vector<std::string> keys = RaceKeys();
  // A real stale token for every key: an earlier acquisition, released.
  std::vector<Token> stale;
  for (const std::string& key : keys) {
    const Acquired a = Acquire(key);
    stale.push_back(a.token);
    ASSERT_THAT(store_->Release(Scope(), key, a.token), IsApplied());
  }
  RaceBeginsThenCompletes(keys, stale, 1, clock_.Now());
}

TEST_P(StoreContractTest, ConcurrentTakeoversAcquireEachKeyOnce) {
  const std::vector<std::string> keys = RaceKeys();
  const Timestamp t0 = clock_.Now();
  std::vector<Token> first;
  for (const std::string& key : keys) first.push_back(Acquire(key, std::nullopt, 1s).token);
  clock_.Advance(1s);  // every lease is over
  // The first holders race the new ones to complete: only the new tokens win.
  RaceBeginsThenCompletes(keys, first, 2, t0);
}

TEST_P(StoreContractTest, ConcurrentSequencedBeginsAcquireEachNumberOnce) {
  ASSERT_TRUE(
      store_->OpenSession(SessionOf("c", kSessionTtl, static_cast<std::uint32_t>(kRaceSeqs)))
          .has_value());
  std::vector<std::vector<std::pair<std::uint64_t, Result<BeginAnswer>>>> seen(kRaceThreads);
  RunConcurrently(kRaceThreads, [&](int t) {
    for (std::uint64_t j = 0; j < kRaceSeqs; ++j) {
      const std::uint64_t seq = (j + static_cast<std::uint64_t>(t) * 11) % kRaceSeqs + 1;
      seen[static_cast<std::size_t>(t)].emplace_back(seq, store_->BeginSequenced(SeqOf("c", seq)));
    }
  });
  Problems problems;
  std::vector<int> count(kRaceSeqs + 1, 0);
  std::vector<Token> tokens(kRaceSeqs + 1, 0);
  for (const auto& thread : seen) {
    for (const auto& [seq, answer] : thread) {
      if (IsAcquired(answer)) {
        ++count[seq];
        tokens[seq] = std::get<Acquired>(*answer).token;
      } else if (!answer.has_value() || !std::holds_alternative<Busy>(*answer)) {
        problems.Add("seq " + std::to_string(seq) + ": " + Show(answer));
      }
    }
  }
  for (std::uint64_t seq = 1; seq <= kRaceSeqs; ++seq) {
    if (count[seq] != 1) {
      problems.Add("seq " + std::to_string(seq) + " acquired " + std::to_string(count[seq]) +
                   " times");
    }
  }
  EXPECT_TRUE(problems.empty()) << problems.Report();

  std::vector<std::atomic<int>> applied(kRaceSeqs + 1);
  RunConcurrently(kRaceThreads, [&](int t) {
    for (std::uint64_t seq = 1; seq <= kRaceSeqs; ++seq) {
      const Result<WriteAnswer> r = store_->CompleteSequenced(SeqDoneOf("c", seq, tokens[seq]));
      if (r.has_value() && *r == WriteAnswer::kApplied) applied[seq].fetch_add(1);
      (void)t;
    }
  });
  for (std::uint64_t seq = 1; seq <= kRaceSeqs; ++seq) {
    EXPECT_EQ(applied[seq].load(), 1) << "seq " << seq;
  }
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 0),
              HoldsValue(::testing::Field(&SessionInfo::outstanding,
                                          static_cast<std::uint32_t>(kRaceSeqs))));
}

TEST_P(StoreContractTest, ConcurrentVersionedBeginsAcquireOneVersionAtATime) {
  std::uint64_t applied = 0;
  for (int round = 0; round < kRaceRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::uint64_t base = static_cast<std::uint64_t>(round) * kRaceThreads;
    std::vector<std::vector<Result<BeginAnswer>>> seen(kRaceThreads);
    RunConcurrently(kRaceThreads, [&](int t) {
      auto& mine = seen[static_cast<std::size_t>(t)];
      mine.push_back(
          store_->BeginVersioned(VersionOf("e", base + static_cast<std::uint64_t>(t) + 1)));
      if (applied != 0) {
        mine.push_back(store_->BeginVersioned(VersionOf("e", applied)));
      }
    });
    Problems problems;
    int acquired = 0;
    Acquired winner;
    std::uint64_t winner_version = 0;
    for (std::size_t t = 0; t < seen.size(); ++t) {
      const Result<BeginAnswer>& mine = seen[t][0];
      if (IsAcquired(mine)) {
        ++acquired;
        winner = std::get<Acquired>(*mine);
        winner_version = base + t + 1;
      } else if (!mine.has_value() || !std::holds_alternative<Busy>(*mine)) {
        problems.Add("thread " + std::to_string(t) + ": " + Show(mine));
      }
      if (seen[t].size() > 1 &&
          (!seen[t][1].has_value() || !std::holds_alternative<Stale>(*seen[t][1]))) {
        problems.Add("thread " + std::to_string(t) + " applied version: " + Show(seen[t][1]));
      }
    }
    EXPECT_EQ(acquired, 1);
    EXPECT_TRUE(problems.empty()) << problems.Report();
    if (acquired != 1) return;
    ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", winner.token)), IsApplied());
    applied = winner_version;
    ASSERT_THAT(store_->GetVersion(Scope(), "e"),
                HoldsValue(Optional(::testing::Field(&EntityVersion::applied, applied))));
  }
}

// ==== counts: the store to itself ==============================================================

TEST_P(StoreCountsTest, StatsCountRecordsByState) {
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 0u),
                                          ::testing::Field(&StoreStats::completed, 0u))));
  const Acquired a = Acquire("a");
  Acquire("b");
  const Acquired c = Acquire("c");
  Finish("a", a.token, "A", Outcome::kSuccess, 1min);
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 2u),
                                          ::testing::Field(&StoreStats::completed, 1u))));
  ASSERT_THAT(store_->Release(Scope(), "c", c.token), IsApplied());
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 1u),
                                          ::testing::Field(&StoreStats::completed, 1u))));
  clock_.Advance(1min);
  EXPECT_THAT(store_->Purge(), HoldsValue(1u));
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 1u),
                                          ::testing::Field(&StoreStats::completed, 0u))));
}

TEST_P(StoreCountsTest, StatsCountSessionsAndEntities) {
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::sessions, 0u),
                                          ::testing::Field(&StoreStats::entities, 0u))));
  ASSERT_TRUE(store_->OpenSession(SessionOf("c1")).has_value());
  ASSERT_TRUE(store_->OpenSession(SessionOf("c2")).has_value());
  ExpectAcquired(store_->BeginVersioned(VersionOf("e", 1)));
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::sessions, 2u),
                                          ::testing::Field(&StoreStats::entities, 1u))));
}

TEST_P(StoreCountsTest, PurgeReclaimsExpiredRecords) {
  for (const char* key : {"s1", "s2", "s3"})
    Finish(key, Acquire(key).token, "x", Outcome::kSuccess, 1s);
  Finish("long", Acquire("long").token, "x", Outcome::kSuccess, 1h);
  const Acquired held = Acquire("held");
  const Timestamp t0 = clock_.Now();
  EXPECT_THAT(store_->Purge(), HoldsValue(0u));
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 1u),
                                          ::testing::Field(&StoreStats::completed, 4u))));

  clock_.Advance(1s);
  EXPECT_THAT(store_->Purge(), HoldsValue(3u));
  EXPECT_THAT(store_->Purge(), HoldsValue(0u));
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 1u),
                                          ::testing::Field(&StoreStats::completed, 1u))));
  ExpectAbsent("s1");
  ExpectStored("held", Held("held", held, t0));
  EXPECT_THAT(store_->List(ListFilter{}), HoldsValue(SizeIs(2u)));
}

TEST_P(StoreCountsTest, PurgeReclaimsAbandonedRecords) {
  const Acquired held = Acquire("held");
  Finish("done", Acquire("done").token, "x", Outcome::kSuccess, 1h);
  clock_.Advance(kLease + AbandonedRetention() - 1ms);
  EXPECT_THAT(store_->Purge(), HoldsValue(1u));  // "done"
  clock_.Advance(1ms);
  EXPECT_THAT(store_->Purge(), HoldsValue(1u));  // "held"
  EXPECT_THAT(store_->Stats(),
              HoldsValue(::testing::AllOf(::testing::Field(&StoreStats::in_progress, 0u),
                                          ::testing::Field(&StoreStats::completed, 0u))));
  EXPECT_THAT(store_->Complete(CompleteOf("held", held.token)), IsLeaseLost());
  ExpectAbsent("held");
}

TEST_P(StoreCountsTest, TokensGrowAfterPurge) {
  const Acquired first = Acquire("k");
  Finish("k", first.token, "x", Outcome::kSuccess, 1s);
  clock_.Advance(1s);
  ASSERT_THAT(store_->Purge(), HoldsValue(1u));
  const Acquired second = Acquire("k");
  EXPECT_GT(second.token, first.token);
  clock_.Advance(kLease + AbandonedRetention());
  ASSERT_THAT(store_->Purge(), HoldsValue(1u));
  const Acquired third = Acquire("k");
  EXPECT_GT(third.token, second.token);
  EXPECT_EQ(third.attempt, 1u);
}

TEST_P(StoreCountsTest, ListWithoutScopeSeesEveryScope) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("a");
  const Acquired b =
      ExpectAcquired(store_->Begin(BeginRequest{.scope = Scope() + "/b", .key = "b"}));
  Record b_record = Held("b", b, t0);
  b_record.scope = Scope() + "/b";
  const Acquired c = Acquire("c");
  Finish("c", c.token, "C");
  EXPECT_THAT(store_->List(ListFilter{.state = RecordState::kInProgress}),
              HoldsValue(UnorderedElementsAre(RecordIs(Held("a", a, t0)), RecordIs(b_record))));
  EXPECT_THAT(store_->List(ListFilter{.state = RecordState::kCompleted}),
              HoldsValue(UnorderedElementsAre(RecordIs(Completed(Held("c", c, t0), t0, "C")))));
  EXPECT_THAT(store_->List(ListFilter{.limit = 1}), HoldsValue(SizeIs(1u)));
}

// ==== reopen: durable stores ===================================================================

TEST_P(StoreReopenTest, InProgressRecordSurvivesReopen) {
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectStored("k", Held("k", a, t0, kFpA));
  EXPECT_THAT(ExpectBusy(store_->Begin(BeginOf("k", kFpA))).lease_deadline, At(t0 + kLease));
  Finish("k", a.token, "after reopen");
  ExpectStored("k", Completed(Held("k", a, t0, kFpA), t0, "after reopen"));
}

TEST_P(StoreReopenTest, CompletedRecordSurvivesReopen) {
  const std::string bytes = BinaryBytes();
  const Timestamp t0 = clock_.Now();
  const Acquired a = Acquire("k", kFpA);
  Finish("k", a.token, bytes, Outcome::kFailure, 1min);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectStored("k", Completed(Held("k", a, t0, kFpA), t0, bytes, Outcome::kFailure, 1min));
  EXPECT_THAT(ExpectReplay(store_->Begin(BeginOf("k", kFpA))),
              ReplayIs(Replay{Outcome::kFailure, bytes, 1}));
  ExpectConflict(store_->Begin(BeginOf("k", kFpB)));
  clock_.Advance(1min);
  ExpectAbsent("k");
}

TEST_P(StoreReopenTest, ReleasedAndErasedRecordsStayGone) {
  const Acquired a = Acquire("released");
  ASSERT_THAT(store_->Release(Scope(), "released", a.token), IsApplied());
  Acquire("erased");
  ASSERT_THAT(store_->Erase(Scope(), "erased"), HoldsValue(true));
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectAbsent("released");
  ExpectAbsent("erased");
}

TEST_P(StoreReopenTest, TokensKeepGrowingAcrossReopen) {
  const Acquired a = Acquire("k");
  ASSERT_THAT(store_->Release(Scope(), "k", a.token), IsApplied());
  const Acquired held = Acquire("held", std::nullopt, 1s);
  ASSERT_NO_FATAL_FAILURE(Reopen());
  EXPECT_GT(Acquire("k").token, a.token);
  clock_.Advance(1s);
  const Acquired takeover = ExpectAcquired(store_->Begin(BeginOf("held")));
  EXPECT_EQ(takeover.attempt, 2u);
  EXPECT_GT(takeover.token, held.token);
  EXPECT_THAT(store_->Complete(CompleteOf("held", held.token)), IsLeaseLost());
}

TEST_P(StoreReopenTest, SessionSurvivesReopen) {
  const Timestamp t0 = clock_.Now();
  const SessionRequest open = SessionOf("c", kSessionTtl, kWindow);
  ASSERT_TRUE(store_->OpenSession(open).has_value());
  for (std::uint64_t seq = 1; seq <= 3; ++seq) {
    const Acquired a = ExpectAcquired(store_->BeginSequenced(SeqOf("c", seq)));
    ASSERT_THAT(store_->CompleteSequenced(SeqDoneOf("c", seq, a.token, std::to_string(seq))),
                IsApplied());
  }
  ASSERT_TRUE(store_->Acknowledge(Scope(), "c", 1).has_value());
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectStale(store_->BeginSequenced(SeqOf("c", 1)));
  EXPECT_THAT(ExpectReplay(store_->BeginSequenced(SeqOf("c", 3))).response, "3");
  EXPECT_THAT(store_->Acknowledge(Scope(), "c", 0),
              HoldsValue(SessionIs(SessionInfo{Scope(), "c", 1, kWindow, 2, t0 + kSessionTtl})));
}

TEST_P(StoreReopenTest, EntityVersionSurvivesReopen) {
  const Acquired a = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 4)));
  ASSERT_THAT(store_->CompleteVersioned(VersionDoneOf("e", a.token)), IsApplied());
  const Acquired b = ExpectAcquired(store_->BeginVersioned(VersionOf("e", 5)));
  ASSERT_NO_FATAL_FAILURE(Reopen());
  ExpectStale(store_->BeginVersioned(VersionOf("e", 4)));
  ExpectBusy(store_->BeginVersioned(VersionOf("e", 6)));
  EXPECT_THAT(store_->CompleteVersioned(VersionDoneOf("e", b.token)), IsApplied());
  EXPECT_THAT(store_->GetVersion(Scope(), "e"),
              HoldsValue(Optional(::testing::Field(&EntityVersion::applied, 5u))));
}

}  // namespace
}  // namespace idem
