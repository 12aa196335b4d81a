// Redis Cluster key placement: the slot of a key (CRC16/XMODEM of its hash tag, modulo 16384,
// as the Redis Cluster specification defines it) and the slot map CLUSTER SLOTS returns.
// Pure functions; no I/O.
#ifndef IDEM_STORES_REDIS_SLOTS_H_
#define IDEM_STORES_REDIS_SLOTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

struct redisReply;

namespace idem::redis {

inline constexpr int kSlots = 16384;

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
std::uint16_t Crc16(std::string_view bytes);

// The part of `key` that decides its slot: the bytes between the first '{' and the first '}'
// after it, if that is not empty; otherwise the whole key.
std::string_view HashTag(std::string_view key);

// The cluster slot of `key`.
inline int KeySlot(std::string_view key) { return Crc16(HashTag(key)) & (kSlots - 1); }

struct SlotRange {
  int first = 0;  // inclusive
  int last = 0;   // inclusive
  std::string host;
  int port = 0;
};

// The masters' slot ranges in a CLUSTER SLOTS reply. An empty host means "the node you asked"
// and becomes `asked_host`. kUnavailable for a reply of another shape.
Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply& reply,
                                                 std::string_view asked_host);

}  // namespace idem::redis

#endif  // IDEM_STORES_REDIS_SLOTS_H_
