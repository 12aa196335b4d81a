// The SQL of the PostgreSQL store: its schema (tables, sequence, functions) and the statements
// every connection prepares. Answers of the functions are small codes (BeginKind below).
#ifndef IDEM_STORES_POSTGRES_SCHEMA_H_
#define IDEM_STORES_POSTGRES_SCHEMA_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"
#include "stores/postgres/connection.h"

namespace idem::pg {

// o_kind of the begin functions.
enum BeginKind : std::int16_t {
  kKindAcquired = 0,
  kKindBusy = 1,
  kKindReplay = 2,
  kKindConflict = 3,
  kKindStale = 4,
  kKindUnknownSession = 5,
  kKindWindowFull = 6,
  // begin_version only: acquired, taking over a run (of this or another version) whose lease ran
  // out. (A record's takeover is kKindAcquired with attempt > 1.)
  kKindTakeover = 7,
};
// Answers of complete_seq / release_seq.
enum WriteKind : std::int16_t { kWriteApplied = 0, kWriteLeaseLost = 1, kWriteUnknownSession = 5 };

// The SQLSTATE complete_in_transaction raises when the token is no longer the record's.
inline constexpr std::string_view kLeaseLostState = "IDLOS";

// kInvalidArgument unless `schema` is [a-z_][a-z0-9_]*, 1 to 63 bytes.
Status CheckSchemaName(std::string_view schema);

// `"schema"`: the name as an SQL identifier.
std::string QuotedSchema(std::string_view schema);

// The statements that create or refresh the schema at kPostgresSchemaVersion, to run in one
// transaction after SchemaPrologue (which also reads the version row).
std::string SchemaPrologue(std::string_view schema);
std::string SchemaBody(std::string_view schema);
// Reads the version row: one row, one text column, or no rows; 42P01/3F000 when missing.
std::string VersionQuery(std::string_view schema);
// The names of idem's tables that already exist in `schema` (one text, NULL when none).
std::string ForeignTablesQuery(std::string_view schema);

// What every connection prepares. Names are fixed; the SQL names the schema.
std::vector<Statement> Statements(std::string_view schema);

// Prepared statement names.
inline constexpr const char* kBegin = "idem_begin";
inline constexpr const char* kComplete = "idem_complete";
inline constexpr const char* kBeginMany = "idem_begin_many";
inline constexpr const char* kCompleteMany = "idem_complete_many";
// Batches of at least this many distinct keys begin and complete with one set-based statement
// (kBeginMany, kCompleteMany). Its call runs in a transaction of its own, since its rows cannot
// be sorted among other statements'; smaller batches go as one statement per key, grouped with
// other callers' statements, whose commits they then share. Measured with 32 callers
// (bench/postgres/run.sh, BATCH=n), keys/s set-based against one statement per key: 8 keys
// 16.9-17.7 k against 25.3-26.2 k, 32 keys 33.3 k against 33.4 k, 64 keys 41.7 k against
// 33.3 k, 100 keys 44.7-46.8 k against 32.8-35.0 k. Tests that mean to take the set-based path
// check their size against it.
inline constexpr std::size_t kSetBatchMin = 32;
inline constexpr const char* kCompleteInTransaction = "idem_complete_tx";
inline constexpr const char* kRelease = "idem_release";
inline constexpr const char* kExtend = "idem_extend";
inline constexpr const char* kGet = "idem_get";
inline constexpr const char* kErase = "idem_erase";
inline constexpr const char* kStats = "idem_stats";
inline constexpr const char* kTableBlocks = "idem_table_blocks";
inline constexpr const char* kReapRecords = "idem_reap_records";
inline constexpr const char* kReapSessions = "idem_reap_sessions";
inline constexpr const char* kReapEntities = "idem_reap_entities";
inline constexpr const char* kOpenSession = "idem_open_session";
inline constexpr const char* kBeginSeq = "idem_begin_seq";
inline constexpr const char* kCompleteSeq = "idem_complete_seq";
inline constexpr const char* kReleaseSeq = "idem_release_seq";
inline constexpr const char* kAck = "idem_ack";
inline constexpr const char* kBeginVer = "idem_begin_ver";
inline constexpr const char* kCompleteVer = "idem_complete_ver";
inline constexpr const char* kReleaseVer = "idem_release_ver";
inline constexpr const char* kGetVer = "idem_get_ver";

// The record columns, in the order Get and List select them.
inline constexpr const char* kRecordColumns =
    "scope, key, state, fingerprint, token, attempt, created, lease_deadline, expires, outcome, "
    "response";

}  // namespace idem::pg

#endif  // IDEM_STORES_POSTGRES_SCHEMA_H_
