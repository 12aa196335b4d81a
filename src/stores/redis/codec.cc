#include "stores/redis/codec.h"

#include <charconv>
#include <cstring>

#include "stores/redis/scripts.h"

namespace idem::redis {
namespace {

constexpr char kLowerHex[] = "0123456789abcdef";
constexpr std::int64_t kMaxStoredMs = std::int64_t{1} << 47;  // i6: the stored times' bound
constexpr char kUpperHex[] = "0123456789ABCDEF";

int HexValue(char c, bool upper) {
  if (c >= '0' && c <= '9') return c - '0';
  if (!upper && c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (upper && c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool AllHex(std::string_view s, bool upper) {
  if (s.empty() || s.size() % 2 != 0) return false;
  for (char c : s) {
    if (HexValue(c, upper) < 0) return false;
  }
  return true;
}

std::string MakeKey(std::string_view prefix, char kind, std::string_view scope,
                    std::string_view name) {
  std::string k;
  k.reserve(prefix.size() + 2 + scope.size() + name.size());
  k.append(prefix);
  k.push_back(kind);
  k.push_back(static_cast<char>(scope.size()));
  k.append(scope);
  k.append(name);
  return k;
}

Status Damaged(std::string_view what) {
  return DataLossError("a stored value is damaged: " + std::string(what));
}

// Reads the little-endian fixed-width fields of a stored value, failing on truncation.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool Unsigned(int bytes, std::uint64_t& v) {
    if (s_.size() < static_cast<std::size_t>(bytes)) return false;
    v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= std::uint64_t{static_cast<std::uint8_t>(s_[static_cast<std::size_t>(i)])} << (8 * i);
    }
    s_.remove_prefix(static_cast<std::size_t>(bytes));
    return true;
  }
  bool Signed(int bytes, std::int64_t& v) {
    std::uint64_t u = 0;
    if (!Unsigned(bytes, u)) return false;
    const int shift = 64 - 8 * bytes;
    v = static_cast<std::int64_t>(u << shift) >> shift;  // sign-extends
    return true;
  }
  bool Bytes(std::size_t n, std::string_view& out) {
    if (s_.size() < n) return false;
    out = s_.substr(0, n);
    s_.remove_prefix(n);
    return true;
  }
  std::string_view rest() const { return s_; }

 private:
  std::string_view s_;
};

Timestamp Ms(std::int64_t ms) { return Timestamp(std::chrono::milliseconds(ms)); }

}  // namespace

std::string RecordKey(std::string_view prefix, std::string_view scope, std::string_view key) {
  const bool lower = AllHex(key, false);
  const bool upper = !lower && AllHex(key, true);
  if (!lower && !upper) return MakeKey(prefix, static_cast<char>(KeyKind::kRecord), scope, key);
  std::string packed(key.size() / 2, '\0');
  for (std::size_t i = 0; i < packed.size(); ++i) {
    packed[i] =
        static_cast<char>(HexValue(key[2 * i], upper) << 4 | HexValue(key[2 * i + 1], upper));
  }
  return MakeKey(prefix,
                 static_cast<char>(upper ? KeyKind::kRecordUpperHex : KeyKind::kRecordLowerHex),
                 scope, packed);
}

std::string SessionKey(std::string_view prefix, std::string_view scope, std::string_view client) {
  return MakeKey(prefix, static_cast<char>(KeyKind::kSession), scope, client);
}

std::string EntityKey(std::string_view prefix, std::string_view scope, std::string_view entity) {
  return MakeKey(prefix, static_cast<char>(KeyKind::kEntity), scope, entity);
}

std::optional<ParsedKey> ParseKey(std::string_view prefix, std::string_view redis_key) {
  if (redis_key.size() < prefix.size() + 2 || redis_key.substr(0, prefix.size()) != prefix) {
    return std::nullopt;
  }
  std::string_view rest = redis_key.substr(prefix.size());
  const char kind = rest[0];
  const auto scope_size = static_cast<std::uint8_t>(rest[1]);
  rest.remove_prefix(2);
  if (rest.size() < scope_size) return std::nullopt;
  ParsedKey k;
  k.scope = std::string(rest.substr(0, scope_size));
  const std::string_view name = rest.substr(scope_size);
  switch (static_cast<KeyKind>(kind)) {
    case KeyKind::kRecord:
    case KeyKind::kSession:
    case KeyKind::kEntity:
      k.kind = static_cast<KeyKind>(kind);
      k.name = std::string(name);
      return k;
    case KeyKind::kRecordLowerHex:
    case KeyKind::kRecordUpperHex: {
      const char* digits = kind == 'H' ? kUpperHex : kLowerHex;
      k.kind = KeyKind::kRecord;
      k.name.reserve(2 * name.size());
      for (char c : name) {
        const auto b = static_cast<std::uint8_t>(c);
        k.name.push_back(digits[b >> 4]);
        k.name.push_back(digits[b & 15]);
      }
      return k;
    }
  }
  return std::nullopt;
}

std::string PrefixPattern(std::string_view prefix) {
  std::string p;
  for (char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') p.push_back('\\');
    p.push_back(c);
  }
  p.push_back('*');
  return p;
}

Result<StoredRecord> DecodeRecord(std::string_view value, std::int64_t key_expiry_ms) {
  if (value.empty()) return Damaged("an empty record");
  StoredRecord r;
  core::RecordHead& h = r.head;
  const auto first = static_cast<std::uint8_t>(value[0]);
  if (first < 0x80) {
    // The compact form: one decimal integer.
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || n >= (std::uint64_t{1} << 53)) {
      return Damaged("a compact record that is not a number below 2^53");
    }
    if (key_expiry_ms < 0) return Damaged("a compact record on a key without an expiry");
    // The wide form's times are 6-byte signed: a key set to expire later than that (by hand:
    // the scripts never do) is not one of ours, and its token would overflow.
    if (key_expiry_ms >= kMaxStoredMs) {
      return Damaged("a compact record on a key expiring beyond the stored times' range");
    }
    const auto ttl = static_cast<std::int64_t>(n & ((1u << 28) - 1));
    const std::uint64_t zt = (n >> 28) & ((1u << 21) - 1);
    const std::uint64_t top = n >> 49;
    const std::int64_t expires = key_expiry_ms - kGraceMs;
    const std::int64_t created = expires - ttl;
    const std::int64_t dt = static_cast<std::int64_t>(zt >> 1) ^ -static_cast<std::int64_t>(zt & 1);
    h.state = RecordState::kCompleted;
    h.outcome = (top >> 3) != 0 ? Outcome::kFailure : Outcome::kSuccess;
    h.attempt = static_cast<std::uint32_t>((top & 7) + 1);
    h.created = Ms(created);
    h.expires = Ms(expires);
    h.token = static_cast<Token>(created * 1000 + dt);
    return r;
  }
  const unsigned kind = first & 3u;
  const bool has_fp = (first & 4u) != 0;
  if (kind > 2 || (first & 0x78u) != 0) return Damaged("an unknown record header");
  Reader in(value.substr(1));
  std::uint64_t token = 0, attempt = 0;
  std::int64_t created = 0, expires = 0, lease = 0;
  if (!in.Unsigned(7, token) || !in.Unsigned(4, attempt) || !in.Signed(6, created) ||
      !in.Signed(6, expires)) {
    return Damaged("a truncated record");
  }
  if (kind == 0 && !in.Signed(6, lease)) return Damaged("a truncated record");
  if (has_fp) {
    std::string_view fp;
    if (!in.Bytes(32, fp)) return Damaged("a truncated fingerprint");
    r.fingerprint.emplace();
    std::memcpy(r.fingerprint->bytes.data(), fp.data(), 32);
  }
  h.state = kind == 0 ? RecordState::kInProgress : RecordState::kCompleted;
  h.outcome = kind == 2 ? Outcome::kFailure : Outcome::kSuccess;
  h.token = token;
  h.attempt = static_cast<std::uint32_t>(attempt);
  h.created = Ms(created);
  h.expires = Ms(expires);
  if (kind == 0) {
    h.lease_deadline = Ms(lease);
    if (!in.rest().empty()) return Damaged("bytes after an in-progress record");
  } else {
    r.response = std::string(in.rest());
  }
  return r;
}

