// Stream entries as Redis sends them and as the broker hands them out: entry ids, and the
// XREADGROUP / XAUTOCLAIM / XRANGE replies turned into BrokerMessages. No I/O.
#ifndef IDEM_CONSUMERS_REDIS_STREAMS_ENTRIES_H_
#define IDEM_CONSUMERS_REDIS_STREAMS_ENTRIES_H_

#include <hiredis/hiredis.h>

#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/spare_messages.h"
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

// Appends the entries of `list` (an array of [id, fields]) to `out`, skipping nil elements
// (Redis 6.2's XAUTOCLAIM for an entry deleted while pending). kInternal for a reply of another
// shape.
Status ParseEntries(const redisReply& list, std::string_view stream, std::string_view payload_field,
                    std::vector<ParsedEntry>& out);

// Reads the reply to an XREADGROUP ... > straight into messages while hiredis parses it,
// without hiredis's reply objects: making, copying and freeing those took a third of a busy
// consumer's time. Give Functions() and the parser to Client::ReadWith; status() says whether
// the reply was entries (or nil: nothing new), an error reply (kUnavailable), or something else
// (kInternal). The reply is always read to its end, so the connection stays in step.
class NewEntriesParser {
 public:
  // Entries of streams[i] are appended to *targets[i] with handle i, filled into messages taken
  // from `spares`.
  NewEntriesParser(std::span<const std::string> streams,
                   std::span<std::vector<BrokerMessage>* const> targets,
                   std::string_view payload_field, idem::internal::SpareMessages& spares)
      : streams_(streams), targets_(targets), payload_field_(payload_field), spares_(spares) {}

  static redisReplyObjectFunctions* Functions();
  // Once the reply was read, or its read failed: what it was (see above). An entry not read
  // whole (a reply of another shape, or cut off) is not appended.
  const Status& Finish();

 private:
  static void* String(const redisReadTask* task, char* str, std::size_t len);
  static void* Array(const redisReadTask* task, int elements);
  static void* Integer(const redisReadTask* task, long long value);
  static void* Nil(const redisReadTask* task);
  // The parser (the reader's privdata, on the root task) and the task's depth in the reply.
  static NewEntriesParser& Of(const redisReadTask* task, int& depth);
  void Bad(std::string_view what);
  // The current entry's field list was read to its end.
  void EndEntry();
  // Drops the current entry when it was not read whole.
  void EndUnfinished();

  std::span<const std::string> streams_;
  std::span<std::vector<BrokerMessage>* const> targets_;
  std::string_view payload_field_;
  idem::internal::SpareMessages& spares_;
  std::size_t stream_ = 0;                         // index of the stream being read
  std::vector<BrokerMessage>* current_ = nullptr;  // its target; nullptr: skip its entries
  BrokerMessage* message_ = nullptr;               // the entry being read
  bool have_payload_ = false;
  bool incomplete_ = false;      // message_ is still being read
  std::size_t headers_ = 0;      // headers of message_ set so far
  std::size_t fields_left_ = 0;  // strings of its field list still to come
  std::string name_;             // the last field name
  Status status_;
};

}  // namespace idem::redis_streams

#endif  // IDEM_CONSUMERS_REDIS_STREAMS_ENTRIES_H_
