// The PostgreSQL store: every call is one prepared statement (src/stores/postgres/schema.cc
// holds the SQL) carried by the group committer; this file fills parameters and reads answers.
#include "stores/postgres/postgres_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "core/machine.h"
#include "core/thread_name.h"

namespace idem::pg {
namespace {

// Sequenced records have no retention: they stay until acknowledged or until their session
// expires, so they get one longer than any session (as in the memory store).
constexpr std::chrono::milliseconds kUntilAcknowledged = std::chrono::hours(24 * 365 * 100);
// The group committer puts at most this many statements in one transaction.
constexpr std::size_t kMaxGroup = 1024;
// The reaper's step: this many heap blocks of one table.
constexpr std::uint64_t kBlocksPerStep = 64;
constexpr std::int64_t kMaxBigint = std::numeric_limits<std::int64_t>::max();

// Lock classes, in the order groups take rows.
enum OrderClass : int { kOrderRecords = 0, kOrderSessions = 1, kOrderEntities = 2 };
enum Table : int { kRecordsTable = 0, kSessionsTable = 1, kEntitiesTable = 2, kTables = 3 };

Timestamp At(std::int64_t ms) { return Timestamp(std::chrono::milliseconds(ms)); }

Outcome OutcomeOf(std::int16_t v) { return v == 1 ? Outcome::kFailure : Outcome::kSuccess; }
std::int16_t OutcomeParam(Outcome o) { return o == Outcome::kFailure ? 1 : 0; }

std::uint32_t AttemptOf(std::int64_t v) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(v, 0, 0xFFFFFFFF));
}

void BindFingerprint(Params& p, const std::optional<Fingerprint>& fp) {
  p.OptionalBytes(fp ? fp->bytes.data() : nullptr, fp ? fp->bytes.size() : 0);
}

Result<std::optional<Fingerprint>> FingerprintOf(const PGresult* r, int row, int col) {
  if (IsNull(r, row, col)) return std::optional<Fingerprint>();
  const std::string_view b = GetBytes(r, row, col);
  Fingerprint fp;
  if (b.size() != fp.bytes.size()) {
    return DataLossError("stored fingerprint is " + std::to_string(b.size()) + " bytes");
  }
  std::memcpy(fp.bytes.data(), b.data(), b.size());
  return std::optional<Fingerprint>(fp);
}

Status WrongShape(std::string_view what) {
  return InternalError(std::string("PostgreSQL answered ") + std::string(what) +
                       " with an unexpected result");
}

// A single-row result, or the op's error.
Result<const PGresult*> OneRow(const Op& op) {
  if (!op.status.ok()) return op.status;
  if (op.result == nullptr || PQntuples(op.result.get()) != 1) return WrongShape(op.statement);
  return static_cast<const PGresult*>(op.result.get());
}

Result<WriteAnswer> AffectedAnswer(const Op& op) {
  if (!op.status.ok()) return op.status;
  return AffectedRows(op.result.get()) == 1 ? WriteAnswer::kApplied : WriteAnswer::kLeaseLost;
}

// An acquired row's token, attempt and lease deadline, columns c + 1 to c + 3. A record's
// takeover is its attempt > 1; begin_version says so with a kind of its own.
Acquired AcquiredOf(const PGresult* r, int row, int c, std::optional<bool> takeover = {}) {
  const std::uint32_t attempt = AttemptOf(GetInt8(r, row, c + 2));
  return Acquired{static_cast<Token>(GetInt8(r, row, c + 1)), attempt, At(GetInt8(r, row, c + 3)),
                  takeover.value_or(attempt > 1)};
}

// Rows of begin_record / begin_seq: kind, token, attempt, lease_deadline, outcome, response,
// from column `c` of `row` on.
Result<BeginAnswer> BeginAnswerOf(const PGresult* r, int row = 0, int c = 0) {
  switch (GetInt2(r, row, c)) {
    case kKindAcquired:
      return BeginAnswer(AcquiredOf(r, row, c));
    case kKindBusy:
      return BeginAnswer(Busy{At(GetInt8(r, row, c + 3))});
    case kKindReplay:
      return BeginAnswer(Replay{OutcomeOf(GetInt2(r, row, c + 4)),
                                std::string(GetBytes(r, row, c + 5)),
                                AttemptOf(GetInt8(r, row, c + 2))});
    case kKindConflict:
      return BeginAnswer(Conflict{});
    case kKindStale:
      return BeginAnswer(Stale{});
    default:
      return WrongShape("begin");
  }
}

// A row in kRecordColumns order.
Result<Record> RecordOf(const PGresult* r, int row) {
  Record rec;
  rec.scope = std::string(GetBytes(r, row, 0));
  rec.key = std::string(GetBytes(r, row, 1));
  rec.state = GetInt2(r, row, 2) == 2 ? RecordState::kCompleted : RecordState::kInProgress;
  auto fp = FingerprintOf(r, row, 3);
  if (!fp) return fp.error();
  rec.fingerprint = *fp;
  rec.token = static_cast<Token>(GetInt8(r, row, 4));
  rec.attempt = AttemptOf(GetInt8(r, row, 5));
  rec.created = At(GetInt8(r, row, 6));
  rec.lease_deadline = At(GetInt8(r, row, 7));
  rec.expires = At(GetInt8(r, row, 8));
  rec.outcome = OutcomeOf(GetInt2(r, row, 9));
  rec.response = std::string(GetBytes(r, row, 10));
  return rec;
}

Status UnknownSession(std::string_view scope, std::string_view client_id) {
  return FailedPreconditionError("session '" + std::string(client_id) + "' in scope '" +
                                 std::string(scope) + "' is unknown or expired; register it again");
}

Status CheckBigint(std::string_view what, std::uint64_t v) {
  if (v > static_cast<std::uint64_t>(kMaxBigint)) {
    return InvalidArgumentError(std::string(what) + " " + std::to_string(v) +
                                " is over the PostgreSQL store's limit of 2^63-1");
  }
  return OkStatus();
}

