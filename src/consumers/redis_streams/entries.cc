#include "consumers/redis_streams/entries.h"

#include <charconv>
#include <string>

#include "consumers/redis_streams/client.h"

namespace idem::redis_streams {

std::string EntryId::ToString() const { return std::to_string(ms) + "-" + std::to_string(seq); }

std::optional<EntryId> ParseEntryId(std::string_view text) {
  const std::size_t dash = text.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == text.size()) return std::nullopt;
  EntryId id;
  const char* end = text.data() + dash;
  auto [p1, e1] = std::from_chars(text.data(), end, id.ms);
  if (e1 != std::errc() || p1 != end) return std::nullopt;
  end = text.data() + text.size();
  auto [p2, e2] = std::from_chars(text.data() + dash + 1, end, id.seq);
  if (e2 != std::errc() || p2 != end) return std::nullopt;
  return id;
}

namespace {

Status Bad(std::string_view stream, const redisReply& r) {
  return InternalError("stream " + std::string(stream) + ": an entry came as " + Describe(r));
}

// One [id, fields] into `m` (partition, position, payload, headers); `deleted` when the fields
// are nil (an entry deleted while pending).
Status ParseOne(const redisReply& e, std::string_view stream, std::string_view payload_field,
                BrokerMessage& m, EntryId& id, bool& deleted) {
  if (e.type != REDIS_REPLY_ARRAY || e.elements != 2 || e.element[0]->type != REDIS_REPLY_STRING) {
    return Bad(stream, e);
  }
  const std::string_view position = Text(*e.element[0]);
  const auto parsed = ParseEntryId(position);
  if (!parsed) return Bad(stream, e);
  id = *parsed;
  m.partition = stream;
  m.position = position;
  const redisReply& fields = *e.element[1];
  deleted = fields.type == REDIS_REPLY_NIL;
  if (deleted) return OkStatus();
  if (fields.type != REDIS_REPLY_ARRAY || fields.elements % 2 != 0) return Bad(stream, e);
  bool have_payload = false;
  if (fields.elements > 2) m.headers.reserve(fields.elements / 2 - 1);
  for (std::size_t f = 0; f + 1 < fields.elements; f += 2) {
    const std::string_view name = Text(*fields.element[f]);
    const std::string_view value = Text(*fields.element[f + 1]);
    if (!have_payload && name == payload_field) {
      m.payload = value;
      have_payload = true;
    } else {
      m.headers.emplace_back(name, value);
    }
  }
  return OkStatus();
}

}  // namespace

Status ParseEntries(const redisReply& list, std::string_view stream, std::string_view payload_field,
                    std::vector<ParsedEntry>& out) {
  if (list.type != REDIS_REPLY_ARRAY) return Bad(stream, list);
  out.reserve(out.size() + list.elements);
  for (std::size_t i = 0; i < list.elements; ++i) {
    ParsedEntry& p = out.emplace_back();
    IDEM_RETURN_IF_ERROR(
        ParseOne(*list.element[i], stream, payload_field, p.message, p.id, p.deleted));
  }
  return OkStatus();
}

Status ParseMessages(const redisReply& list, std::string_view stream,
                     std::string_view payload_field, std::uint64_t handle,
                     std::vector<BrokerMessage>& out) {
  if (list.type != REDIS_REPLY_ARRAY) return Bad(stream, list);
  out.reserve(out.size() + list.elements);
  EntryId id;
  bool deleted = false;
  for (std::size_t i = 0; i < list.elements; ++i) {
    BrokerMessage& m = out.emplace_back();
    m.handle = handle;
    IDEM_RETURN_IF_ERROR(ParseOne(*list.element[i], stream, payload_field, m, id, deleted));
    if (deleted) return Bad(stream, *list.element[i]);  // only read-backs have deleted entries
  }
  return OkStatus();
}

}  // namespace idem::redis_streams
