// Stream entries as Redis sends them and as the broker hands them out: entry ids, and the
// XREADGROUP / XAUTOCLAIM / XRANGE replies turned into BrokerMessages. No I/O.
#ifndef IDEM_CONSUMERS_REDIS_STREAMS_ENTRIES_H_
#define IDEM_CONSUMERS_REDIS_STREAMS_ENTRIES_H_

#include <hiredis/hiredis.h>

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/consumer.h"
#include "idem/status.h"

namespace idem::redis_streams {

// "1700000000000-3": milliseconds and sequence number; ordered as Redis orders entries.
struct EntryId {
  std::uint64_t ms = 0;
  std::uint64_t seq = 0;
  friend auto operator<=>(const EntryId&, const EntryId&) = default;
  std::string ToString() const;
};
std::optional<EntryId> ParseEntryId(std::string_view text);

// One entry of a reply: [id, [field, value, ...]] (the field list is nil for an entry that was
// deleted while pending).
struct ParsedEntry {
  EntryId id;
  bool deleted = false;
  BrokerMessage message;  // partition, position, payload, headers; deliveries 1
};

// Appends the entries of `list` (an array of [id, fields]) to `out`. kInternal for a reply of
// another shape.
Status ParseEntries(const redisReply& list, std::string_view stream, std::string_view payload_field,
                    std::vector<ParsedEntry>& out);

}  // namespace idem::redis_streams

#endif  // IDEM_CONSUMERS_REDIS_STREAMS_ENTRIES_H_