void FillBegin(Op& op, const BeginRequest& r, Timestamp now, std::chrono::milliseconds abandoned) {
  op.statement = kBegin;
  op.params.Bytes(r.scope);
  op.params.Bytes(r.key);
  BindFingerprint(op.params, r.fingerprint);
  op.params.Int8(Millis(now));
  op.params.Int8(Millis(r.lease));
  op.params.Int8(Millis(abandoned));
  op.Order(kOrderRecords, r.scope, r.key);
}

void FillComplete(Op& op, const CompleteRequest& r, Timestamp now) {
  op.statement = kComplete;
  op.params.Bytes(r.scope);
  op.params.Bytes(r.key);
  op.params.Int8(TokenParam(r.token));
  op.params.Int2(OutcomeParam(r.outcome));
  op.params.Bytes(r.response);
  op.params.Int8(Millis(now));
  op.params.Int8(Millis(r.retention));
  op.Order(kOrderRecords, r.scope, r.key);
}

void FillExtend(Op& op, const ExtendRequest& r, Timestamp now,
                std::chrono::milliseconds abandoned) {
  op.statement = kExtend;
  op.params.Bytes(r.scope);
  op.params.Bytes(r.key);
  op.params.Int8(TokenParam(r.token));
  op.params.Int8(Millis(now));
  op.params.Int8(Millis(r.lease));
  op.params.Int8(Millis(abandoned));
  op.Order(kOrderRecords, r.scope, r.key);
}

// A release of a record or an entity version: (scope, name, token, now), the same for both.
void FillRelease(Op& op, const char* statement, OrderClass order, std::string_view scope,
                 std::string_view name, Token token, Timestamp now) {
  op.statement = statement;
  op.params.Bytes(scope);
  op.params.Bytes(name);
  op.params.Int8(TokenParam(token));
  op.params.Int8(Millis(now));
  op.Order(order, scope, name);
}

// "(block,0)": the first tuple of a block, as a tid in text form.
std::string BlockTid(std::uint64_t block) {
  if (block > 0xFFFFFFFFu) return "(4294967295,65535)";
  return "(" + std::to_string(block) + ",0)";
}

Result<std::optional<int>> ReadVersion(Connection& conn, std::string_view schema,
                                       Deadline deadline) {
  auto r = conn.Exec(VersionQuery(schema), deadline);
  if (!r) {
    // No schema or no meta table: not initialised.
    if (r.error().code() == StatusCode::kFailedPrecondition) return std::optional<int>();
    return r.error();
  }
  if (*r == nullptr || PQntuples(r->get()) == 0) return std::optional<int>();
  const char* text = PQgetvalue(r->get(), 0, 0);
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0') {
    return DataLossError("schema \"" + std::string(schema) + "\" has the version \"" +
                         std::string(text) + "\", which is not a number");
  }
  return std::optional<int>(static_cast<int>(v));
}

std::string MissingSchema(std::string_view schema) {
  return "the database has no idem schema \"" + std::string(schema) +
         "\"; run `idem store init URL` (or InitPostgresSchema) to create it";
}

std::string OtherVersion(std::string_view schema, int found) {
  return "idem schema \"" + std::string(schema) + "\" is at version " + std::to_string(found) +
         ", but this idem uses version " + std::to_string(kPostgresSchemaVersion);
}

Status CheckOptions(const PostgresStoreOptions& o) {
  IDEM_RETURN_IF_ERROR(CheckSchemaName(o.schema));
  if (o.pool_size == 0) return InvalidArgumentError("pool_size must be at least 1");
  if (o.max_transactions == 0) return InvalidArgumentError("max_transactions must be at least 1");
  if (o.reclaim_batch == 0) return InvalidArgumentError("reclaim_batch must be at least 1");
  if (o.connect_timeout.count() <= 0 || o.statement_timeout.count() <= 0) {
    return InvalidArgumentError("connect_timeout and statement_timeout must be positive");
  }
  if (o.max_key_bytes > kMaxPostgresKeyBytes) {
    return InvalidArgumentError("max_key_bytes " + std::to_string(o.max_key_bytes) + " is above " +
                                std::to_string(kMaxPostgresKeyBytes) +
                                ", the longest key a PostgreSQL index row holds with its scope");
  }
  return core::CheckAbandonedRetention(o.abandoned_retention);
}

// The session's statement_timeout: a little below the client's, so that the server cancels a
// statement stuck on a lock (an error for that call alone) before the client gives up on the
// connection (an error for its whole group).
std::chrono::milliseconds ServerTimeout(std::chrono::milliseconds client) {
  return std::max<std::chrono::milliseconds>(std::chrono::milliseconds(1), client * 9 / 10);
}

Connector MakeConnector(const PostgresStoreOptions& o, const std::vector<Statement>* statements) {
  return [conninfo = o.conninfo, timeout = ServerTimeout(o.statement_timeout),
          statements](Deadline deadline) -> Result<std::unique_ptr<Connection>> {
    auto conn = Connection::Open(conninfo, deadline, timeout);
    if (!conn) return conn;
    IDEM_RETURN_IF_ERROR((*conn)->EnterPipeline(*statements, deadline));
    return conn;
  };
}

}  // namespace

// ---- opening ----

PostgresStore::PostgresStore(const PostgresStoreOptions& options, std::vector<Statement> statements)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : &Clock::System()),
      statements_(std::move(statements)),
      pool_(MakeConnector(options_, &statements_), options_.max_transactions,
            options_.connect_timeout),
      group_(MakeConnector(options_, &statements_), options_.pool_size, kMaxGroup,
             options_.connect_timeout, options_.statement_timeout) {
  if (options_.reclaim_interval.count() > 0)
    reaper_ = std::thread([this] {
      core::NameThisThread("idem-pg-reaper");
      ReaperLoop();
    });
}

