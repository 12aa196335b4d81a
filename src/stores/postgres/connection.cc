#include "stores/postgres/connection.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace idem::pg {

// ---- Params ----

char* Params::Slot() {
  IDEM_CHECK_MSG(n_ < kMax, "too many statement parameters");
  return inline_[n_];
}

void Params::Bytes(std::string_view b) {
  IDEM_CHECK(n_ < kMax);
  // A non-null pointer even for empty bytes: NULL would bind SQL NULL.
  values_[n_] = b.empty() ? inline_[n_] : b.data();
  lengths_[n_] = static_cast<int>(b.size());
  formats_[n_] = 1;
  ++n_;
}

void Params::OptionalBytes(const std::uint8_t* b, std::size_t n) {
  IDEM_CHECK(n_ < kMax);
  values_[n_] = reinterpret_cast<const char*>(b);
  lengths_[n_] = b == nullptr ? 0 : static_cast<int>(n);
  formats_[n_] = 1;
  ++n_;
}

void Params::Int8(std::int64_t v) {
  char* p = Slot();
  const std::uint64_t be = __builtin_bswap64(static_cast<std::uint64_t>(v));
  std::memcpy(p, &be, 8);
  values_[n_] = p;
  lengths_[n_] = 8;
  formats_[n_] = 1;
  ++n_;
}

void Params::Int2(std::int16_t v) {
  char* p = Slot();
  const std::uint16_t be = __builtin_bswap16(static_cast<std::uint16_t>(v));
  std::memcpy(p, &be, 2);
  values_[n_] = p;
  lengths_[n_] = 2;
  formats_[n_] = 1;
  ++n_;
}

void Params::Text(std::string_view s) {
  char* p = Slot();
  IDEM_CHECK(s.size() < sizeof(inline_[0]));
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  values_[n_] = p;
  lengths_[n_] = static_cast<int>(s.size());
  formats_[n_] = 0;
  ++n_;
}

// ---- ArrayParam ----

namespace {
void PutBE32(std::string& buf, std::size_t at, std::uint32_t v) {
  const std::uint32_t be = __builtin_bswap32(v);
  std::memcpy(buf.data() + at, &be, 4);
}
// The binary array header: ndim, has_null, element type, then (size, lower bound) per dimension.
constexpr std::size_t kArrayHeader = 20;
constexpr std::size_t kArrayHasNull = 4;
constexpr std::size_t kArraySize = 12;
}  // namespace

ArrayParam::ArrayParam(Oid element) : buf_(kArrayHeader, '\0') {
  PutBE32(buf_, 0, 1);
  PutBE32(buf_, 8, element);
  PutBE32(buf_, 16, 1);
}

void ArrayParam::Element(const void* data, std::uint32_t n) {
  const std::size_t at = buf_.size();
  buf_.resize(at + 4 + n);
  PutBE32(buf_, at, n);
  if (n != 0) std::memcpy(buf_.data() + at + 4, data, n);
  PutBE32(buf_, kArraySize, ++count_);
}

void ArrayParam::Bytes(std::string_view b) {
  Element(b.data(), static_cast<std::uint32_t>(b.size()));
}

void ArrayParam::Null() {
  const std::size_t at = buf_.size();
  buf_.resize(at + 4);
  PutBE32(buf_, at, 0xFFFFFFFFu);  // length -1
  PutBE32(buf_, kArrayHasNull, 1);
  PutBE32(buf_, kArraySize, ++count_);
}

void ArrayParam::Int8(std::int64_t v) {
  const std::uint64_t be = __builtin_bswap64(static_cast<std::uint64_t>(v));
  Element(&be, 8);
}

void ArrayParam::Int2(std::int16_t v) {
  const std::uint16_t be = __builtin_bswap16(static_cast<std::uint16_t>(v));
  Element(&be, 2);
}

// ---- errors ----

