#include "stores/store_contract.h"

#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <type_traits>
#include <variant>

namespace idem {
namespace {

// Scopes must be unique across runs too, so that a store over a server that outlives the test
// process never sees an earlier run's records.
const std::string& RunId() {
  static const std::string id = [] {
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    return std::string(buf);
  }();
  return id;
}

template <typename T>
std::string ShowValue(const T& v) {
  if constexpr (std::is_same_v<T, Timestamp>) {
    return ShowTime(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return ShowBytes(v);
  } else if constexpr (std::is_same_v<T, std::optional<Fingerprint>>) {
    return ShowFingerprint(v);
  } else if constexpr (std::is_same_v<T, std::optional<std::uint64_t>>) {
    return v.has_value() ? std::to_string(*v) : std::string("none");
  } else if constexpr (std::is_enum_v<T> || std::is_class_v<T>) {
    return ::testing::PrintToString(v);
  } else {
    return std::to_string(v);
  }
}

class Differ {
 public:
  template <typename T>
  void Field(std::string_view name, const T& got, const T& want) {
    if (got == want) return;
    if (!out_.empty()) out_ += "; ";
    out_ += std::string(name) + " is " + ShowValue(got) + ", want " + ShowValue(want);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

template <typename T>
std::string AnswerKind() {
  if constexpr (std::is_same_v<T, Acquired>) return "acquired";
  if constexpr (std::is_same_v<T, Busy>) return "busy";
  if constexpr (std::is_same_v<T, Replay>) return "replay";
  if constexpr (std::is_same_v<T, Conflict>) return "conflict";
  return "stale";
}

template <typename T>
T ExpectAnswer(const Result<BeginAnswer>& r, const std::source_location& loc) {
  if (!r.has_value()) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
        << "expected " << AnswerKind<T>() << ", got the error " << r.error().ToString();
    return T{};
  }
  if (!std::holds_alternative<T>(*r)) {
    ADD_FAILURE_AT(loc.file_name(), static_cast<int>(loc.line()))
        << "expected " << AnswerKind<T>() << ", got " << ::testing::PrintToString(*r);
    return T{};
  }
  return std::get<T>(*r);
}

}  // namespace

// ---- printing ---------------------------------------------------------------------------------

std::string ShowTime(Timestamp t) {
  const auto d = (t - testing::FakeClock::kStart).count();
  return std::string("start") + (d < 0 ? "" : "+") + std::to_string(d) + "ms";
}

std::string ShowBytes(std::string_view bytes) {
  constexpr std::size_t kShown = 32;
  std::string out = "\"";
  for (std::size_t i = 0; i < bytes.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  out += bytes.size() > kShown ? "\"..." : "\"";
  out += " (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

std::string ShowFingerprint(const std::optional<Fingerprint>& fp) {
  if (!fp.has_value()) return "none";
  std::string hex;
  for (std::size_t i = 0; i < 4; ++i) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", fp->bytes[i]);
    hex += buf;
  }
  return hex + "...";
}

void PrintTo(const Fingerprint& fp, std::ostream* os) { *os << ShowFingerprint(fp); }
void PrintTo(RecordState s, std::ostream* os) { *os << RecordStateName(s); }
void PrintTo(Outcome o, std::ostream* os) { *os << OutcomeName(o); }
void PrintTo(WriteAnswer a, std::ostream* os) { *os << WriteAnswerName(a); }
void PrintTo(StatusCode c, std::ostream* os) { *os << StatusCodeName(c); }
void PrintTo(const Status& s, std::ostream* os) { *os << (s.ok() ? "OK" : s.ToString()); }

void PrintTo(const Record& r, std::ostream* os) {
  *os << "{scope=\"" << r.scope << "\" key=" << ShowBytes(r.key)
      << " state=" << RecordStateName(r.state) << " fingerprint=" << ShowFingerprint(r.fingerprint)
      << " token=" << r.token << " attempt=" << r.attempt << " created=" << ShowTime(r.created)
      << " lease_deadline=" << ShowTime(r.lease_deadline) << " expires=" << ShowTime(r.expires)
      << " outcome=" << OutcomeName(r.outcome) << " response=" << ShowBytes(r.response) << "}";
}

void PrintTo(const Acquired& a, std::ostream* os) {
  *os << "acquired{token=" << a.token << " attempt=" << a.attempt
      << " lease_deadline=" << ShowTime(a.lease_deadline) << "}";
}
void PrintTo(const Busy& b, std::ostream* os) {
  *os << "busy{lease_deadline=" << ShowTime(b.lease_deadline) << "}";
}
void PrintTo(const Replay& r, std::ostream* os) {
  *os << "replay{outcome=" << OutcomeName(r.outcome) << " response=" << ShowBytes(r.response)
      << " attempt=" << r.attempt << "}";
}
void PrintTo(const Conflict&, std::ostream* os) { *os << "conflict"; }
void PrintTo(const Stale&, std::ostream* os) { *os << "stale"; }
void PrintTo(const BeginAnswer& a, std::ostream* os) {
  std::visit([os](const auto& v) { PrintTo(v, os); }, a);
}

void PrintTo(const SessionInfo& s, std::ostream* os) {
  *os << "{scope=\"" << s.scope << "\" client_id=" << ShowBytes(s.client_id)
      << " low_water=" << s.low_water << " window=" << s.window << " outstanding=" << s.outstanding
      << " expires=" << ShowTime(s.expires) << "}";
}

void PrintTo(const EntityVersion& e, std::ostream* os) {
  *os << "{scope=\"" << e.scope << "\" entity=" << ShowBytes(e.entity) << " applied=" << e.applied
      << " in_progress=" << ShowValue(e.in_progress) << " token=" << e.token
      << " attempt=" << e.attempt << " lease_deadline=" << ShowTime(e.lease_deadline)
      << " expires=" << ShowTime(e.expires) << "}";
}

// ---- comparing --------------------------------------------------------------------------------

std::string RecordDiff(const Record& got, const Record& want) {
  Differ d;
  d.Field("scope", got.scope, want.scope);
  d.Field("key", got.key, want.key);
  d.Field("state", got.state, want.state);
  d.Field("fingerprint", got.fingerprint, want.fingerprint);
  d.Field("token", got.token, want.token);
  d.Field("attempt", got.attempt, want.attempt);
  d.Field("created", got.created, want.created);
  if (want.state == RecordState::kInProgress) {
    d.Field("lease_deadline", got.lease_deadline, want.lease_deadline);
  }
  d.Field("expires", got.expires, want.expires);
  if (want.state == RecordState::kCompleted) {
    d.Field("outcome", got.outcome, want.outcome);
    d.Field("response", got.response, want.response);
  }
  return d.Take();
}

std::string ReplayDiff(const Replay& got, const Replay& want) {
  Differ d;
  d.Field("outcome", got.outcome, want.outcome);
  d.Field("response", got.response, want.response);
  d.Field("attempt", got.attempt, want.attempt);
  return d.Take();
}

std::string SessionDiff(const SessionInfo& got, const SessionInfo& want) {
  Differ d;
  d.Field("scope", got.scope, want.scope);
  d.Field("client_id", got.client_id, want.client_id);
  d.Field("low_water", got.low_water, want.low_water);
  d.Field("window", got.window, want.window);
  d.Field("outstanding", got.outstanding, want.outstanding);
  d.Field("expires", got.expires, want.expires);
  return d.Take();
}

std::string VersionDiff(const EntityVersion& got, const EntityVersion& want) {
  Differ d;
  d.Field("scope", got.scope, want.scope);
  d.Field("entity", got.entity, want.entity);
  d.Field("applied", got.applied, want.applied);
  d.Field("in_progress", got.in_progress, want.in_progress);
  if (want.in_progress.has_value()) {
    d.Field("token", got.token, want.token);
    d.Field("attempt", got.attempt, want.attempt);
    d.Field("lease_deadline", got.lease_deadline, want.lease_deadline);
  }
  d.Field("expires", got.expires, want.expires);
  return d.Take();
}

// ---- answers ----------------------------------------------------------------------------------

Acquired ExpectAcquired(const Result<BeginAnswer>& r, std::source_location loc) {
  return ExpectAnswer<Acquired>(r, loc);
}
Busy ExpectBusy(const Result<BeginAnswer>& r, std::source_location loc) {
  return ExpectAnswer<Busy>(r, loc);
}
Replay ExpectReplay(const Result<BeginAnswer>& r, std::source_location loc) {
  return ExpectAnswer<Replay>(r, loc);
}
void ExpectConflict(const Result<BeginAnswer>& r, std::source_location loc) {
  ExpectAnswer<Conflict>(r, loc);
}
void ExpectStale(const Result<BeginAnswer>& r, std::source_location loc) {
  ExpectAnswer<Stale>(r, loc);
}

// ---- fixtures ---------------------------------------------------------------------------------

void StoreContractTest::SetUp() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  scope_ = RunId() + "/" + info->test_suite_name() + "." + info->name();
  IDEM_CHECK_MSG(scope_.size() <= kMaxScopeBytes, scope_);
  store_ = GetParam().make(clock_, kDefaultMaxKeyBytes);
  ASSERT_NE(store_, nullptr) << GetParam().name << ": make() returned no store";
}

std::unique_ptr<Store> StoreContractTest::MakeStore(std::size_t max_key_bytes) {
  return GetParam().make(clock_, max_key_bytes);
}

BeginRequest StoreContractTest::BeginOf(std::string_view key, std::optional<Fingerprint> fp,
                                        std::chrono::milliseconds lease) const {
  return BeginRequest{.scope = scope_, .key = key, .fingerprint = fp, .lease = lease};
}

CompleteRequest StoreContractTest::CompleteOf(std::string_view key, Token token,
                                              std::string_view response, Outcome outcome,
                                              std::chrono::milliseconds retention) const {
  return CompleteRequest{.scope = scope_,
                         .key = key,
                         .token = token,
                         .outcome = outcome,
                         .response = response,
                         .retention = retention};
}

SessionRequest StoreContractTest::SessionOf(std::string_view client_id,
                                            std::chrono::milliseconds ttl,
                                            std::uint32_t window) const {
  return SessionRequest{.scope = scope_, .client_id = client_id, .ttl = ttl, .window = window};
}

SequencedBeginRequest StoreContractTest::SeqOf(std::string_view client_id, std::uint64_t seq,
                                               std::uint64_t ack, std::optional<Fingerprint> fp,
                                               std::chrono::milliseconds lease) const {
  return SequencedBeginRequest{.scope = scope_,
                               .client_id = client_id,
                               .seq = seq,
                               .ack = ack,
                               .fingerprint = fp,
                               .lease = lease};
}

SequencedCompleteRequest StoreContractTest::SeqDoneOf(std::string_view client_id, std::uint64_t seq,
                                                      Token token, std::string_view response,
                                                      Outcome outcome) const {
  return SequencedCompleteRequest{.scope = scope_,
                                  .client_id = client_id,
                                  .seq = seq,
                                  .token = token,
                                  .outcome = outcome,
                                  .response = response};
}

VersionedBeginRequest StoreContractTest::VersionOf(std::string_view entity, std::uint64_t version,
                                                   std::chrono::milliseconds lease) const {
  return VersionedBeginRequest{
      .scope = scope_, .entity = entity, .version = version, .lease = lease};
}

VersionedCompleteRequest StoreContractTest::VersionDoneOf(
    std::string_view entity, Token token, std::chrono::milliseconds retention) const {
  return VersionedCompleteRequest{
      .scope = scope_, .entity = entity, .token = token, .retention = retention};
}

Acquired StoreContractTest::Acquire(std::string_view key, std::optional<Fingerprint> fp,
                                    std::chrono::milliseconds lease, std::source_location loc) {
  return ExpectAcquired(store_->Begin(BeginOf(key, fp, lease)), loc);
}

void StoreContractTest::Finish(std::string_view key, Token token, std::string_view response,
                               Outcome outcome, std::chrono::milliseconds retention,
                               std::source_location loc) {
  ::testing::ScopedTrace trace(loc.file_name(), static_cast<int>(loc.line()),
                               "Finish(" + ShowBytes(key) + ")");
  EXPECT_THAT(store_->Complete(CompleteOf(key, token, response, outcome, retention)), IsApplied());
}

Record StoreContractTest::Held(std::string_view key, const Acquired& a, Timestamp created,
                               std::optional<Fingerprint> fp) const {
  Record r;
  r.scope = scope_;
  r.key = std::string(key);
  r.state = RecordState::kInProgress;
  r.fingerprint = fp;
  r.token = a.token;
  r.attempt = a.attempt;
  r.created = created;
  r.lease_deadline = a.lease_deadline;
  r.expires = a.lease_deadline + AbandonedRetention();
  return r;
}

Record StoreContractTest::Completed(Record held, Timestamp at, std::string_view response,
                                    Outcome outcome, std::chrono::milliseconds retention) {
  held.state = RecordState::kCompleted;
  held.outcome = outcome;
  held.response = std::string(response);
  held.expires = at + retention;
  return held;
}

void StoreContractTest::ExpectStored(std::string_view key, const Record& want,
                                     std::source_location loc) {
  ::testing::ScopedTrace trace(loc.file_name(), static_cast<int>(loc.line()),
                               "ExpectStored(" + ShowBytes(key) + ")");
  Result<std::optional<Record>> got = store_->Get(scope_, key);
  ASSERT_TRUE(got.has_value()) << got.error().ToString();
  ASSERT_TRUE(got->has_value()) << "no record";
  EXPECT_THAT(**got, RecordIs(want));
}

void StoreContractTest::ExpectAbsent(std::string_view key, std::source_location loc) {
  ::testing::ScopedTrace trace(loc.file_name(), static_cast<int>(loc.line()),
                               "ExpectAbsent(" + ShowBytes(key) + ")");
  Result<std::optional<Record>> got = store_->Get(scope_, key);
  ASSERT_TRUE(got.has_value()) << got.error().ToString();
  EXPECT_FALSE(got->has_value()) << "holds " << ::testing::PrintToString(**got);
}

void StoreReopenTest::Reopen() {
  store_.reset();
  store_ = GetParam().reopen(clock_, kDefaultMaxKeyBytes);
  ASSERT_NE(store_, nullptr) << GetParam().name << ": reopen() returned no store";
}

}  // namespace idem