PostgresStore::~PostgresStore() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

Result<std::unique_ptr<Store>> PostgresStore::Open(const PostgresStoreOptions& options) {
  IDEM_RETURN_IF_ERROR(CheckOptions(options));
  // The connection within connect_timeout, as every call's; then the schema's checks within
  // statement_timeout.
  auto conn = Connection::Open(options.conninfo, DeadlineIn(options.connect_timeout),
                               ServerTimeout(options.statement_timeout));
  if (!conn) return conn.error();
  const Deadline deadline = DeadlineIn(options.statement_timeout);
  auto version = ReadVersion(**conn, options.schema, deadline);
  if (!version) return version.error();
  if (!*version) return FailedPreconditionError(MissingSchema(options.schema));
  if (**version != kPostgresSchemaVersion) {
    return FailedPreconditionError(OtherVersion(options.schema, **version) +
                                   "; run `idem store init URL` with a matching idem");
  }
  // Prepare once here too, so that a damaged schema is reported at open, not at the first call.
  auto store = std::make_unique<PostgresStore>(options, Statements(options.schema));
  if (Status s = (*conn)->EnterPipeline(store->statements_, deadline); !s.ok()) {
    if (s.code() != StatusCode::kInternal) return s;  // the server went away: kUnavailable
    return FailedPreconditionError("schema \"" + options.schema +
                                   "\" does not have idem's tables as this idem made them (" +
                                   s.message() + "); was it changed by hand?");
  }
  store->pool_.Add(std::move(*conn));
  return std::unique_ptr<Store>(std::move(store));
}

PostgresStore* AsPostgres(Store& store) { return dynamic_cast<PostgresStore*>(&store); }

// ---- records ----

Result<BeginAnswer> PostgresStore::Begin(const BeginRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckBegin(req, options_.max_key_bytes));
  Op op;
  FillBegin(op, req, clock_->Now(), options_.abandoned_retention);
  Run({&op, 1});
  auto row = OneRow(op);
  if (!row) return row.error();
  return BeginAnswerOf(*row);
}

Result<WriteAnswer> PostgresStore::Complete(const CompleteRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckComplete(req, options_.max_key_bytes));
  Op op;
  FillComplete(op, req, clock_->Now());
  Run({&op, 1});
  return AffectedAnswer(op);
}

Result<WriteAnswer> PostgresStore::Release(std::string_view scope, std::string_view key,
                                           Token token) {
  IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, options_.max_key_bytes));
  Op op;
  FillRelease(op, kRelease, kOrderRecords, scope, key, token, clock_->Now());
  Run({&op, 1});
  return AffectedAnswer(op);
}

Result<WriteAnswer> PostgresStore::Extend(std::string_view scope, std::string_view key, Token token,
                                          std::chrono::milliseconds lease) {
  const ExtendRequest req{.scope = scope, .key = key, .token = token, .lease = lease};
  IDEM_RETURN_IF_ERROR(core::CheckExtend(req, options_.max_key_bytes));
  Op op;
  FillExtend(op, req, clock_->Now(), options_.abandoned_retention);
  Run({&op, 1});
  return AffectedAnswer(op);
}

namespace {

// A batch as one group (one round trip, one commit): requests that fail `check` are answered
// with their error and not sent; the others are filled into ops, run, and answered in order.
template <typename Answer, typename Req, typename Check, typename Fill, typename Run,
          typename Decide>
std::vector<Result<Answer>> RunBatch(std::span<const Req> reqs, Check check, Fill fill, Run run,
                                     Decide decide) {
  std::vector<Status> checks;
  checks.reserve(reqs.size());
  std::size_t valid = 0;
  for (const Req& r : reqs) {
    checks.push_back(check(r));
    if (checks.back().ok()) ++valid;
  }
  std::unique_ptr<Op[]> ops(new Op[valid]);
  for (std::size_t i = 0, k = 0; i < reqs.size(); ++i) {
    if (checks[i].ok()) fill(ops[k++], reqs[i]);
  }
  run(std::span<Op>(ops.get(), valid));
  std::vector<Result<Answer>> out;
  out.reserve(reqs.size());
  for (std::size_t i = 0, k = 0; i < reqs.size(); ++i) {
    if (!checks[i].ok()) {
      out.emplace_back(std::move(checks[i]));
    } else {
      out.push_back(decide(ops[k++]));
    }
  }
  return out;
}

// A batch's requests that passed `check` (the others are answered with its error): `first`
// holds the first request of each distinct (scope, key), in key order; `rest` the later ones,
// in the batch's order.
struct KeySplit {
  std::vector<std::size_t> first;
  std::vector<std::size_t> rest;
};

template <typename Req, typename Answer, typename Check>
KeySplit SplitByKey(std::span<const Req> reqs, std::vector<std::optional<Result<Answer>>>& answers,
                    Check check) {
  std::vector<std::size_t> order;
  order.reserve(reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    Status st = check(reqs[i]);
    if (st.ok()) {
      order.push_back(i);
    } else {
      answers[i].emplace(std::move(st));
    }
  }
  const auto id = [&](std::size_t i) { return std::pair(reqs[i].scope, reqs[i].key); };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return id(a) < id(b); });
  KeySplit split;
  split.first.reserve(order.size());
  for (std::size_t i : order) {
    if (!split.first.empty() && id(split.first.back()) == id(i)) {
      split.rest.push_back(i);
    } else {
      split.first.push_back(i);
    }
  }
  std::sort(split.rest.begin(), split.rest.end());
  return split;
}

