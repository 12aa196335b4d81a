#include "stores/postgres/schema.h"

#include <string>

#include "idem/stores/postgres.h"

namespace idem::pg {
namespace {

// Replaces every {S} with the quoted schema name.
std::string WithSchema(std::string_view sql, std::string_view schema) {
  const std::string quoted = QuotedSchema(schema);
  std::string out;
  out.reserve(sql.size() + 16 * quoted.size());
  for (std::size_t i = 0; i < sql.size();) {
    if (sql.compare(i, 3, "{S}") == 0) {
      out += quoted;
      i += 3;
    } else {
      out += sql[i++];
    }
  }
  return out;
}

// Times are milliseconds since the Unix epoch from the caller's clock ($now); the server's
// clock is never read. Tokens come from one sequence (CACHE 1, so every connection sees one
// order) and only grow, whatever was released, erased or reaped. Records are fillfactor 80 and
// indexed by their primary key alone, so a completion (which changes no key column) is a HOT
// update; the reaper walks the heap by block ranges instead of an index on expiry.
constexpr std::string_view kTables = R"sql(
CREATE SEQUENCE IF NOT EXISTS {S}.tokens AS bigint;

CREATE TABLE IF NOT EXISTS {S}.records (
  scope bytea NOT NULL,
  key bytea NOT NULL,
  state smallint NOT NULL,          -- 1 in progress, 2 completed
  fingerprint bytea,
  token bigint NOT NULL,
  attempt bigint NOT NULL,
  created bigint NOT NULL,
  lease_deadline bigint NOT NULL,
  expires bigint NOT NULL,          -- behaves as absent from here on; reclaimed later
  outcome smallint NOT NULL,        -- 0 success, 1 failure
  response bytea,
  PRIMARY KEY (scope, key)
) WITH (fillfactor = 80);

CREATE TABLE IF NOT EXISTS {S}.sessions (
  scope bytea NOT NULL,
  client_id bytea NOT NULL,
  low_water bigint NOT NULL,
  win bigint NOT NULL,
  ttl bigint NOT NULL,
  expires bigint NOT NULL,
  PRIMARY KEY (scope, client_id)
) WITH (fillfactor = 80);

-- A session's records above its low water; they go with the session.
CREATE TABLE IF NOT EXISTS {S}.seq_records (
  scope bytea NOT NULL,
  client_id bytea NOT NULL,
  seq bigint NOT NULL,
  state smallint NOT NULL,
  fingerprint bytea,
  token bigint NOT NULL,
  attempt bigint NOT NULL,
  created bigint NOT NULL,
  lease_deadline bigint NOT NULL,
  expires bigint NOT NULL,
  outcome smallint NOT NULL,
  response bytea,
  PRIMARY KEY (scope, client_id, seq)
) WITH (fillfactor = 80);

CREATE TABLE IF NOT EXISTS {S}.entities (
  scope bytea NOT NULL,
  entity bytea NOT NULL,
  applied bigint NOT NULL,
  in_progress bigint NOT NULL,      -- 0: none
  token bigint NOT NULL,
  attempt bigint NOT NULL,
  lease_deadline bigint NOT NULL,
  expires bigint NOT NULL,
  PRIMARY KEY (scope, entity)
) WITH (fillfactor = 80);
)sql";

// The decisions of src/core/machine.cc, in SQL. Each function is one statement for the client
// and atomic per (scope, key): acquisitions write only a row they found unchanged (the
// compare-and-set on token, state, lease and expiry) or one they inserted, and decide again
// otherwise. Answers that change nothing (busy, replay, conflict) take no lock.
constexpr std::string_view kFunctions = R"sql(
CREATE OR REPLACE FUNCTION {S}.begin_record(p_scope bytea, p_key bytea, p_fp bytea,
    p_now bigint, p_lease bigint, p_abandoned bigint,
    OUT o_kind smallint, OUT o_token bigint, OUT o_attempt bigint, OUT o_lease_deadline bigint,
    OUT o_outcome smallint, OUT o_response bytea)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
BEGIN
  o_lease_deadline := p_now + p_lease;
  LOOP
    INSERT INTO {S}.records AS x (scope, key, state, fingerprint, token, attempt, created,
        lease_deadline, expires, outcome)
      VALUES (p_scope, p_key, 1, p_fp, nextval('{S}.tokens'), 1, p_now, p_now + p_lease,
        p_now + p_lease + p_abandoned, 0)
      ON CONFLICT (scope, key) DO NOTHING
      RETURNING x.token INTO o_token;
    IF o_token IS NOT NULL THEN
      o_kind := 0; o_attempt := 1;
      RETURN;
    END IF;
    SELECT x.state, x.fingerprint, x.token, x.attempt, x.lease_deadline, x.expires, x.outcome,
        x.response INTO r
      FROM {S}.records x WHERE x.scope = p_scope AND x.key = p_key;
    IF FOUND THEN
      IF r.expires <= p_now THEN
        -- Past its expiry the record behaves as absent: a new record under the same key.
        UPDATE {S}.records x SET state = 1, fingerprint = p_fp, token = nextval('{S}.tokens'),
            attempt = 1, created = p_now, lease_deadline = p_now + p_lease,
            expires = p_now + p_lease + p_abandoned, outcome = 0, response = NULL
          WHERE x.scope = p_scope AND x.key = p_key AND x.token = r.token
            AND x.state = r.state AND x.expires = r.expires
          RETURNING x.token INTO o_token;
        IF o_token IS NOT NULL THEN
          o_kind := 0; o_attempt := 1;
          RETURN;
        END IF;
      ELSIF r.fingerprint IS NOT NULL AND p_fp IS NOT NULL AND r.fingerprint <> p_fp THEN
        o_kind := 3;
        RETURN;
      ELSIF r.state = 2 THEN
        o_kind := 2; o_outcome := r.outcome; o_response := r.response; o_attempt := r.attempt;
        RETURN;
      ELSIF p_now < r.lease_deadline THEN
        o_kind := 1; o_lease_deadline := r.lease_deadline;
        RETURN;
      ELSE
        -- Takeover: the holder's lease ran out. The fingerprint and creation time stay.
        UPDATE {S}.records x SET token = nextval('{S}.tokens'),
            attempt = least(r.attempt + 1, 4294967295), lease_deadline = p_now + p_lease,
            expires = p_now + p_lease + p_abandoned
          WHERE x.scope = p_scope AND x.key = p_key AND x.token = r.token AND x.state = 1
            AND x.lease_deadline = r.lease_deadline AND x.expires = r.expires
          RETURNING x.token, x.attempt INTO o_token, o_attempt;
        IF o_token IS NOT NULL THEN
          o_kind := 0;
          RETURN;
        END IF;
      END IF;
    END IF;
    -- The record changed or went between reading and writing it: decide again.
  END LOOP;
END $$;

-- Transactional mode: completes inside the handler's transaction, or fails it so that nothing
-- the handler wrote commits.
CREATE OR REPLACE FUNCTION {S}.complete_in_transaction(p_scope bytea, p_key bytea,
    p_token bigint, p_outcome smallint, p_response bytea, p_now bigint, p_retention bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE {S}.records x SET state = 2, outcome = p_outcome, response = p_response,
      expires = p_now + p_retention
    WHERE x.scope = p_scope AND x.key = p_key AND x.token = p_token AND x.state = 1
      AND x.expires > p_now;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'idem: the lease on the key was lost to a newer worker'
      USING ERRCODE = 'IDLOS';
  END IF;
END $$;

-- Sessions (SPEC §4). The session row is locked first, which serialises everything about its
-- records.
CREATE OR REPLACE FUNCTION {S}.open_session(p_scope bytea, p_client bytea, p_ttl bigint,
    p_win bigint, p_now bigint,
    OUT o_low_water bigint, OUT o_win bigint, OUT o_outstanding bigint, OUT o_expires bigint)
LANGUAGE plpgsql AS $$
DECLARE
  s record;
BEGIN
  o_win := p_win; o_expires := p_now + p_ttl;
  LOOP
    SELECT x.low_water, x.expires INTO s FROM {S}.sessions x
      WHERE x.scope = p_scope AND x.client_id = p_client FOR UPDATE;
    EXIT WHEN FOUND;
    INSERT INTO {S}.sessions (scope, client_id, low_water, win, ttl, expires)
      VALUES (p_scope, p_client, 0, p_win, p_ttl, p_now + p_ttl)
      ON CONFLICT (scope, client_id) DO NOTHING;
    IF FOUND THEN
      o_low_water := 0; o_outstanding := 0;
      RETURN;
    END IF;
  END LOOP;
  o_low_water := s.low_water;
  IF p_now >= s.expires THEN
    -- An expired session registered again starts afresh, as if the reaper had taken it.
    DELETE FROM {S}.seq_records x WHERE x.scope = p_scope AND x.client_id = p_client;
    o_low_water := 0;
  END IF;
  UPDATE {S}.sessions x SET low_water = o_low_water, win = p_win, ttl = p_ttl,
      expires = p_now + p_ttl
    WHERE x.scope = p_scope AND x.client_id = p_client;
  SELECT count(*) INTO o_outstanding FROM {S}.seq_records x
    WHERE x.scope = p_scope AND x.client_id = p_client;
END $$;

CREATE OR REPLACE FUNCTION {S}.begin_seq(p_scope bytea, p_client bytea, p_seq bigint,
    p_ack bigint, p_fp bytea, p_now bigint, p_lease bigint, p_abandoned bigint,
    OUT o_kind smallint, OUT o_token bigint, OUT o_attempt bigint, OUT o_lease_deadline bigint,
    OUT o_outcome smallint, OUT o_response bytea, OUT o_low_water bigint, OUT o_win bigint)
LANGUAGE plpgsql AS $$
DECLARE
  s record;
  r record;
  lw bigint;
BEGIN
  SELECT x.low_water, x.win, x.ttl, x.expires INTO s FROM {S}.sessions x
    WHERE x.scope = p_scope AND x.client_id = p_client FOR UPDATE;
  IF NOT FOUND OR p_now >= s.expires THEN
    o_kind := 5;
    RETURN;
  END IF;
  o_low_water := s.low_water; o_win := s.win;
  lw := greatest(s.low_water, p_ack);
  IF p_seq > lw AND p_seq - lw > s.win THEN
    o_kind := 6;  -- refused, and the acknowledgement with it
    RETURN;
  END IF;
  UPDATE {S}.sessions x SET low_water = lw, expires = p_now + s.ttl
    WHERE x.scope = p_scope AND x.client_id = p_client;
  IF lw > s.low_water THEN
    DELETE FROM {S}.seq_records x
      WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq <= lw;
  END IF;
  IF p_seq <= lw THEN
    o_kind := 4;
    RETURN;
  END IF;
  o_lease_deadline := p_now + p_lease;
  SELECT x.state, x.fingerprint, x.token, x.attempt, x.lease_deadline, x.expires, x.outcome,
      x.response INTO r
    FROM {S}.seq_records x
    WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq = p_seq;
  IF NOT FOUND THEN
    INSERT INTO {S}.seq_records AS x (scope, client_id, seq, state, fingerprint, token, attempt,
        created, lease_deadline, expires, outcome)
      VALUES (p_scope, p_client, p_seq, 1, p_fp, nextval('{S}.tokens'), 1, p_now,
        p_now + p_lease, p_now + p_lease + p_abandoned, 0)
      RETURNING x.token INTO o_token;
    o_kind := 0; o_attempt := 1;
  ELSIF r.expires <= p_now THEN
    UPDATE {S}.seq_records x SET state = 1, fingerprint = p_fp,
        token = nextval('{S}.tokens'), attempt = 1, created = p_now,
        lease_deadline = p_now + p_lease, expires = p_now + p_lease + p_abandoned, outcome = 0,
        response = NULL
      WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq = p_seq
      RETURNING x.token INTO o_token;
    o_kind := 0; o_attempt := 1;
  ELSIF r.fingerprint IS NOT NULL AND p_fp IS NOT NULL AND r.fingerprint <> p_fp THEN
    o_kind := 3;
  ELSIF r.state = 2 THEN
    o_kind := 2; o_outcome := r.outcome; o_response := r.response; o_attempt := r.attempt;
  ELSIF p_now < r.lease_deadline THEN
    o_kind := 1; o_lease_deadline := r.lease_deadline;
  ELSE
    UPDATE {S}.seq_records x SET token = nextval('{S}.tokens'),
        attempt = least(r.attempt + 1, 4294967295), lease_deadline = p_now + p_lease,
        expires = p_now + p_lease + p_abandoned
      WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq = p_seq
      RETURNING x.token, x.attempt INTO o_token, o_attempt;
    o_kind := 0;
  END IF;
END $$;

-- 0 applied, 1 lease lost, 5 unknown session. A completed number is kept until acknowledged
-- or until its session expires (p_keep is longer than any session).
CREATE OR REPLACE FUNCTION {S}.complete_seq(p_scope bytea, p_client bytea, p_seq bigint,
    p_token bigint, p_outcome smallint, p_response bytea, p_now bigint, p_keep bigint)
RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
  s record;
BEGIN
  SELECT x.ttl, x.expires INTO s FROM {S}.sessions x
    WHERE x.scope = p_scope AND x.client_id = p_client FOR UPDATE;
  IF NOT FOUND OR p_now >= s.expires THEN
    RETURN 5;
  END IF;
  UPDATE {S}.seq_records x SET state = 2, outcome = p_outcome, response = p_response,
      expires = p_now + p_keep
    WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq = p_seq AND x.token = p_token
      AND x.state = 1 AND x.expires > p_now;
  IF NOT FOUND THEN
    RETURN 1;
  END IF;
  UPDATE {S}.sessions x SET expires = p_now + s.ttl
    WHERE x.scope = p_scope AND x.client_id = p_client;
  RETURN 0;
END $$;

CREATE OR REPLACE FUNCTION {S}.release_seq(p_scope bytea, p_client bytea, p_seq bigint,
    p_token bigint, p_now bigint)
RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
  s record;
BEGIN
  SELECT x.ttl, x.expires INTO s FROM {S}.sessions x
    WHERE x.scope = p_scope AND x.client_id = p_client FOR UPDATE;
  IF NOT FOUND OR p_now >= s.expires THEN
    RETURN 5;
  END IF;
  DELETE FROM {S}.seq_records x
    WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq = p_seq AND x.token = p_token
      AND x.state = 1 AND x.expires > p_now;
  IF NOT FOUND THEN
    RETURN 1;
  END IF;
  UPDATE {S}.sessions x SET expires = p_now + s.ttl
    WHERE x.scope = p_scope AND x.client_id = p_client;
  RETURN 0;
END $$;

CREATE OR REPLACE FUNCTION {S}.ack_session(p_scope bytea, p_client bytea, p_ack bigint,
    p_now bigint,
    OUT o_kind smallint, OUT o_low_water bigint, OUT o_win bigint, OUT o_outstanding bigint,
    OUT o_expires bigint)
LANGUAGE plpgsql AS $$
DECLARE
  s record;
BEGIN
  SELECT x.low_water, x.win, x.ttl, x.expires INTO s FROM {S}.sessions x
    WHERE x.scope = p_scope AND x.client_id = p_client FOR UPDATE;
  IF NOT FOUND OR p_now >= s.expires THEN
    o_kind := 5;
    RETURN;
  END IF;
  o_kind := 0; o_win := s.win; o_expires := p_now + s.ttl;
  o_low_water := greatest(s.low_water, p_ack);
  IF o_low_water > s.low_water THEN
    DELETE FROM {S}.seq_records x
      WHERE x.scope = p_scope AND x.client_id = p_client AND x.seq <= o_low_water;
  END IF;
  UPDATE {S}.sessions x SET low_water = o_low_water, expires = o_expires
    WHERE x.scope = p_scope AND x.client_id = p_client;
  SELECT count(*) INTO o_outstanding FROM {S}.seq_records x
    WHERE x.scope = p_scope AND x.client_id = p_client;
END $$;

-- Versioned entities (SPEC §5).
CREATE OR REPLACE FUNCTION {S}.begin_version(p_scope bytea, p_entity bytea, p_version bigint,
    p_now bigint, p_lease bigint, p_abandoned bigint,
    OUT o_kind smallint, OUT o_token bigint, OUT o_attempt bigint, OUT o_lease_deadline bigint)
LANGUAGE plpgsql AS $$
DECLARE
  e record;
  v_applied bigint := 0;
  v_in_progress bigint := 0;
  v_attempt bigint := 0;
  v_lease_deadline bigint := 0;
  v_expires bigint := 0;
BEGIN
  LOOP
    SELECT x.applied, x.in_progress, x.attempt, x.lease_deadline, x.expires INTO e
      FROM {S}.entities x WHERE x.scope = p_scope AND x.entity = p_entity FOR UPDATE;
    EXIT WHEN FOUND;
    INSERT INTO {S}.entities AS x (scope, entity, applied, in_progress, token, attempt,
        lease_deadline, expires)
      VALUES (p_scope, p_entity, 0, p_version, nextval('{S}.tokens'), 1, p_now + p_lease,
        p_now + p_lease + p_abandoned)
      ON CONFLICT (scope, entity) DO NOTHING
      RETURNING x.token INTO o_token;
    IF o_token IS NOT NULL THEN
      o_kind := 0; o_attempt := 1; o_lease_deadline := p_now + p_lease;
      RETURN;
    END IF;
  END LOOP;
  IF p_now < e.expires THEN  -- live; otherwise as if absent
    v_applied := e.applied; v_in_progress := e.in_progress; v_attempt := e.attempt;
    v_lease_deadline := e.lease_deadline; v_expires := e.expires;
  END IF;
  IF p_version <= v_applied THEN
    o_kind := 4;
    RETURN;
  END IF;
  IF v_in_progress <> 0 AND p_now < v_lease_deadline THEN
    o_kind := 1; o_lease_deadline := v_lease_deadline;
    RETURN;
  END IF;
  o_attempt := CASE WHEN v_in_progress <> 0 AND v_in_progress = p_version
                    THEN least(v_attempt + 1, 4294967295) ELSE 1 END;
  o_lease_deadline := p_now + p_lease;
  UPDATE {S}.entities x SET applied = v_applied, in_progress = p_version,
      token = nextval('{S}.tokens'), attempt = o_attempt, lease_deadline = o_lease_deadline,
      expires = greatest(v_expires, o_lease_deadline + p_abandoned)
    WHERE x.scope = p_scope AND x.entity = p_entity
    RETURNING x.token INTO o_token;
  -- A live run still in progress here is one whose lease ran out: taken over (7), else 0.
  o_kind := CASE WHEN v_in_progress <> 0 THEN 7 ELSE 0 END;
END $$;
)sql";

}  // namespace