namespace {

std::string FirstLine(const char* text) {
  std::string s = text != nullptr ? text : "";
  const auto nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

std::string ConnectionError(PGconn* conn) {
  std::string s = FirstLine(conn != nullptr ? PQerrorMessage(conn) : "out of memory");
  return s.empty() ? "connection failed" : s;
}

std::string_view SqlState(const PGresult* r) {
  const char* s = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  return s != nullptr ? std::string_view(s) : std::string_view();
}

std::string ResultErrorText(const PGresult* r, std::string_view what) {
  const std::string_view state = SqlState(r);
  std::string msg = std::string(what) + ": " + FirstLine(PQresultErrorMessage(r));
  if (!state.empty()) msg += " (SQLSTATE " + std::string(state) + ")";
  return msg;
}

Status StatusOfResult(const PGresult* r, std::string_view what) {
  const std::string_view state = SqlState(r);
  std::string msg = ResultErrorText(r, what);
  const std::string_view cls = state.substr(0, 2);
  // Connection trouble, shutdown, timeouts, lock and resource limits, rolled-back transactions:
  // the call may succeed later.
  if (state.empty() || cls == "08" || cls == "57" || cls == "53" || cls == "40" ||
      state == "55P03" || state == "55006") {
    return UnavailableError(std::move(msg));
  }
  // idem's tables, functions or prepared statements are missing: the schema was dropped or
  // damaged under a running store.
  if (state == "3F000" || state == "42P01" || state == "42883" || state == "26000") {
    return FailedPreconditionError(std::move(msg) +
                                   "; the schema may be missing: run `idem store init URL`");
  }
  return InternalError(std::move(msg));
}

// ---- Connection ----

Connection::~Connection() {
  if (conn_ != nullptr) PQfinish(conn_);
}

Result<std::unique_ptr<Connection>> Connection::Open(const std::string& conninfo, Deadline deadline,
                                                     std::chrono::milliseconds statement_timeout) {
  // expand_dbname: `conninfo` may be a URI or keyword=value pairs.
  const char* const keys[] = {"dbname", "fallback_application_name", nullptr};
  const char* const values[] = {conninfo.c_str(), "idem", nullptr};
  PGconn* raw = PQconnectStartParams(keys, values, 1);
  std::unique_ptr<Connection> c(new Connection(raw));
  if (raw == nullptr || PQstatus(raw) == CONNECTION_BAD) {
    return UnavailableError("cannot connect to PostgreSQL: " + ConnectionError(raw));
  }
  PostgresPollingStatusType poll_status = PGRES_POLLING_WRITING;
  while (poll_status != PGRES_POLLING_OK) {
    if (poll_status == PGRES_POLLING_FAILED) {
      return UnavailableError("cannot connect to PostgreSQL: " + ConnectionError(raw));
    }
    Status waited = c->Wait(poll_status == PGRES_POLLING_WRITING, deadline);
    if (!waited.ok()) {
      return UnavailableError("cannot connect to PostgreSQL: no answer within the connect timeout");
    }
    poll_status = PQconnectPoll(raw);
  }
  // Notices ("relation already exists, skipping") are not for idem's users' stderr.
  PQsetNoticeProcessor(
      raw, [](void*, const char*) {}, nullptr);
  if (PQsetnonblocking(raw, 1) != 0) {
    return UnavailableError("cannot connect to PostgreSQL: " + ConnectionError(raw));
  }
  // idem's statements are written for READ COMMITTED (a begin that meets a concurrent insert
  // of its key waits for it and reads it): a database or role that defaults to serializable
  // would fail them with serialization errors under contention instead.
  auto set = c->Exec("SET statement_timeout = " + std::to_string(statement_timeout.count()) +
                         "; SET default_transaction_isolation = 'read committed'",
                     deadline);
  if (!set) return set.error();
  return c;
}

Status Connection::Fail(std::string why) {
  if (!failed_) {
    failed_ = true;
    failure_ = std::move(why);
  }
  return UnavailableError(failure_);
}

Status Connection::Broken(std::string_view what) {
  return Fail("PostgreSQL connection lost while " + std::string(what) + ": " +
              ConnectionError(conn_));
}

Status Connection::Wait(bool write, Deadline deadline) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return UnavailableError("timed out");
    pollfd p{PQsocket(conn_), static_cast<short>(POLLIN | (write ? POLLOUT : 0)), 0};
    if (p.fd < 0) return UnavailableError("no socket");
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30)));
    if (n > 0) return OkStatus();
    if (n < 0 && errno != EINTR) return UnavailableError(std::strerror(errno));
  }
}