// The row of each request in a set-based statement's result, whose column 0 is the 1-based
// ordinal of a request among `count`: -1 for a request without a row. Every ordinal at most
// once; with `all`, every one exactly once.
Result<std::vector<int>> RowsByOrdinal(const Op& op, std::size_t count, bool all) {
  if (!op.status.ok()) return op.status;
  const PGresult* r = op.result.get();
  if (r == nullptr) return WrongShape(op.statement);
  std::vector<int> row_of(count, -1);
  const int rows = PQntuples(r);
  for (int row = 0; row < rows; ++row) {
    const std::int64_t i = GetInt8(r, row, 0);
    if (i < 1 || static_cast<std::uint64_t>(i) > count ||
        row_of[static_cast<std::size_t>(i - 1)] != -1) {
      return WrongShape(op.statement);
    }
    row_of[static_cast<std::size_t>(i - 1)] = row;
  }
  if (all && static_cast<std::size_t>(rows) != count) return WrongShape(op.statement);
  return row_of;
}

// A batch of enough distinct keys is one call that runs alone: the set-based statement (filled
// by `fill_set` from the first request of each key, in key order) and then, in the same
// transaction, one statement (`fill_one`) for each later request of a key already named,
// decided in the batch's order after the first. Smaller batches are one statement per request.
// `set_row` answers a first request from its row of the set-based result (-1: none; with
// `every_row` each must have one); `one_answer` a request from its own statement.
template <typename Answer, typename Req, typename Check, typename FillSet, typename FillOne,
          typename SetRow, typename OneAnswer, typename Run>
std::vector<Result<Answer>> RunKeyedBatch(std::span<const Req> reqs, Check check, FillSet fill_set,
                                          bool every_row, SetRow set_row, FillOne fill_one,
                                          OneAnswer one_answer, Run run) {
  std::vector<std::optional<Result<Answer>>> answers(reqs.size());
  KeySplit split = SplitByKey(reqs, answers, check);
  const bool set = split.first.size() >= kSetBatchMin;
  std::vector<std::size_t>& single = split.rest;
  if (!set) {
    single.insert(single.end(), split.first.begin(), split.first.end());
    std::sort(single.begin(), single.end());
  }
  const std::size_t lead = set ? 1 : 0;
  std::unique_ptr<Op[]> ops(new Op[lead + single.size()]);
  if (set) {
    fill_set(ops[0], std::span<const std::size_t>(split.first));
    ops[0].alone = true;  // so the call keeps its order: the set-based statement first
  }
  for (std::size_t n = 0; n < single.size(); ++n) fill_one(ops[lead + n], reqs[single[n]]);
  run(std::span<Op>(ops.get(), lead + single.size()));
  if (set) {
    const auto rows = RowsByOrdinal(ops[0], split.first.size(), every_row);
    for (std::size_t n = 0; n < split.first.size(); ++n) {
      answers[split.first[n]].emplace(rows ? set_row(ops[0], (*rows)[n])
                                           : Result<Answer>(rows.error()));
    }
  }
  for (std::size_t n = 0; n < single.size(); ++n) {
    answers[single[n]].emplace(one_answer(ops[lead + n]));
  }
  std::vector<Result<Answer>> out;
  out.reserve(answers.size());
  for (auto& a : answers) out.push_back(std::move(*a));
  return out;
}

}  // namespace

std::vector<Result<BeginAnswer>> PostgresStore::BeginBatch(std::span<const BeginRequest> reqs) {
  const Timestamp now = clock_->Now();
  ArrayParam scopes(kBytea), keys(kBytea), fps(kBytea), leases(kInt8);
  return RunKeyedBatch<BeginAnswer>(
      reqs, [&](const BeginRequest& r) { return core::CheckBegin(r, options_.max_key_bytes); },
      [&](Op& op, std::span<const std::size_t> first) {
        for (std::size_t k : first) {
          const BeginRequest& r = reqs[k];
          scopes.Bytes(r.scope);
          keys.Bytes(r.key);
          if (r.fingerprint) {
            fps.Bytes({reinterpret_cast<const char*>(r.fingerprint->bytes.data()),
                       r.fingerprint->bytes.size()});
          } else {
            fps.Null();
          }
          leases.Int8(Millis(r.lease));
        }
        op.statement = kBeginMany;
        for (const ArrayParam* a : {&scopes, &keys, &fps, &leases}) op.params.Bytes(a->view());
        op.params.Int8(Millis(now));
        op.params.Int8(Millis(options_.abandoned_retention));
      },
      /*every_row=*/true,
      [](const Op& op, int row) { return BeginAnswerOf(op.result.get(), row, 1); },
      [&](Op& op, const BeginRequest& r) { FillBegin(op, r, now, options_.abandoned_retention); },
      [](const Op& op) -> Result<BeginAnswer> {
        auto row = OneRow(op);
        if (!row) return row.error();
        return BeginAnswerOf(*row);
      },
      [&](std::span<Op> ops) { Run(ops); });
}

std::vector<Result<WriteAnswer>> PostgresStore::CompleteBatch(
    std::span<const CompleteRequest> reqs) {
  const Timestamp now = clock_->Now();
  ArrayParam scopes(kBytea), keys(kBytea), tokens(kInt8), outcomes(kInt2), responses(kBytea),
      retentions(kInt8);
  return RunKeyedBatch<WriteAnswer>(
      reqs,
      [&](const CompleteRequest& r) { return core::CheckComplete(r, options_.max_key_bytes); },
      [&](Op& op, std::span<const std::size_t> first) {
        for (std::size_t k : first) {
          const CompleteRequest& r = reqs[k];
          scopes.Bytes(r.scope);
          keys.Bytes(r.key);
          tokens.Int8(TokenParam(r.token));
          outcomes.Int2(OutcomeParam(r.outcome));
          responses.Bytes(r.response);
          retentions.Int8(Millis(r.retention));
        }
        op.statement = kCompleteMany;
        for (const ArrayParam* a : {&scopes, &keys, &tokens, &outcomes, &responses, &retentions}) {
          op.params.Bytes(a->view());
        }
        op.params.Int8(Millis(now));
      },
      /*every_row=*/false,
      [](const Op&, int row) -> Result<WriteAnswer> {
        return row >= 0 ? WriteAnswer::kApplied : WriteAnswer::kLeaseLost;
      },
      [&](Op& op, const CompleteRequest& r) { FillComplete(op, r, now); },
      [](const Op& op) { return AffectedAnswer(op); }, [&](std::span<Op> ops) { Run(ops); });
}