Result<core::EntityHead> DecodeEntity(std::string_view value) {
  if (value.empty() || static_cast<std::uint8_t>(value[0]) != 0x80) {
    return Damaged("an unknown entity header");
  }
  Reader in(value.substr(1));
  core::EntityHead e;
  std::uint64_t attempt = 0;
  std::int64_t lease = 0, expires = 0;
  if (!in.Unsigned(7, e.applied) || !in.Unsigned(7, e.in_progress) || !in.Unsigned(7, e.token) ||
      !in.Unsigned(4, attempt) || !in.Signed(6, lease) || !in.Signed(6, expires) ||
      !in.rest().empty()) {
    return Damaged("a truncated entity");
  }
  e.attempt = static_cast<std::uint32_t>(attempt);
  e.lease_deadline = Ms(lease);
  e.expires = Ms(expires);
  return e;
}

Result<StoredSession> DecodeSession(std::string_view value) {
  Reader in(value);
  StoredSession s;
  std::uint64_t window = 0, ttl = 0;
  std::int64_t expires = 0;
  if (!in.Unsigned(7, s.low_water) || !in.Unsigned(4, window) || !in.Unsigned(7, ttl) ||
      !in.Signed(6, expires) || !in.rest().empty()) {
    return Damaged("a truncated session");
  }
  s.window = static_cast<std::uint32_t>(window);
  s.ttl_ms = static_cast<std::int64_t>(ttl);
  s.expires = Ms(expires);
  return s;
}

}  // namespace idem::redis