Status CheckSchemaName(std::string_view schema) {
  const auto bad = [&](std::string_view why) {
    return InvalidArgumentError("schema name \"" + std::string(schema) + "\" " + std::string(why));
  };
  if (schema.empty()) return bad("is empty");
  if (schema.size() > 63) return bad("is longer than 63 bytes");
  for (std::size_t i = 0; i < schema.size(); ++i) {
    const char c = schema[i];
    const bool ok = (c >= 'a' && c <= 'z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return bad("must be lower-case letters, digits and '_', not starting with a digit");
  }
  return OkStatus();
}

std::string QuotedSchema(std::string_view schema) { return "\"" + std::string(schema) + "\""; }

std::string SchemaPrologue(std::string_view schema) {
  // Concurrent inits of one schema take turns (CREATE ... IF NOT EXISTS alone can race).
  return "SELECT pg_advisory_xact_lock(hashtext('idem schema " + std::string(schema) + "'));\n" +
         WithSchema(R"sql(
CREATE SCHEMA IF NOT EXISTS {S};
CREATE TABLE IF NOT EXISTS {S}.meta (name text PRIMARY KEY, value text NOT NULL);
SELECT value FROM {S}.meta WHERE name = 'schema_version';
)sql",
                    schema);
}

std::string SchemaBody(std::string_view schema) {
  return WithSchema(kTables, schema) + WithSchema(kFunctions, schema) +
         WithSchema("INSERT INTO {S}.meta (name, value) VALUES ('schema_version', '" +
                        std::to_string(kPostgresSchemaVersion) +
                        "') ON CONFLICT (name) DO NOTHING;\n",
                    schema);
}