std::vector<Result<WriteAnswer>> PostgresStore::ExtendBatch(std::span<const ExtendRequest> reqs) {
  const Timestamp now = clock_->Now();
  return RunBatch<WriteAnswer>(
      reqs, [&](const ExtendRequest& r) { return core::CheckExtend(r, options_.max_key_bytes); },
      [&](Op& op, const ExtendRequest& r) { FillExtend(op, r, now, options_.abandoned_retention); },
      [&](std::span<Op> ops) { Run(ops); }, [](Op& op) { return AffectedAnswer(op); });
}

// ---- operator calls ----

Result<std::optional<Record>> PostgresStore::Get(std::string_view scope, std::string_view key) {
  IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, options_.max_key_bytes));
  Op op;
  op.statement = kGet;
  op.params.Bytes(scope);
  op.params.Bytes(key);
  op.params.Int8(Millis(clock_->Now()));
  op.Order(kOrderRecords, scope, key);
  Run({&op, 1});
  if (!op.status.ok()) return op.status;
  if (PQntuples(op.result.get()) == 0) return std::optional<Record>();
  auto rec = RecordOf(op.result.get(), 0);
  if (!rec) return rec.error();
  return std::optional<Record>(std::move(*rec));
}

Result<std::vector<Record>> PostgresStore::List(const ListFilter& filter) {
  if (filter.scope) IDEM_RETURN_IF_ERROR(ValidateScope(*filter.scope));
  std::string sql = std::string("SELECT ") + kRecordColumns + " FROM " +
                    QuotedSchema(options_.schema) + ".records WHERE expires > $1";
  Params params;
  std::vector<Oid> types;
  params.Int8(Millis(clock_->Now()));
  types.push_back(kInt8);
  const auto next = [&] { return "$" + std::to_string(types.size() + 1); };
  if (filter.state) {
    sql += " AND state = " + next();
    params.Int2(*filter.state == RecordState::kCompleted ? 2 : 1);
    types.push_back(kInt2);
  }
  if (filter.scope) {
    sql += " AND scope = " + next();
    params.Bytes(*filter.scope);
    types.push_back(kBytea);
  }
  if (filter.created_before) {
    sql += " AND created < " + next();
    params.Int8(Millis(*filter.created_before));
    types.push_back(kInt8);
  }
  sql += " LIMIT " + next();
  params.Int8(static_cast<std::int64_t>(
      std::min<std::uint64_t>(filter.limit, static_cast<std::uint64_t>(kMaxBigint))));
  types.push_back(kInt8);

  auto conn = pool_.Take();
  if (!conn) return conn.error();
  PooledConnection pooled(pool_, std::move(*conn));
  auto r = RunQuery(*pooled, sql, params, types.data(), DeadlineIn(options_.statement_timeout));
  if (!r) return r.error();
  std::vector<Record> out;
  const int rows = PQntuples(r->get());
  out.reserve(static_cast<std::size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    auto rec = RecordOf(r->get(), i);
    if (!rec) return rec.error();
    out.push_back(std::move(*rec));
  }
  return out;
}

Result<bool> PostgresStore::Erase(std::string_view scope, std::string_view key) {
  IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, options_.max_key_bytes));
  Op op;
  op.statement = kErase;
  op.params.Bytes(scope);
  op.params.Bytes(key);
  op.params.Int8(Millis(clock_->Now()));
  op.Order(kOrderRecords, scope, key);
  Run({&op, 1});
  if (!op.status.ok()) return op.status;
  return PQntuples(op.result.get()) == 1 && GetBool(op.result.get(), 0, 0);
}

Result<StoreStats> PostgresStore::Stats() {
  auto conn = pool_.Take();
  if (!conn) return conn.error();
  PooledConnection pooled(pool_, std::move(*conn));
  Params params;
  params.Int8(Millis(clock_->Now()));
  auto r = RunStatement(*pooled, kStats, params, DeadlineIn(options_.statement_timeout));
  if (!r) return r.error();
  if (PQntuples(r->get()) != 1) return WrongShape("stats");
  const auto count = [&](int col) { return static_cast<std::uint64_t>(GetInt8(r->get(), 0, col)); };
  StoreStats st;
  st.in_progress = count(0);
  st.completed = count(1);
  st.sessions = count(2);
  st.entities = count(3);
  st.bytes = count(4);
  return st;
}

Status PostgresStore::Ready() {
  {
    auto conn = pool_.Take();
    if (!conn) return conn.error();
    PooledConnection pooled(pool_, std::move(*conn));
    // A standby, or a database or role whose transactions are read-only, answers every read and
    // refuses every write: not ready, though a read alone would say so.
    const Params none;
    auto r =
        RunQuery(*pooled, "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
                 none, nullptr, DeadlineIn(options_.statement_timeout));
    if (!r) return r.error();
    if (PQntuples(r->get()) != 1 || PQnfields(r->get()) != 2) return WrongShape("ready");
    if (std::string_view(PQgetvalue(r->get(), 0, 0)) == "t") {
      return UnavailableError(
          "PostgreSQL is a standby (in recovery): it refuses writes; point the store at the "
          "primary");
    }
    if (std::string_view(PQgetvalue(r->get(), 0, 1)) == "on") {
      return UnavailableError(
          "PostgreSQL transactions are read-only here (default_transaction_read_only for the "
          "database or role): writes are refused");
    }
  }
  return Store::Ready();  // and idem's own statements answer
}

