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

Status ParseEntries(const redisReply& list, std::string_view stream, std::string_view payload_field,
                    std::vector<ParsedEntry>& out) {
  auto bad = [&](const redisReply& r) {
    return InternalError("stream " + std::string(stream) + ": an entry came as " + Describe(r));
  };
  if (list.type != REDIS_REPLY_ARRAY) return bad(list);
  out.reserve(out.size() + list.elements);
  for (std::size_t i = 0; i < list.elements; ++i) {
    const redisReply& e = *list.element[i];
    if (e.type != REDIS_REPLY_ARRAY || e.elements != 2 ||
        e.element[0]->type != REDIS_REPLY_STRING) {
      return bad(e);
    }
    const std::string_view position = Text(*e.element[0]);
    const auto id = ParseEntryId(position);
    if (!id) return bad(e);
    ParsedEntry& p = out.emplace_back();
    p.id = *id;
    p.message.partition = stream;
    p.message.position = position;
    const redisReply& fields = *e.element[1];
    if (fields.type == REDIS_REPLY_NIL) {
      p.deleted = true;
      continue;
    }
    if (fields.type != REDIS_REPLY_ARRAY || fields.elements % 2 != 0) return bad(e);
    bool have_payload = false;
    if (fields.elements > 2) p.message.headers.reserve(fields.elements / 2 - 1);
    for (std::size_t f = 0; f + 1 < fields.elements; f += 2) {
      const std::string_view name = Text(*fields.element[f]);
      const std::string_view value = Text(*fields.element[f + 1]);
      if (!have_payload && name == payload_field) {
        p.message.payload = value;
        have_payload = true;
      } else {
        p.message.headers.emplace_back(name, value);
      }
    }
  }
  return OkStatus();
}

}  // namespace idem::redis_streams
