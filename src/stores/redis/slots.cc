#include "stores/redis/slots.h"

#include <hiredis/hiredis.h>

#include <array>

namespace idem::redis {
namespace {

constexpr std::array<std::uint16_t, 256> MakeCrc16Table() {
  std::array<std::uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    table[static_cast<std::size_t>(i)] = crc;
  }
  return table;
}

constexpr std::array<std::uint16_t, 256> kCrc16Table = MakeCrc16Table();

Status Malformed(std::string_view what) {
  return UnavailableError("unexpected CLUSTER SLOTS reply: " + std::string(what));
}

}  // namespace

std::uint16_t Crc16(std::string_view bytes) {
  std::uint16_t crc = 0;
  for (const char c : bytes) {
    const auto b = static_cast<std::uint8_t>(c);
    crc = static_cast<std::uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ b) & 0xff]);
  }
  return crc;
}

std::string_view HashTag(std::string_view key) {
  const std::size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const std::size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

Result<std::vector<SlotRange>> ParseClusterSlots(const redisReply& reply,
                                                 std::string_view asked_host) {
  if (reply.type != REDIS_REPLY_ARRAY) return Malformed("not an array");
  std::vector<SlotRange> ranges;
  for (std::size_t i = 0; i < reply.elements; ++i) {
    const redisReply* r = reply.element[i];
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_ARRAY || r->element[2]->elements < 2) {
      return Malformed("entry " + std::to_string(i) + " is not [first, last, [host, port, ...]]");
    }
    const redisReply* master = r->element[2];
    if (master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      return Malformed("entry " + std::to_string(i) + " names its master oddly");
    }
    SlotRange range;
    range.first = static_cast<int>(r->element[0]->integer);
    range.last = static_cast<int>(r->element[1]->integer);
    range.host.assign(master->element[0]->str, master->element[0]->len);
    range.port = static_cast<int>(master->element[1]->integer);
    if (range.first < 0 || range.last >= kSlots || range.first > range.last) {
      return Malformed("slots " + std::to_string(range.first) + "-" + std::to_string(range.last));
    }
    if (range.port <= 0 || range.port > 65535) {
      return Malformed("port " + std::to_string(range.port));
    }
    // "?" and "" both mean: the address you reached me at.
    if (range.host.empty() || range.host == "?") range.host = std::string(asked_host);
    ranges.push_back(std::move(range));
  }
  return ranges;
}

}  // namespace idem::redis