Result<std::vector<std::uint64_t>> PostgresStore::TableBlocks(Connection& conn) {
  Params none;
  auto r = RunStatement(conn, kTableBlocks, none, DeadlineIn(options_.statement_timeout));
  if (!r) return r.error();
  if (PQntuples(r->get()) != 1) return WrongShape("table sizes");
  std::vector<std::uint64_t> blocks;
  for (int t = 0; t < kTables; ++t) {
    blocks.push_back(
        static_cast<std::uint64_t>(std::max<std::int64_t>(0, GetInt8(r->get(), 0, t))));
  }
  return blocks;
}

Result<std::uint64_t> PostgresStore::ReapStep(Connection& conn, int table, std::uint64_t from,
                                              std::uint64_t to, Timestamp now, std::size_t limit) {
  static constexpr const char* kStatement[kTables] = {kReapRecords, kReapSessions, kReapEntities};
  Params params;
  params.Text(BlockTid(from));
  params.Text(BlockTid(to));
  params.Int8(Millis(now));
  params.Int8(static_cast<std::int64_t>(limit));
  auto r = RunStatement(conn, kStatement[table], params, DeadlineIn(options_.statement_timeout));
  if (!r) return r.error();
  if (table != kSessionsTable) return AffectedRows(r->get());
  if (PQntuples(r->get()) != 1) return WrongShape("reap");
  // A session counts once, and each of its records once, as in the memory store.
  return static_cast<std::uint64_t>(GetInt8(r->get(), 0, 0) + GetInt8(r->get(), 0, 1));
}

Result<std::uint64_t> PostgresStore::ReapAll(Connection& conn, Timestamp now) {
  auto blocks = TableBlocks(conn);
  if (!blocks) return blocks.error();
  std::uint64_t total = 0;
  for (int t = 0; t < kTables; ++t) {
    for (std::uint64_t from = 0; from < (*blocks)[static_cast<std::size_t>(t)];) {
      auto n = ReapStep(conn, t, from, from + kBlocksPerStep, now, options_.reclaim_batch);
      if (!n) return n.error();
      total += *n;
      // A full step may have left more in the same blocks.
      if (*n < options_.reclaim_batch) from += kBlocksPerStep;
    }
  }
  return total;
}

Result<std::uint64_t> PostgresStore::Purge() {
  auto conn = pool_.Take();
  if (!conn) return conn.error();
  PooledConnection pooled(pool_, std::move(*conn));
  return ReapAll(*pooled, clock_->Now());
}

void PostgresStore::ReaperLoop() {
  // Where the sweep goes on at the next tick.
  int table = 0;
  std::uint64_t from = 0;
  std::unique_lock<std::mutex> lock(reaper_mu_);
  for (;;) {
    // Real time on purpose: the reaper paces itself; what is expired comes from clock_.
    reaper_cv_.wait_for(lock, options_.reclaim_interval, [this] { return stopping_; });
    if (stopping_) return;
    lock.unlock();
    auto conn = pool_.Take();
    if (conn) {
      PooledConnection pooled(pool_, std::move(*conn));
      auto blocks = TableBlocks(*pooled);
      if (blocks) {
        std::uint64_t all = 0;
        for (std::uint64_t b : *blocks) all += b;
        // A tick sweeps a sixteenth of the heap (at least one step): a whole pass takes about
        // sixteen intervals whatever the size, one short transaction per step.
        std::uint64_t budget = std::max(kBlocksPerStep, all / 16);
        for (int tables_seen = 0; budget > 0 && tables_seen <= kTables;) {
          {
            std::lock_guard<std::mutex> stop(reaper_mu_);
            if (stopping_) return;
          }
          if (from >= (*blocks)[static_cast<std::size_t>(table)]) {
            table = (table + 1) % kTables;
            from = 0;
            ++tables_seen;
            continue;
          }
          auto n = ReapStep(*pooled, table, from, from + kBlocksPerStep, clock_->Now(),
                            options_.reclaim_batch);
          if (!n) break;  // the server is away; try again next tick
          if (*n < options_.reclaim_batch) from += kBlocksPerStep;
          budget -= std::min(budget, kBlocksPerStep);
        }
      }
    }
    lock.lock();
  }
}

// ---- client sessions ----

Status PostgresStore::CheckClient(std::string_view scope, std::string_view client_id) const {
  SessionRequest r;
  r.scope = scope;
  r.client_id = client_id;
  return core::CheckSession(r, options_.max_key_bytes);
}

Result<SessionInfo> PostgresStore::OpenSession(const SessionRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckSession(req, options_.max_key_bytes));
  Op op;
  op.statement = kOpenSession;
  op.params.Bytes(req.scope);
  op.params.Bytes(req.client_id);
  op.params.Int8(Millis(req.ttl));
  op.params.Int8(req.window);
  op.params.Int8(Millis(clock_->Now()));
  op.Order(kOrderSessions, req.scope, req.client_id);
  Run({&op, 1});
  auto row = OneRow(op);
  if (!row) return row.error();
  SessionInfo info;
  info.scope = std::string(req.scope);
  info.client_id = std::string(req.client_id);
  info.low_water = static_cast<std::uint64_t>(GetInt8(*row, 0, 0));
  info.window = static_cast<std::uint32_t>(GetInt8(*row, 0, 1));
  info.outstanding = static_cast<std::uint32_t>(GetInt8(*row, 0, 2));
  info.expires = At(GetInt8(*row, 0, 3));
  return info;
}

