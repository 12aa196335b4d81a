// Redis keys and the C++ side of the value encodings (scripts.h describes the values).
//
// Keys: prefix, one byte saying what the key holds, one byte with the scope's length, the
// scope, then the name. A record key that is an even number of lowercase (or uppercase) hex
// digits is stored packed, two digits a byte ('h' / 'H'), so that a 32-digit key takes 16
// bytes; any other record key is stored as is ('r'). Sessions are 's' (client id), entities
// 'e' (entity name).
#ifndef IDEM_STORES_REDIS_CODEC_H_
#define IDEM_STORES_REDIS_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/machine.h"
#include "idem/fingerprint.h"
#include "idem/status.h"

namespace idem::redis {

enum class KeyKind : char {
  kRecord = 'r',
  kRecordLowerHex = 'h',
  kRecordUpperHex = 'H',
  kSession = 's',
  kEntity = 'e',
};

std::string RecordKey(std::string_view prefix, std::string_view scope, std::string_view key);
std::string SessionKey(std::string_view prefix, std::string_view scope, std::string_view client);
std::string EntityKey(std::string_view prefix, std::string_view scope, std::string_view entity);

struct ParsedKey {
  KeyKind kind;  // kRecordLowerHex/kRecordUpperHex are reported as kRecord
  std::string scope;
  std::string name;
};
// nullopt for a key that is not one of ours under `prefix`.
std::optional<ParsedKey> ParseKey(std::string_view prefix, std::string_view redis_key);

// A SCAN MATCH pattern for every key under `prefix` (glob characters escaped).
std::string PrefixPattern(std::string_view prefix);

struct StoredRecord {
  core::RecordHead head;
  std::optional<Fingerprint> fingerprint;
  std::string response;
};
// `key_expiry_ms` is the key's PEXPIRETIME, needed for the compact form only.
Result<StoredRecord> DecodeRecord(std::string_view value, std::int64_t key_expiry_ms);

Result<core::EntityHead> DecodeEntity(std::string_view value);

struct StoredSession {
  std::uint64_t low_water = 0;
  std::uint32_t window = 0;
  std::int64_t ttl_ms = 0;
  Timestamp expires;
};
Result<StoredSession> DecodeSession(std::string_view value);

}  // namespace idem::redis

#endif  // IDEM_STORES_REDIS_CODEC_H_
