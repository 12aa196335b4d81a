// The Lua scripts that run the record state machine inside Redis, one per store operation.
// Each touches exactly one key (KEYS[1]), so each is atomic and cluster-safe. They implement
// the transitions of src/core/machine.h; the store contract suite checks that they do.
//
// Stored values (docs/redis.md has the table), little-endian fixed-width fields (Redis's
// struct library: In / in are n-byte unsigned / signed integers):
//   record, wide form   byte 0x80 + kind + 4 if it has a fingerprint (kind 0 in progress,
//                       1 success, 2 failure); I7 token, I4 attempt, i6 created, i6 expires
//                       (ms since the epoch), [in progress: i6 lease deadline], [32-byte
//                       fingerprint], [completed: the response, to the end]
//   record, compact     a completed record with no fingerprint, no response and attempt <= 8,
//                       written when the caller's clock is within 1 s of the server's: one
//                       decimal integer < 2^53 (Redis keeps it as a 64-bit integer, no string),
//                       ((outcome*8 + attempt-1) * 2^21 + zigzag(token - created*1000)) * 2^28
//                       + (expires - created); the expiry is the key's own (PEXPIRETIME) minus
//                       kGraceMs.
//   session (a hash)    field "h": I7 low water, I4 window, I7 ttl, i6 expires; field "<seq>":
//                       that number's record, wide form.
//   entity              byte 0x80, I7 applied, I7 in progress, I7 token, I4 attempt, i6 lease
//                       deadline, i6 expires.
// Redis drops a key kGraceMs after its logical expiry, so a record is never gone before it
// has expired for every caller whose clock is within kGraceMs of the server's.
#ifndef IDEM_STORES_REDIS_SCRIPTS_H_
#define IDEM_STORES_REDIS_SCRIPTS_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace idem::redis {

inline constexpr std::int64_t kGraceMs = 10'000;

enum class ScriptId : std::uint8_t {
  kBegin,
  kComplete,
  kRelease,
  kExtend,
  kErase,
  kGet,
  kPurge,
  kOpenSession,
  kBeginSequenced,
  kCompleteSequenced,
  kReleaseSequenced,
  kAcknowledge,
  kBeginVersioned,
  kCompleteVersioned,
  kReleaseVersioned,
  // One node only (the keys may be in any slots): a batch in one call.
  kBeginMany,
  kCompleteMany,
  kCount,
};

struct Script {
  std::string_view name;
  std::string body;
  std::string sha;  // hex SHA-1 of body, as EVALSHA wants it
};

const Script& GetScript(ScriptId id);

}  // namespace idem::redis

#endif  // IDEM_STORES_REDIS_SCRIPTS_H_