Result<BeginAnswer> PostgresStore::BeginSequenced(const SequencedBeginRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckSequenced(req, options_.max_key_bytes));
  IDEM_RETURN_IF_ERROR(CheckBigint("sequence number", req.seq));
  IDEM_RETURN_IF_ERROR(CheckBigint("acknowledgement", req.ack));
  Op op;
  op.statement = kBeginSeq;
  op.params.Bytes(req.scope);
  op.params.Bytes(req.client_id);
  op.params.Int8(static_cast<std::int64_t>(req.seq));
  op.params.Int8(static_cast<std::int64_t>(req.ack));
  BindFingerprint(op.params, req.fingerprint);
  op.params.Int8(Millis(clock_->Now()));
  op.params.Int8(Millis(req.lease));
  op.params.Int8(Millis(options_.abandoned_retention));
  op.Order(kOrderSessions, req.scope, req.client_id);
  Run({&op, 1});
  auto row = OneRow(op);
  if (!row) return row.error();
  switch (GetInt2(*row, 0, 0)) {
    case kKindUnknownSession:
      return UnknownSession(req.scope, req.client_id);
    case kKindWindowFull:
      return ResourceExhaustedError("sequence number " + std::to_string(req.seq) +
                                    " is past the session window (low water " +
                                    std::to_string(GetInt8(*row, 0, 6)) + ", window " +
                                    std::to_string(GetInt8(*row, 0, 7)) + ")");
    default:
      return BeginAnswerOf(*row);
  }
}

namespace {
Result<WriteAnswer> SequencedWrite(const Op& op, std::string_view scope,
                                   std::string_view client_id) {
  auto row = OneRow(op);
  if (!row) return row.error();
  switch (GetInt2(*row, 0, 0)) {
    case kWriteApplied:
      return WriteAnswer::kApplied;
    case kWriteLeaseLost:
      return WriteAnswer::kLeaseLost;
    case kWriteUnknownSession:
      return UnknownSession(scope, client_id);
    default:
      return WrongShape(op.statement);
  }
}
}  // namespace

Result<WriteAnswer> PostgresStore::CompleteSequenced(const SequencedCompleteRequest& req) {
  IDEM_RETURN_IF_ERROR(CheckClient(req.scope, req.client_id));
  if (req.seq == 0) return InvalidArgumentError("sequence number 0: numbers start at 1");
  if (req.seq > static_cast<std::uint64_t>(kMaxBigint)) return WriteAnswer::kLeaseLost;
  Op op;
  op.statement = kCompleteSeq;
  op.params.Bytes(req.scope);
  op.params.Bytes(req.client_id);
  op.params.Int8(static_cast<std::int64_t>(req.seq));
  op.params.Int8(TokenParam(req.token));
  op.params.Int2(OutcomeParam(req.outcome));
  op.params.Bytes(req.response);
  op.params.Int8(Millis(clock_->Now()));
  op.params.Int8(Millis(kUntilAcknowledged));
  op.Order(kOrderSessions, req.scope, req.client_id);
  Run({&op, 1});
  return SequencedWrite(op, req.scope, req.client_id);
}

Result<WriteAnswer> PostgresStore::ReleaseSequenced(std::string_view scope,
                                                    std::string_view client_id, std::uint64_t seq,
                                                    Token token) {
  IDEM_RETURN_IF_ERROR(CheckClient(scope, client_id));
  if (seq == 0) return InvalidArgumentError("sequence number 0: numbers start at 1");
  if (seq > static_cast<std::uint64_t>(kMaxBigint)) return WriteAnswer::kLeaseLost;
  Op op;
  op.statement = kReleaseSeq;
  op.params.Bytes(scope);
  op.params.Bytes(client_id);
  op.params.Int8(static_cast<std::int64_t>(seq));
  op.params.Int8(TokenParam(token));
  op.params.Int8(Millis(clock_->Now()));
  op.Order(kOrderSessions, scope, client_id);
  Run({&op, 1});
  return SequencedWrite(op, scope, client_id);
}

Result<SessionInfo> PostgresStore::Acknowledge(std::string_view scope, std::string_view client_id,
                                               std::uint64_t ack) {
  IDEM_RETURN_IF_ERROR(CheckClient(scope, client_id));
  IDEM_RETURN_IF_ERROR(CheckBigint("acknowledgement", ack));
  Op op;
  op.statement = kAck;
  op.params.Bytes(scope);
  op.params.Bytes(client_id);
  op.params.Int8(static_cast<std::int64_t>(ack));
  op.params.Int8(Millis(clock_->Now()));
  op.Order(kOrderSessions, scope, client_id);
  Run({&op, 1});
  auto row = OneRow(op);
  if (!row) return row.error();
  if (GetInt2(*row, 0, 0) == kKindUnknownSession) return UnknownSession(scope, client_id);
  SessionInfo info;
  info.scope = std::string(scope);
  info.client_id = std::string(client_id);
  info.low_water = static_cast<std::uint64_t>(GetInt8(*row, 0, 1));
  info.window = static_cast<std::uint32_t>(GetInt8(*row, 0, 2));
  info.outstanding = static_cast<std::uint32_t>(GetInt8(*row, 0, 3));
  info.expires = At(GetInt8(*row, 0, 4));
  return info;
}

// ---- versioned entities ----

Status PostgresStore::CheckEntity(std::string_view scope, std::string_view entity) const {
  VersionedBeginRequest r;
  r.scope = scope;
  r.entity = entity;
  r.version = 1;
  return core::CheckVersioned(r, options_.max_key_bytes);
}

Result<BeginAnswer> PostgresStore::BeginVersioned(const VersionedBeginRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckVersioned(req, options_.max_key_bytes));
  IDEM_RETURN_IF_ERROR(CheckBigint("version", req.version));
  Op op;
  op.statement = kBeginVer;
  op.params.Bytes(req.scope);
  op.params.Bytes(req.entity);
  op.params.Int8(static_cast<std::int64_t>(req.version));
  op.params.Int8(Millis(clock_->Now()));
  op.params.Int8(Millis(req.lease));
  op.params.Int8(Millis(options_.abandoned_retention));
  op.Order(kOrderEntities, req.scope, req.entity);
  Run({&op, 1});
  auto row = OneRow(op);
  if (!row) return row.error();
  switch (const std::int16_t kind = GetInt2(*row, 0, 0); kind) {
    case kKindAcquired:
    case kKindTakeover:
      return BeginAnswer(AcquiredOf(*row, 0, 0, kind == kKindTakeover));
    case kKindBusy:
      return BeginAnswer(Busy{At(GetInt8(*row, 0, 3))});
    case kKindStale:
      return BeginAnswer(Stale{});
    default:
      return WrongShape("begin_version");
  }
}