std::string ForeignTablesQuery(std::string_view schema) {
  // (The schema name is checked: lower-case letters, digits and '_'.)
  return "SELECT string_agg(table_name::text, ', ' ORDER BY table_name) FROM "
         "information_schema.tables WHERE table_schema = '" +
         std::string(schema) +
         "' AND table_name IN ('records', 'sessions', 'seq_records', 'entities')";
}

std::string VersionQuery(std::string_view schema) {
  return WithSchema("SELECT value FROM {S}.meta WHERE name = 'schema_version'", schema);
}

std::vector<Statement> Statements(std::string_view schema) {
  const auto s = [&](const char* name, std::string_view sql, std::vector<Oid> types) {
    return Statement{name, WithSchema(sql, schema), std::move(types)};
  };
  const std::string cols = kRecordColumns;
  return {
      // A new key (the common case) is one plain INSERT; only when the key is there does
      // begin_record run, which costs a PL/pgSQL call (about half as much again).
      s(kBegin, R"sql(
WITH ins AS (
  INSERT INTO {S}.records AS x (scope, key, state, fingerprint, token, attempt, created,
      lease_deadline, expires, outcome)
  VALUES ($1, $2, 1, $3, nextval('{S}.tokens'), 1, $4, $4 + $5, $4 + $5 + $6, 0)
  ON CONFLICT (scope, key) DO NOTHING
  RETURNING x.token)
SELECT 0::smallint, ins.token, 1::bigint, $4 + $5, NULL::smallint, NULL::bytea FROM ins
UNION ALL
SELECT b.* FROM {S}.begin_record($1, $2, $3, $4, $5, $6) b WHERE NOT EXISTS (SELECT 1 FROM ins)
)sql",
        {kBytea, kBytea, kBytea, kInt8, kInt8, kInt8}),
      s(kComplete,
        "UPDATE {S}.records SET state = 2, outcome = $4, response = $5, expires = $6 + $7 "
        "WHERE scope = $1 AND key = $2 AND token = $3 AND state = 1 AND expires > $6",
        {kBytea, kBytea, kInt8, kInt2, kBytea, kInt8, kInt8}),
      // A batch's begins in one statement: $1..$4 are arrays (scope, key, fingerprint or NULL,
      // lease) of distinct keys. New keys are inserted in key order, each drawing its token just
      // before its insert (the ordered subquery is not flattened); then begin_record decides
      // each key that was there, in key order. One row per request: its ordinal, then the
      // columns of begin_record.
      s(kBeginMany, R"sql(
WITH r AS (
  SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[], $4::bigint[]) WITH ORDINALITY
    AS r(scope, key, fp, lease, i)),
ins AS (
  INSERT INTO {S}.records AS x (scope, key, state, fingerprint, token, attempt, created,
      lease_deadline, expires, outcome)
  SELECT o.scope, o.key, 1, o.fp, nextval('{S}.tokens'), 1, $5, $5 + o.lease,
      $5 + o.lease + $6, 0
    FROM (SELECT * FROM r ORDER BY r.scope, r.key) o
  ON CONFLICT (scope, key) DO NOTHING
  RETURNING x.scope, x.key, x.token, x.lease_deadline),
got AS MATERIALIZED (
  SELECT r.i, 0::smallint, ins.token, 1::bigint, ins.lease_deadline, NULL::smallint,
      NULL::bytea
    FROM ins JOIN r ON r.scope = ins.scope AND r.key = ins.key)
SELECT * FROM got
UNION ALL
SELECT o.i, b.*
  FROM (SELECT * FROM r WHERE r.i NOT IN (SELECT g.i FROM got g) ORDER BY r.scope, r.key) o,
    LATERAL {S}.begin_record(o.scope, o.key, o.fp, $5, o.lease, $6) b
)sql",
        {kByteaArray, kByteaArray, kByteaArray, kInt8Array, kInt8, kInt8}),
      // A batch's completions in one statement: $1..$6 are arrays (scope, key, token, outcome,
      // response, retention) of distinct keys. The rows it will change are locked first, in key
      // order (LockRows runs above the sort), so the UPDATE then waits for nobody whatever join
      // order the planner picks. Answers the ordinals applied; the others lost their lease.
      s(kCompleteMany, R"sql(
WITH u AS (
  SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bigint[], $4::smallint[], $5::bytea[],
      $6::bigint[]) WITH ORDINALITY AS u(scope, key, token, outcome, response, retention, i)),
