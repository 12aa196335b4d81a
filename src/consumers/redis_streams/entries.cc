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
    // Redis 6.2's XAUTOCLAIM answers an entry deleted while pending with a bare nil, without
    // its id (Redis 7 lists those ids apart): there is nothing to deliver or acknowledge.
    if (list.element[i]->type == REDIS_REPLY_NIL) continue;
    ParsedEntry& p = out.emplace_back();
    IDEM_RETURN_IF_ERROR(
        ParseOne(*list.element[i], stream, payload_field, p.message, p.id, p.deleted));
  }
  return OkStatus();
}

namespace {
char reply_object;  // what the parser's functions hand hiredis: any non-null pointer will do
void FreeNothing(void*) {}
}  // namespace

redisReplyObjectFunctions* NewEntriesParser::Functions() {
  static redisReplyObjectFunctions functions = {&NewEntriesParser::String, &NewEntriesParser::Array,
                                                &NewEntriesParser::Integer, &NewEntriesParser::Nil,
                                                &FreeNothing};
  return &functions;
}

NewEntriesParser& NewEntriesParser::Of(const redisReadTask* task, int& depth) {
  depth = 0;
  while (task->parent != nullptr) {
    task = task->parent;
    ++depth;
  }
  return *static_cast<NewEntriesParser*>(task->privdata);
}

void NewEntriesParser::Bad(std::string_view what) {
  if (status_.ok()) {
    status_ = InternalError("XREADGROUP answered " + std::string(what) + " where entries belong");
  }
  // An entry not read whole is not handed out: it stays pending in Redis, to be read back.
  if (message_ != nullptr && incomplete_) {
    current_->pop_back();
    message_ = nullptr;
  }
}

void NewEntriesParser::EndUnfinished() {
  if (message_ != nullptr && incomplete_) Bad("an entry without its whole field list");
}

const Status& NewEntriesParser::Finish() {
  EndUnfinished();
  return status_;
}

void NewEntriesParser::EndEntry() {
  // A recycled message may have had more headers than this entry.
  message_->headers.resize(headers_);
  incomplete_ = false;
}

// The reply: [[stream, [[id, [field, value, ...]], ...]], ...], or nil.
// Depths:     0  1       2  3   4   5
void* NewEntriesParser::Array(const redisReadTask* task, int elements) {
  int depth = 0;
  NewEntriesParser& p = Of(task, depth);
  const auto n = static_cast<std::size_t>(elements);
  switch (depth) {
    case 0:  // the streams
      break;
    case 1:  // [stream, entries]
      p.EndUnfinished();
      p.current_ = nullptr;
      break;
    case 2:  // the entries of p.stream_
      if (task->idx != 1) p.Bad("an array");
      if (p.current_ != nullptr) p.current_->reserve(p.current_->size() + n);
      break;
    case 3:  // [id, fields]
      p.EndUnfinished();
      p.message_ = nullptr;
      if (n != 2) {
        p.Bad("an entry of " + std::to_string(n) + " elements");
      } else if (p.current_ != nullptr) {
        // A blank message (SpareMessages::Take); the strings that follow fill in the rest.
        BrokerMessage& m = p.current_->emplace_back(p.spares_.Take());
        m.partition = p.streams_[p.stream_];
        m.handle = p.stream_;
        p.message_ = &m;
        p.have_payload_ = false;
        p.headers_ = 0;
        p.fields_left_ = 0;
        p.incomplete_ = true;
      }
      break;
    case 4:  // fields
      if (task->idx != 1) {
        p.Bad("an array");
      } else if (p.message_ != nullptr) {
        p.fields_left_ = n;
        if (n == 0) p.EndEntry();
      }
      break;
    default:
      p.Bad("a nested array");
  }
  return &reply_object;
}

void* NewEntriesParser::String(const redisReadTask* task, char* str, std::size_t len) {
  int depth = 0;
  NewEntriesParser& p = Of(task, depth);
  const std::string_view text(str, len);
  if (depth == 0) {
    if (task->type == REDIS_REPLY_ERROR && p.status_.ok()) {
      p.status_ = UnavailableError("XREADGROUP answered error \"" + std::string(text) + "\"");
    } else {
      p.Bad("a string");
    }
  } else if (depth == 2 && task->idx == 0) {  // the stream's name
    p.current_ = nullptr;
    for (std::size_t i = 0; i < p.streams_.size(); ++i) {
      if (p.streams_[i] == text) {
        p.stream_ = i;
        p.current_ = p.targets_[i];
      }
    }
  } else if (depth == 4 && task->idx == 0) {  // the entry's id
    if (p.message_ != nullptr) p.message_->position = text;
  } else if (depth == 5) {
    if (p.message_ == nullptr) return &reply_object;
    if (task->idx % 2 == 0) {
      p.name_ = text;
    } else if (!p.have_payload_ && p.name_ == p.payload_field_) {
      p.message_->payload = text;
      p.have_payload_ = true;
    } else {
      idem::internal::SetHeader(p.message_->headers, p.headers_++, p.name_, text);
    }
    if (p.fields_left_ > 0 && --p.fields_left_ == 0) p.EndEntry();
  } else {
    p.Bad("a string");
  }
  return &reply_object;
}

void* NewEntriesParser::Integer(const redisReadTask* task, long long) {
  int depth = 0;
  Of(task, depth).Bad("an integer");
  return &reply_object;
}

void* NewEntriesParser::Nil(const redisReadTask* task) {
  int depth = 0;
  NewEntriesParser& p = Of(task, depth);
  if (depth != 0) p.Bad("nil");  // a nil reply: nothing new
  return &reply_object;
}

}  // namespace idem::redis_streams
