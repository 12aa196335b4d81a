// The state machine on plain values: every row of SPEC §2's table, §4 and §5.
#include "core/machine.h"

#include <gtest/gtest.h>

namespace idem::core {
namespace {

using std::chrono::milliseconds;
constexpr Timestamp kT0{milliseconds(1'700'000'000'000)};
constexpr milliseconds kLease{1000};
constexpr milliseconds kGrace{60'000};

Fingerprint Fp(std::uint8_t b) {
  Fingerprint f;
  f.bytes.fill(b);
  return f;
}

TEST(DecideBegin, AbsentIsAcquiredWithAttemptOne) {
  auto d = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 7, kGrace);
  EXPECT_EQ(d.kind, BeginKind::kAcquired);
  EXPECT_FALSE(d.takeover);
  EXPECT_EQ(d.next.token, 7u);
  EXPECT_EQ(d.next.attempt, 1u);
  EXPECT_EQ(d.next.state, RecordState::kInProgress);
  EXPECT_EQ(d.next.created, kT0);
  EXPECT_EQ(d.next.lease_deadline, kT0 + kLease);
  EXPECT_EQ(d.next.expires, kT0 + kLease + kGrace);
}

TEST(DecideBegin, ExpiredRecordIsAbsent) {
  RecordHead done{RecordState::kCompleted, Outcome::kSuccess, 3, 2, kT0, kT0, kT0 + kLease};
  auto d = DecideBegin(&done, nullptr, nullptr, kLease, kT0 + kLease, 9, kGrace);
  EXPECT_EQ(d.kind, BeginKind::kAcquired);
  EXPECT_EQ(d.next.attempt, 1u);
  EXPECT_EQ(d.next.token, 9u);
  EXPECT_FALSE(d.takeover);
}

TEST(DecideBegin, RunningLeaseIsBusy) {
  auto a = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 1, kGrace);
  auto d =
      DecideBegin(&a.next, nullptr, nullptr, kLease, kT0 + kLease - milliseconds(1), 2, kGrace);
  EXPECT_EQ(d.kind, BeginKind::kBusy);
  EXPECT_EQ(d.next.lease_deadline, kT0 + kLease);
  Fingerprint f = Fp(1);
  EXPECT_EQ(DecideBegin(&a.next, &f, &f, kLease, kT0, 2, kGrace).kind, BeginKind::kBusy);
  EXPECT_EQ(DecideBegin(&a.next, nullptr, &f, kLease, kT0, 2, kGrace).kind, BeginKind::kBusy);
  EXPECT_EQ(DecideBegin(&a.next, &f, nullptr, kLease, kT0, 2, kGrace).kind, BeginKind::kBusy);
}

TEST(DecideBegin, LeaseOverIsTakeover) {
  auto a = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 1, kGrace);
  auto d = DecideBegin(&a.next, nullptr, nullptr, kLease, kT0 + kLease, 2, kGrace);
  EXPECT_EQ(d.kind, BeginKind::kAcquired);
  EXPECT_TRUE(d.takeover);
  EXPECT_EQ(d.next.attempt, 2u);
  EXPECT_EQ(d.next.token, 2u);
  EXPECT_EQ(d.next.created, kT0);
  EXPECT_EQ(d.next.lease_deadline, kT0 + kLease + kLease);
}

TEST(DecideBegin, CompletedIsReplay) {
  RecordHead done{RecordState::kCompleted, Outcome::kFailure, 3, 2, kT0, kT0, kT0 + kGrace};
  auto d = DecideBegin(&done, nullptr, nullptr, kLease, kT0, 9, kGrace);
  EXPECT_EQ(d.kind, BeginKind::kReplay);
  EXPECT_EQ(d.next.outcome, Outcome::kFailure);
}

TEST(DecideBegin, DifferentFingerprintsConflict) {
  Fingerprint a = Fp(1), b = Fp(2);
  auto acq = DecideBegin(nullptr, nullptr, &a, kLease, kT0, 1, kGrace);
  EXPECT_EQ(DecideBegin(&acq.next, &a, &b, kLease, kT0, 2, kGrace).kind, BeginKind::kConflict);
  // Conflict wins over a takeover too.
  EXPECT_EQ(DecideBegin(&acq.next, &a, &b, kLease, kT0 + kLease, 2, kGrace).kind,
            BeginKind::kConflict);
  RecordHead done{RecordState::kCompleted, Outcome::kSuccess, 3, 1, kT0, kT0, kT0 + kGrace};
  EXPECT_EQ(DecideBegin(&done, &a, &b, kLease, kT0, 2, kGrace).kind, BeginKind::kConflict);
}

TEST(DecideWrites, CompleteNeedsTheCurrentToken) {
  auto a = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 5, kGrace);
  EXPECT_EQ(DecideComplete(&a.next, 4, Outcome::kSuccess, kGrace, kT0).answer,
            WriteAnswer::kLeaseLost);
  EXPECT_EQ(DecideComplete(nullptr, 5, Outcome::kSuccess, kGrace, kT0).answer,
            WriteAnswer::kLeaseLost);
  auto c = DecideComplete(&a.next, 5, Outcome::kSuccess, kGrace, kT0 + milliseconds(10));
  EXPECT_EQ(c.answer, WriteAnswer::kApplied);
  EXPECT_EQ(c.next.state, RecordState::kCompleted);
  EXPECT_EQ(c.next.expires, kT0 + milliseconds(10) + kGrace);
  // Completed: the token no longer owns anything.
  EXPECT_EQ(DecideComplete(&c.next, 5, Outcome::kSuccess, kGrace, kT0).answer,
            WriteAnswer::kLeaseLost);
  EXPECT_EQ(DecideRelease(&c.next, 5, kT0), WriteAnswer::kLeaseLost);
}