held AS MATERIALIZED (
  SELECT u.* FROM {S}.records x JOIN u ON x.scope = u.scope AND x.key = u.key
  WHERE x.token = u.token AND x.state = 1 AND x.expires > $7
  ORDER BY x.scope, x.key FOR UPDATE OF x)
UPDATE {S}.records x SET state = 2, outcome = h.outcome, response = h.response,
    expires = $7 + h.retention
  FROM held h
  WHERE x.scope = h.scope AND x.key = h.key AND x.token = h.token AND x.state = 1
    AND x.expires > $7
  RETURNING h.i
)sql",
        {kByteaArray, kByteaArray, kInt8Array, kInt2Array, kByteaArray, kInt8Array, kInt8}),
      s(kCompleteInTransaction, "SELECT {S}.complete_in_transaction($1, $2, $3, $4, $5, $6, $7)",
        {kBytea, kBytea, kInt8, kInt2, kBytea, kInt8, kInt8}),
      s(kRelease,
        "DELETE FROM {S}.records "
        "WHERE scope = $1 AND key = $2 AND token = $3 AND state = 1 AND expires > $4",
        {kBytea, kBytea, kInt8, kInt8}),
      s(kExtend,
        "UPDATE {S}.records SET lease_deadline = $4 + $5, expires = $4 + $5 + $6 "
        "WHERE scope = $1 AND key = $2 AND token = $3 AND state = 1 AND expires > $4",
        {kBytea, kBytea, kInt8, kInt8, kInt8, kInt8}),
      s(kGet, "SELECT " + cols + " FROM {S}.records WHERE scope = $1 AND key = $2 AND expires > $3",
        {kBytea, kBytea, kInt8}),
      s(kErase, "DELETE FROM {S}.records WHERE scope = $1 AND key = $2 RETURNING expires > $3",
        {kBytea, kBytea, kInt8}),
      s(kStats, R"sql(
SELECT
  (SELECT count(*) FROM {S}.records WHERE state = 1 AND expires > $1)
    + (SELECT count(*) FROM {S}.seq_records r JOIN {S}.sessions s USING (scope, client_id)
       WHERE r.state = 1 AND s.expires > $1),
  (SELECT count(*) FROM {S}.records WHERE state = 2 AND expires > $1)
    + (SELECT count(*) FROM {S}.seq_records r JOIN {S}.sessions s USING (scope, client_id)
       WHERE r.state = 2 AND s.expires > $1),
  (SELECT count(*) FROM {S}.sessions WHERE expires > $1),
  (SELECT count(*) FROM {S}.entities WHERE expires > $1),
  pg_total_relation_size('{S}.records') + pg_total_relation_size('{S}.sessions')
    + pg_total_relation_size('{S}.seq_records') + pg_total_relation_size('{S}.entities')
)sql",
        {kInt8}),
      s(kTableBlocks, R"sql(
SELECT pg_relation_size('{S}.records') / b, pg_relation_size('{S}.sessions') / b,
       pg_relation_size('{S}.entities') / b
FROM (SELECT current_setting('block_size')::bigint AS b) AS block
)sql",
        {}),
      // One reaper step: at most $4 expired rows among the blocks [$1, $2), each locked without
      // waiting (rows someone holds are left for a later step).
      s(kReapRecords, R"sql(
DELETE FROM {S}.records WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM {S}.records WHERE ctid >= $1 AND ctid < $2 AND expires <= $3
  LIMIT $4 FOR UPDATE SKIP LOCKED)) AND expires <= $3
)sql",
        {kTid, kTid, kInt8, kInt8}),
      s(kReapEntities, R"sql(
DELETE FROM {S}.entities WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM {S}.entities WHERE ctid >= $1 AND ctid < $2 AND expires <= $3
  LIMIT $4 FOR UPDATE SKIP LOCKED)) AND expires <= $3
)sql",
        {kTid, kTid, kInt8, kInt8}),
      s(kReapSessions, R"sql(
WITH doomed AS (
  SELECT scope, client_id FROM {S}.sessions
  WHERE ctid >= $1 AND ctid < $2 AND expires <= $3
  LIMIT $4 FOR UPDATE SKIP LOCKED),
gone_records AS (
  DELETE FROM {S}.seq_records r USING doomed d
  WHERE r.scope = d.scope AND r.client_id = d.client_id RETURNING 1),
gone AS (
  DELETE FROM {S}.sessions s USING doomed d
  WHERE s.scope = d.scope AND s.client_id = d.client_id RETURNING 1)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM gone_records)
)sql",
        {kTid, kTid, kInt8, kInt8}),
      s(kOpenSession, "SELECT * FROM {S}.open_session($1, $2, $3, $4, $5)",
        {kBytea, kBytea, kInt8, kInt8, kInt8}),
      s(kBeginSeq, "SELECT * FROM {S}.begin_seq($1, $2, $3, $4, $5, $6, $7, $8)",
        {kBytea, kBytea, kInt8, kInt8, kBytea, kInt8, kInt8, kInt8}),
      s(kCompleteSeq, "SELECT {S}.complete_seq($1, $2, $3, $4, $5, $6, $7, $8)",
        {kBytea, kBytea, kInt8, kInt8, kInt2, kBytea, kInt8, kInt8}),
      s(kReleaseSeq, "SELECT {S}.release_seq($1, $2, $3, $4, $5)",
        {kBytea, kBytea, kInt8, kInt8, kInt8}),
      s(kAck, "SELECT * FROM {S}.ack_session($1, $2, $3, $4)", {kBytea, kBytea, kInt8, kInt8}),
      s(kBeginVer, "SELECT * FROM {S}.begin_version($1, $2, $3, $4, $5, $6)",
        {kBytea, kBytea, kInt8, kInt8, kInt8, kInt8}),
      s(kCompleteVer,
        "UPDATE {S}.entities SET applied = in_progress, in_progress = 0, expires = $4 + $5 "
        "WHERE scope = $1 AND entity = $2 AND token = $3 AND in_progress <> 0 AND expires > $4",
        {kBytea, kBytea, kInt8, kInt8, kInt8}),
      s(kReleaseVer,
        "UPDATE {S}.entities SET in_progress = 0 "
        "WHERE scope = $1 AND entity = $2 AND token = $3 AND in_progress <> 0 AND expires > $4",
        {kBytea, kBytea, kInt8, kInt8}),
      s(kGetVer,
        "SELECT applied, in_progress, token, attempt, lease_deadline, expires FROM {S}.entities "
        "WHERE scope = $1 AND entity = $2 AND expires > $3",
        {kBytea, kBytea, kInt8}),
  };
}

}  // namespace idem::pg