Result<WriteAnswer> PostgresStore::CompleteVersioned(const VersionedCompleteRequest& req) {
  IDEM_RETURN_IF_ERROR(CheckEntity(req.scope, req.entity));
  IDEM_RETURN_IF_ERROR(core::CheckRetention(req.retention));
  Op op;
  op.statement = kCompleteVer;
  op.params.Bytes(req.scope);
  op.params.Bytes(req.entity);
  op.params.Int8(TokenParam(req.token));
  op.params.Int8(Millis(clock_->Now()));
  op.params.Int8(Millis(req.retention));
  op.Order(kOrderEntities, req.scope, req.entity);
  Run({&op, 1});
  return AffectedAnswer(op);
}

Result<WriteAnswer> PostgresStore::ReleaseVersioned(std::string_view scope, std::string_view entity,
                                                    Token token) {
  IDEM_RETURN_IF_ERROR(CheckEntity(scope, entity));
  Op op;
  FillRelease(op, kReleaseVer, kOrderEntities, scope, entity, token, clock_->Now());
  Run({&op, 1});
  return AffectedAnswer(op);
}

Result<std::optional<EntityVersion>> PostgresStore::GetVersion(std::string_view scope,
                                                               std::string_view entity) {
  IDEM_RETURN_IF_ERROR(CheckEntity(scope, entity));
  Op op;
  op.statement = kGetVer;
  op.params.Bytes(scope);
  op.params.Bytes(entity);
  op.params.Int8(Millis(clock_->Now()));
  op.Order(kOrderEntities, scope, entity);
  Run({&op, 1});
  if (!op.status.ok()) return op.status;
  const PGresult* r = op.result.get();
  if (PQntuples(r) == 0) return std::optional<EntityVersion>();
  EntityVersion v;
  v.scope = std::string(scope);
  v.entity = std::string(entity);
  v.applied = static_cast<std::uint64_t>(GetInt8(r, 0, 0));
  if (const std::int64_t p = GetInt8(r, 0, 1); p != 0)
    v.in_progress = static_cast<std::uint64_t>(p);
  v.token = static_cast<Token>(GetInt8(r, 0, 2));
  v.attempt = AttemptOf(GetInt8(r, 0, 3));
  v.lease_deadline = At(GetInt8(r, 0, 4));
  v.expires = At(GetInt8(r, 0, 5));
  return std::optional<EntityVersion>(std::move(v));
}

}  // namespace idem::pg

// ---- the public factory and schema calls ----

namespace idem {

Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options) {
  return pg::PostgresStore::Open(options);
}

namespace {
// Schema changes may wait for another init's lock; give them longer than one call.
std::chrono::milliseconds InitTimeout(const PostgresStoreOptions& o) {
  return std::max<std::chrono::milliseconds>(o.statement_timeout, std::chrono::seconds(60));
}
}  // namespace

// The connection is made within connect_timeout, as every store call's is: a server that
// accepts and never answers fails the call then, not a minute later.
Result<std::optional<int>> PostgresSchemaVersion(const PostgresStoreOptions& options) {
  IDEM_RETURN_IF_ERROR(pg::CheckSchemaName(options.schema));
  auto conn = pg::Connection::Open(options.conninfo, pg::DeadlineIn(options.connect_timeout),
                                   options.statement_timeout);
  if (!conn) return conn.error();
  return pg::ReadVersion(**conn, options.schema, pg::DeadlineIn(options.statement_timeout));
}

Status InitPostgresSchema(const PostgresStoreOptions& options) {
  IDEM_RETURN_IF_ERROR(pg::CheckSchemaName(options.schema));
  auto conn = pg::Connection::Open(options.conninfo, pg::DeadlineIn(options.connect_timeout),
                                   InitTimeout(options));
  if (!conn) return conn.error();
  const pg::Deadline deadline = pg::DeadlineIn(InitTimeout(options));
  pg::Connection& c = **conn;
  // One transaction: a failure part-way leaves the database as it was.
  auto begun = c.Exec("BEGIN", deadline);
  if (!begun) return begun.error();
  auto found = c.Exec(pg::SchemaPrologue(options.schema), deadline);
  if (!found) return found.error();
  if (*found != nullptr && PQntuples(found->get()) == 1) {
    const std::string version = PQgetvalue(found->get(), 0, 0);
    if (version != std::to_string(kPostgresSchemaVersion)) {
      (void)c.Exec("ROLLBACK", deadline);
      const int v = std::atoi(version.c_str());
      return FailedPreconditionError(pg::OtherVersion(options.schema, v) +
                                     "; this idem does not change another version's schema");
    }
  } else {
    // No idem version here: a table of idem's name that exists already is someone else's (or
    // its version row was deleted), and CREATE TABLE IF NOT EXISTS would keep it, so every
    // open would then fail to prepare idem's statements.
    auto tables = c.Exec(pg::ForeignTablesQuery(options.schema), deadline);
    if (!tables) return tables.error();
    if (*tables != nullptr && PQntuples(tables->get()) == 1 && !PQgetisnull(tables->get(), 0, 0)) {
      const std::string names = PQgetvalue(tables->get(), 0, 0);
      (void)c.Exec("ROLLBACK", deadline);
      return FailedPreconditionError(
          "schema \"" + options.schema + "\" already has tables named " + names +
          " but no idem schema version: they are not idem's (or its version was deleted); "
          "nothing was changed. Give idem a schema of its own (?schema=NAME in the URL)");
    }
  }
  auto body = c.Exec(pg::SchemaBody(options.schema), deadline);
  if (!body) return body.error();
  auto committed = c.Exec("COMMIT", deadline);
  if (!committed) return committed.error();
  return OkStatus();
}

}  // namespace idem