bool Connection::Healthy() {
  if (failed_ || conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) return false;
  // An idle connection has nothing to read (idem never LISTENs) unless the server is closing
  // it: a server that shuts down or restarts sends each backend's client "FATAL: terminating
  // connection" before the close, and reading that leaves libpq's status CONNECTION_OK, so a
  // pool that trusted it handed out every dead connection once after a restart, failing one
  // call each (a completion among them). Anything unasked for means: do not use it.
  pollfd p{PQsocket(conn_), POLLIN, 0};
  if (p.fd < 0) return false;
  if (::poll(&p, 1, 0) != 0) {
    (void)Fail("PostgreSQL sent something on an idle connection (it was closing it)");
    return false;
  }
  return true;
}

Status Connection::Flush(Deadline deadline) {
  for (;;) {
    const int r = PQflush(conn_);
    if (r == 0) return OkStatus();
    if (r < 0) return Broken("sending");
    if (!Wait(true, deadline).ok()) {
      return Fail("PostgreSQL did not take the request within the statement timeout");
    }
    // Read what the server sent meanwhile, or it may block writing to us while we write to it.
    if (PQconsumeInput(conn_) == 0) return Broken("sending");
  }
}

Result<ResultPtr> Connection::Next(Deadline deadline) {
  while (PQisBusy(conn_)) {
    if (PQconsumeInput(conn_) == 0) return Broken("reading");
    if (!PQisBusy(conn_)) break;
    if (!Wait(false, deadline).ok()) {
      return Fail("PostgreSQL did not answer within the statement timeout");
    }
  }
  ResultPtr r(PQgetResult(conn_));
  if (PQstatus(conn_) != CONNECTION_OK) return Broken("reading");
  return r;
}

Result<ResultPtr> Connection::NextStatement(Deadline deadline) {
  // A stray nullptr may follow the previous segment's sync; a statement's result is not null.
  Result<ResultPtr> r = Next(deadline);
  for (int strays = 0; r && *r == nullptr; ++strays) {
    if (strays == 2) return Fail("PostgreSQL pipeline out of step: a result is missing");
    r = Next(deadline);
  }
  if (!r) return r;
  Result<ResultPtr> end = Next(deadline);
  if (!end) return end.error();
  if (*end != nullptr) return Fail("PostgreSQL pipeline out of step: an extra result");
  return r;
}

Status Connection::ReadSync(Deadline deadline) {
  Status error = OkStatus();
  for (int nulls = 0;;) {
    Result<ResultPtr> r = Next(deadline);
    if (!r) return r.error();
    if (*r == nullptr) {
      if (++nulls > 2) return Fail("PostgreSQL pipeline out of step: no sync");
      continue;
    }
    const ExecStatusType st = PQresultStatus(r->get());
    if (st == PGRES_PIPELINE_SYNC) return error;
    // An error between the last statement and the sync: the implicit commit failed.
    if (st == PGRES_FATAL_ERROR && error.ok()) error = StatusOfResult(r->get(), "commit");
  }
}

Status Connection::EnterPipeline(std::span<const Statement> statements, Deadline deadline) {
  if (PQenterPipelineMode(conn_) != 1) return Broken("entering pipeline mode");
  pipelined_ = true;
  for (const Statement& s : statements) {
    if (PQsendPrepare(conn_, s.name, s.sql.c_str(), static_cast<int>(s.types.size()),
                      s.types.data()) != 1) {
      return Broken("preparing");
    }
  }
  IDEM_RETURN_IF_ERROR(Sync(deadline));
  Status first = OkStatus();
  for (const Statement& s : statements) {
    auto r = NextStatement(deadline);
    if (!r) return r.error();
    if (PQresultStatus(r->get()) != PGRES_COMMAND_OK && first.ok()) {
      first = StatusOfResult(r->get(), std::string("preparing ") + s.name);
    }
  }
  IDEM_RETURN_IF_ERROR(ReadSync(deadline));
  return first;
}

Status Connection::LeavePipeline() {
  if (PQexitPipelineMode(conn_) != 1) return Broken("leaving pipeline mode");
  pipelined_ = false;
  return OkStatus();
}

Status Connection::ReenterPipeline() {
  if (PQenterPipelineMode(conn_) != 1) return Broken("entering pipeline mode");
  pipelined_ = true;
  return OkStatus();
}

