// Fuzz target for what the Redis store reads back from Redis: record, entity and session values
// and key names (anything may have written them: another program, an operator's SET, a damaged
// RDB). Byte 0 picks the decoder; for records, bytes 1-8 are the key's PEXPIRETIME. Checks that
// a rejection is kDataLoss with a message, and that an accepted value is exactly what the
// encoding documented in stores/redis/scripts.h (written again here, independently of the Lua
// scripts) makes of the decoded fields: the decoders neither invent nor drop a byte.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz_checks.h"
#include "stores/redis/codec.h"
#include "stores/redis/scripts.h"

namespace {

constexpr const char* kTarget = "redis_codec_fuzz";

[[noreturn]] void Violation(const char* what, std::string_view detail) {
  idem::fuzz::Violation(kTarget, what, detail);
}

namespace redis = idem::redis;

void CheckRejection(const idem::Status& s) {
  idem::fuzz::CheckRejection(kTarget, s, idem::StatusCode::kDataLoss);
}

// Little-endian fixed-width fields, as Redis's struct.pack writes them.
void Put(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
std::int64_t Ms(idem::Timestamp t) { return t.time_since_epoch().count(); }
void PutTime(std::string& out, idem::Timestamp t) {
  Put(out, static_cast<std::uint64_t>(Ms(t)), 6);
}

void CheckRecord(std::string_view value, std::int64_t key_expiry_ms) {
  idem::Result<redis::StoredRecord> r = redis::DecodeRecord(value, key_expiry_ms);
  if (!r.has_value()) {
    CheckRejection(r.error());
    return;
  }
  const idem::core::RecordHead& h = r->head;
  if (static_cast<std::uint8_t>(value[0]) < 0x80) {
    // The compact form: a completed record whose number gives back its fields.
    if (h.state != idem::RecordState::kCompleted || r->fingerprint || !r->response.empty()) {
      Violation("a compact record with more than a completed head", value);
    }
    if (h.attempt < 1 || h.attempt > 8) Violation("a compact record's attempt out of 1-8", value);
    if (Ms(h.expires) != key_expiry_ms - redis::kGraceMs) {
      Violation("a compact record's expiry is not the key's", value);
    }
    const std::int64_t ttl = Ms(h.expires) - Ms(h.created);
    const std::int64_t dt = static_cast<std::int64_t>(h.token) - Ms(h.created) * 1000;
    const std::uint64_t zigzag =
        (static_cast<std::uint64_t>(dt) << 1) ^ static_cast<std::uint64_t>(dt >> 63);
    const std::uint64_t top = (h.outcome == idem::Outcome::kFailure ? 8u : 0u) + (h.attempt - 1);
    const std::uint64_t n = ((top << 21 | zigzag) << 28) | static_cast<std::uint64_t>(ttl);
    std::uint64_t written = 0;
    for (char c : value) written = written * 10 + static_cast<std::uint64_t>(c - '0');
    if (ttl < 0 || ttl >= (1 << 28) || zigzag >= (1u << 21) || n != written) {
      Violation("a compact record that does not encode back to its number", value);
    }
    return;
  }
  std::string again;
  const bool in_progress = h.state == idem::RecordState::kInProgress;
  const unsigned kind = in_progress ? 0u : (h.outcome == idem::Outcome::kFailure ? 2u : 1u);
  again.push_back(static_cast<char>(0x80u | kind | (r->fingerprint ? 4u : 0u)));
  Put(again, h.token, 7);
  Put(again, h.attempt, 4);
  PutTime(again, h.created);
  PutTime(again, h.expires);
  if (in_progress) PutTime(again, h.lease_deadline);
  if (r->fingerprint) {
    again.append(reinterpret_cast<const char*>(r->fingerprint->bytes.data()),
                 r->fingerprint->bytes.size());
  }
  if (in_progress && !r->response.empty())
    Violation("an in-progress record with a response", value);
  again += r->response;
  if (again != value) Violation("a record that does not encode back to its bytes", value);
}

void CheckEntity(std::string_view value) {
  idem::Result<idem::core::EntityHead> e = redis::DecodeEntity(value);
  if (!e.has_value()) {
    CheckRejection(e.error());
    return;
  }
  std::string again(1, static_cast<char>(0x80));
  Put(again, e->applied, 7);
  Put(again, e->in_progress, 7);
  Put(again, e->token, 7);
  Put(again, e->attempt, 4);
  PutTime(again, e->lease_deadline);
  PutTime(again, e->expires);
  if (again != value) Violation("an entity that does not encode back to its bytes", value);
}

void CheckSession(std::string_view value) {
  idem::Result<redis::StoredSession> s = redis::DecodeSession(value);
  if (!s.has_value()) {
    CheckRejection(s.error());
    return;
  }
  std::string again;
  Put(again, s->low_water, 7);
  Put(again, s->window, 4);
  Put(again, static_cast<std::uint64_t>(s->ttl_ms), 7);
  PutTime(again, s->expires);
  if (again != value) Violation("a session that does not encode back to its bytes", value);
}

// A key name that parses names a record, session or entity whose key, made again, parses to
// the same; a session's or entity's key is made back byte for byte.
void CheckKey(std::string_view name) {
  constexpr std::string_view kPrefix = "idem:";
  const std::string redis_key = std::string(kPrefix) + std::string(name);
  const std::optional<redis::ParsedKey> k = redis::ParseKey(kPrefix, redis_key);
  if (!k) return;
  if (k->scope.size() > 255) Violation("a parsed scope over 255 bytes", name);
  std::string made;
  switch (k->kind) {
    case redis::KeyKind::kRecord:
      made = redis::RecordKey(kPrefix, k->scope, k->name);
      break;
    case redis::KeyKind::kSession:
      made = redis::SessionKey(kPrefix, k->scope, k->name);
      break;
    case redis::KeyKind::kEntity:
      made = redis::EntityKey(kPrefix, k->scope, k->name);
      break;
    default:
      Violation("a parsed key of a packed kind", name);
  }
  if (k->kind != redis::KeyKind::kRecord && made != redis_key) {
    Violation("a session or entity key that is not made back", name);
  }
  const std::optional<redis::ParsedKey> again = redis::ParseKey(kPrefix, made);
  if (!again || again->kind != k->kind || again->scope != k->scope || again->name != k->name) {
    Violation("a key made from a parsed one parses differently", name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      if (rest.size() < 8) return 0;
      std::uint64_t expiry = 0;
      std::memcpy(&expiry, rest.data(), 8);
      CheckRecord(rest.substr(8), static_cast<std::int64_t>(expiry));
      break;
    }
    case 1:
      CheckEntity(rest);
      break;
    case 2:
      CheckSession(rest);
      break;
    case 3:
      CheckKey(rest);
      break;
  }
  return 0;
}