TEST(DecideWrites, CompleteAfterLeaseButBeforeTakeoverIsAccepted) {
  auto a = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 5, kGrace);
  EXPECT_EQ(DecideComplete(&a.next, 5, Outcome::kSuccess, kGrace, kT0 + kLease * 3).answer,
            WriteAnswer::kApplied);
}

TEST(DecideWrites, AbandonedRecordIsGone) {
  auto a = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 5, kGrace);
  Timestamp later = kT0 + kLease + kGrace;
  EXPECT_EQ(DecideComplete(&a.next, 5, Outcome::kSuccess, kGrace, later).answer,
            WriteAnswer::kLeaseLost);
  EXPECT_EQ(DecideRelease(&a.next, 5, later), WriteAnswer::kLeaseLost);
}

TEST(DecideWrites, ExtendPushesTheDeadline) {
  auto a = DecideBegin(nullptr, nullptr, nullptr, kLease, kT0, 5, kGrace);
  auto e = DecideExtend(&a.next, 5, milliseconds(5000), kT0 + milliseconds(500), kGrace);
  EXPECT_EQ(e.answer, WriteAnswer::kApplied);
  EXPECT_EQ(e.next.lease_deadline, kT0 + milliseconds(5500));
  EXPECT_EQ(DecideExtend(&a.next, 6, kLease, kT0, kGrace).answer, WriteAnswer::kLeaseLost);
}

TEST(DecideSequenced, GatesByLowWaterWindowAndExpiry) {
  SessionHead s{10, 4, milliseconds(1000), kT0 + milliseconds(1000)};
  EXPECT_EQ(DecideSequenced(nullptr, 1, 0, kT0).gate, SessionGate::kUnknown);
  EXPECT_EQ(DecideSequenced(&s, 11, 0, kT0 + milliseconds(1000)).gate, SessionGate::kUnknown);
  EXPECT_EQ(DecideSequenced(&s, 10, 0, kT0).gate, SessionGate::kStale);
  EXPECT_EQ(DecideSequenced(&s, 14, 0, kT0).gate, SessionGate::kProceed);
  EXPECT_EQ(DecideSequenced(&s, 15, 0, kT0).gate, SessionGate::kWindowFull);
  auto d = DecideSequenced(&s, 15, 12, kT0 + milliseconds(10));
  EXPECT_EQ(d.gate, SessionGate::kProceed);
  EXPECT_EQ(d.next.low_water, 12u);
  EXPECT_EQ(d.drop_through, 12u);
  EXPECT_EQ(d.next.expires, kT0 + milliseconds(1010));
  EXPECT_EQ(DecideSequenced(&s, 12, 12, kT0).gate, SessionGate::kStale);
}

TEST(DecideVersioned, AppliesInOrder) {
  auto a = DecideVersioned(nullptr, 3, kLease, kT0, 1, kGrace);
  ASSERT_EQ(a.kind, VersionKind::kAcquired);
  EXPECT_EQ(DecideVersioned(&a.next, 4, kLease, kT0, 2, kGrace).kind, VersionKind::kBusy);
  auto c = DecideCompleteVersioned(&a.next, 1, kGrace, kT0);
  ASSERT_EQ(c.answer, WriteAnswer::kApplied);
  EXPECT_EQ(c.next.applied, 3u);
  EXPECT_EQ(DecideVersioned(&c.next, 3, kLease, kT0, 3, kGrace).kind, VersionKind::kStale);
  EXPECT_EQ(DecideVersioned(&c.next, 2, kLease, kT0, 3, kGrace).kind, VersionKind::kStale);
  auto b = DecideVersioned(&c.next, 5, kLease, kT0, 4, kGrace);
  EXPECT_EQ(b.kind, VersionKind::kAcquired);
  auto t = DecideVersioned(&b.next, 5, kLease, kT0 + kLease, 5, kGrace);
  EXPECT_EQ(t.kind, VersionKind::kAcquired);
  EXPECT_TRUE(t.takeover);
  EXPECT_EQ(t.next.attempt, 2u);
  EXPECT_EQ(DecideCompleteVersioned(&t.next, 4, kGrace, kT0).answer, WriteAnswer::kLeaseLost);
  auto r = DecideReleaseVersioned(&t.next, 5, kT0);
  EXPECT_EQ(r.answer, WriteAnswer::kApplied);
  EXPECT_EQ(r.next.in_progress, 0u);
  EXPECT_EQ(r.next.applied, 3u);
}

TEST(Checks, RejectBadInputWithSpecificErrors) {
  BeginRequest r{"", "", std::nullopt, kLease};
  EXPECT_EQ(CheckBegin(r, 255).message(), "key is empty");
  std::string long_key(256, 'k');
  r.key = long_key;
  EXPECT_EQ(CheckBegin(r, 255).message(), "key is 256 bytes; the limit is 255");
  r.key = "k";
  r.lease = milliseconds(0);
  EXPECT_EQ(CheckBegin(r, 255).code(), StatusCode::kInvalidArgument);
  r.lease = milliseconds(-5);
  EXPECT_EQ(CheckBegin(r, 255).message(), "lease must be positive, got -5ms");
  EXPECT_EQ(CheckRetention(milliseconds(0)).code(), StatusCode::kInvalidArgument);
  SequencedBeginRequest s{"", "c", 0, 0, std::nullopt, kLease};
  EXPECT_EQ(CheckSequenced(s, 255).message(), "sequence number 0: numbers start at 1");
  VersionedBeginRequest v{"", "e", 0, kLease};
  EXPECT_EQ(CheckVersioned(v, 255).message(), "version 0: versions start at 1");
}

}  // namespace
}  // namespace idem::core