Status Connection::SendPrepared(const char* name, const Params& p) {
  if (PQsendQueryPrepared(conn_, name, p.size(), p.values(), p.lengths(), p.formats(), 1) != 1) {
    return Broken("sending");
  }
  return OkStatus();
}

Status Connection::SendQuery(std::string_view sql, const Params& p, Oid const* types) {
  const std::string text(sql);
  if (PQsendQueryParams(conn_, text.c_str(), p.size(), types, p.values(), p.lengths(), p.formats(),
                        1) != 1) {
    return Broken("sending");
  }
  return OkStatus();
}

Status Connection::SendText(std::string_view sql,
                            std::span<const std::optional<std::string_view>> params) {
  std::vector<std::string> owned;
  owned.reserve(params.size());
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const auto& p : params) {
    if (p) {
      owned.emplace_back(*p);
      values.push_back(owned.back().c_str());
    } else {
      values.push_back(nullptr);
    }
  }
  const std::string text(sql);
  if (PQsendQueryParams(conn_, text.c_str(), static_cast<int>(values.size()), nullptr,
                        values.data(), nullptr, nullptr, 0) != 1) {
    return Broken("sending");
  }
  return OkStatus();
}

Status Connection::Sync(Deadline deadline) {
  if (PQpipelineSync(conn_) != 1) return Broken("sending");
  return Flush(deadline);
}

Result<ResultPtr> Connection::Exec(std::string_view sql, Deadline deadline) {
  const std::string text(sql);
  if (PQsendQuery(conn_, text.c_str()) != 1) return Broken("sending");
  IDEM_RETURN_IF_ERROR(Flush(deadline));
  ResultPtr last;
  Status error = OkStatus();
  for (;;) {
    Result<ResultPtr> r = Next(deadline);
    if (!r) return r.error();
    if (*r == nullptr) break;
    const ExecStatusType st = PQresultStatus(r->get());
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && error.ok()) {
      error = StatusOfResult(r->get(), "statement failed");
    }
    last = std::move(*r);
  }
  if (!error.ok()) return error;
  return last;
}

Result<ResultPtr> Connection::ExecText(std::string_view sql,
                                       std::span<const std::optional<std::string_view>> params,
                                       Deadline deadline) {
  IDEM_RETURN_IF_ERROR(SendText(sql, params));
  IDEM_RETURN_IF_ERROR(Flush(deadline));
  ResultPtr first;
  for (;;) {
    Result<ResultPtr> r = Next(deadline);
    if (!r) return r.error();
    if (*r == nullptr) break;
    if (first == nullptr) first = std::move(*r);
  }
  if (first == nullptr) return Fail("PostgreSQL sent no result");
  return first;
}

// ---- fields ----

bool IsNull(const PGresult* r, int row, int col) { return PQgetisnull(r, row, col) != 0; }

std::int64_t GetInt8(const PGresult* r, int row, int col) {
  if (IsNull(r, row, col) || PQgetlength(r, row, col) != 8) return 0;
  std::uint64_t be;
  std::memcpy(&be, PQgetvalue(r, row, col), 8);
  return static_cast<std::int64_t>(__builtin_bswap64(be));
}

std::int16_t GetInt2(const PGresult* r, int row, int col) {
  if (IsNull(r, row, col) || PQgetlength(r, row, col) != 2) return 0;
  std::uint16_t be;
  std::memcpy(&be, PQgetvalue(r, row, col), 2);
  return static_cast<std::int16_t>(__builtin_bswap16(be));
}

bool GetBool(const PGresult* r, int row, int col) {
  return !IsNull(r, row, col) && PQgetlength(r, row, col) == 1 && PQgetvalue(r, row, col)[0] != 0;
}

std::string_view GetBytes(const PGresult* r, int row, int col) {
  if (IsNull(r, row, col)) return {};
  return std::string_view(PQgetvalue(r, row, col),
                          static_cast<std::size_t>(PQgetlength(r, row, col)));
}

std::uint64_t AffectedRows(const PGresult* r) {
  const char* n = PQcmdTuples(const_cast<PGresult*>(r));
  return n != nullptr && *n != '\0' ? std::strtoull(n, nullptr, 10) : 0;
}

}  // namespace idem::pg
