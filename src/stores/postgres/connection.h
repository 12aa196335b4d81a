// One libpq connection driven without blocking: connecting, pipelines and reading results under
// a deadline, so that a server that stops answering costs a caller at most its timeout.
// Not thread-safe: one thread uses a connection at a time.
#ifndef IDEM_STORES_POSTGRES_CONNECTION_H_
#define IDEM_STORES_POSTGRES_CONNECTION_H_

#include <libpq-fe.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

namespace idem::pg {

using Deadline = std::chrono::steady_clock::time_point;

inline Deadline DeadlineIn(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

// Type OIDs of the parameters idem binds (pg_type.h).
inline constexpr Oid kBytea = 17;
inline constexpr Oid kInt8 = 20;
inline constexpr Oid kInt2 = 21;
inline constexpr Oid kTid = 27;
inline constexpr Oid kInt2Array = 1005;
inline constexpr Oid kInt8Array = 1016;
inline constexpr Oid kByteaArray = 1001;

// A statement prepared on every connection.
struct Statement {
  const char* name;
  std::string sql;
  std::vector<Oid> types;
};

// The parameters of one statement, in binary format except Text. Byte values are views: what
// they point to must outlive the statement's execution. Not copyable or movable, because the
// value pointers point into the object itself.
class Params {
 public:
  static constexpr int kMax = 10;

  Params() = default;
  Params(const Params&) = delete;
  Params& operator=(const Params&) = delete;

  void Bytes(std::string_view b);
  void OptionalBytes(const std::uint8_t* b, std::size_t n);  // null b: NULL
  void Int8(std::int64_t v);
  void Int2(std::int16_t v);
  // A value in text format (at most 31 bytes), copied.
  void Text(std::string_view s);

  int size() const { return n_; }
  const char* const* values() const { return values_; }
  const int* lengths() const { return lengths_; }
  const int* formats() const { return formats_; }

 private:
  char* Slot();
  int n_ = 0;
  const char* values_[kMax] = {};
  int lengths_[kMax] = {};
  int formats_[kMax] = {};
  char inline_[kMax][32] = {};
};

// A one-dimensional array parameter in PostgreSQL's binary format, built element by element:
// a set-based statement takes a whole batch's column in one. Bind it with Params::Bytes(view()),
// which keeps a view: the ArrayParam must outlive the statement's execution.
class ArrayParam {
 public:
  // `element`: the element type's OID (kBytea, kInt8, kInt2).
  explicit ArrayParam(Oid element);
  void Bytes(std::string_view b);
  void Null();
  void Int8(std::int64_t v);
  void Int2(std::int16_t v);
  std::string_view view() const { return buf_; }

 private:
  void Element(const void* data, std::uint32_t n);
  std::string buf_;  // the header (its count and null flag kept current), then the elements
  std::uint32_t count_ = 0;
};

// "WHAT: the server's first line (SQLSTATE xxxxx)".
std::string ResultErrorText(const PGresult* r, std::string_view what);

// kUnavailable for the connection, timeouts, shutdowns and lock or resource limits (retry),
// kFailedPrecondition when idem's schema objects are missing, kInternal otherwise.
Status StatusOfResult(const PGresult* r, std::string_view what);
// The SQLSTATE of an error result, "" if none.
std::string_view SqlState(const PGresult* r);

class Connection {
 public:
  // Connects within the deadline and sets statement_timeout for the session.
  static Result<std::unique_ptr<Connection>> Open(const std::string& conninfo, Deadline deadline,
                                                  std::chrono::milliseconds statement_timeout);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  PGconn* get() const { return conn_; }

  // Switches to pipeline mode and prepares `statements`, in one round trip.
  Status EnterPipeline(std::span<const Statement> statements, Deadline deadline);
  // Leaves pipeline mode (nothing may be pending) and enters it again: a transactional handler
  // runs outside it, so that its own blocking libpq calls work.
  Status LeavePipeline();
  Status ReenterPipeline();

  // False once the connection failed, or when the server closed it while it was idle (checked
  // without blocking). A broken connection is only good for destruction.
  bool Healthy();

  // ---- pipeline mode ----
  Status SendPrepared(const char* name, const Params& params);
  Status SendQuery(std::string_view sql, const Params& params, Oid const* types = nullptr);
  // Text parameters and text results: the transactional handler's statements.
  Status SendText(std::string_view sql, std::span<const std::optional<std::string_view>> params);
  // Ends the segment (one implicit transaction unless inside BEGIN) and sends everything.
  Status Sync(Deadline deadline);
  // The next result, nullptr at the end of one statement's results. kUnavailable (and the
  // connection broken) if nothing arrives before the deadline.
  Result<ResultPtr> Next(Deadline deadline);
  // The one result of the next statement (reads through its terminating nullptr).
  Result<ResultPtr> NextStatement(Deadline deadline);
  // Reads up to and including the PGRES_PIPELINE_SYNC that closes a segment.
  Status ReadSync(Deadline deadline);

  // ---- outside pipeline mode: setup, schema init, transactional handlers ----
  // Runs `sql` (several statements allowed) and returns the last statement's result; the first
  // error ends it.
  Result<ResultPtr> Exec(std::string_view sql, Deadline deadline);
  // One statement with text parameters; its result (perhaps an error result), or kUnavailable
  // for the connection.
  Result<ResultPtr> ExecText(std::string_view sql,
                             std::span<const std::optional<std::string_view>> params,
                             Deadline deadline);

  // Marks the connection failed; `why` becomes the message of later errors.
  Status Fail(std::string why);

 private:
  explicit Connection(PGconn* conn) : conn_(conn) {}
  Status Flush(Deadline deadline);
  // Waits until the socket is readable (and, when `write`, writable) or the deadline passes.
  Status Wait(bool write, Deadline deadline);
  Status Broken(std::string_view what);

  PGconn* conn_ = nullptr;
  bool pipelined_ = false;
  bool failed_ = false;
  std::string failure_;
};

// Big-endian binary result fields.
std::int64_t GetInt8(const PGresult* r, int row, int col);
std::int16_t GetInt2(const PGresult* r, int row, int col);
bool GetBool(const PGresult* r, int row, int col);
std::string_view GetBytes(const PGresult* r, int row, int col);  // NULL: empty
bool IsNull(const PGresult* r, int row, int col);
// Rows changed by INSERT/UPDATE/DELETE.
std::uint64_t AffectedRows(const PGresult* r);

// Keeps only what libpq says about a failed connection: its first line.
std::string ConnectionError(PGconn* conn);

}  // namespace idem::pg

#endif  // IDEM_STORES_POSTGRES_CONNECTION_H_
