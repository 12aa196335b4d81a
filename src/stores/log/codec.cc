#include "stores/log/codec.h"

#include <cstddef>
#include <cstring>

namespace idem::log {
namespace {

constexpr std::size_t kMaxVarint = 10;

// Writes an entry's bytes through a pointer into room made once (the most the entry can take),
// then gives back what it did not use: one resize for the entry, not an append per field (the
// appends were the encoder's largest cost, on every change the log store records). Running past
// the room is a bug in the bound EncodeEntry computed: checked, it stops the process before a
// byte lands outside the string.
class Out {
 public:
  Out(std::string* s, std::size_t most) : s_(s) {
    const std::size_t at = s->size();
    s->resize(at + most);
    p_ = s->data() + at;
    end_ = s->data() + s->size();
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  ~Out() { s_->resize(static_cast<std::size_t>(p_ - s_->data())); }

  void Byte(std::uint8_t b) {
    IDEM_CHECK(p_ < end_);
    *p_++ = static_cast<char>(b);
  }
  void Varint(std::uint64_t v) {
    IDEM_CHECK(end_ - p_ >= static_cast<std::ptrdiff_t>(kMaxVarint));
    while (v >= 0x80) {
      *p_++ = static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    *p_++ = static_cast<char>(v);
  }
  // Times are stored as signed offsets: zigzag keeps small negatives small.
  void Signed(std::int64_t v) {
    Varint((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
  }
  void Raw(const void* data, std::size_t n) {
    if (n == 0) return;
    IDEM_CHECK(static_cast<std::size_t>(end_ - p_) >= n);
    std::memcpy(p_, data, n);
    p_ += n;
  }
  void Bytes(std::string_view b) {
    Varint(b.size());
    Raw(b.data(), b.size());
  }

 private:
  std::string* s_;
  char* p_;
  char* end_;
};

std::int64_t Ms(Timestamp t) { return t.time_since_epoch().count(); }
Timestamp AtMs(std::int64_t ms) { return Timestamp(std::chrono::milliseconds(ms)); }

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool Varint(std::uint64_t* v) {
    std::uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in_.empty()) return false;
      auto b = static_cast<std::uint8_t>(in_.front());
      in_.remove_prefix(1);
      r |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *v = r;
        return true;
      }
    }
    return false;
  }
  bool Signed(std::int64_t* v) {
    std::uint64_t u;
    if (!Varint(&u)) return false;
    *v = static_cast<std::int64_t>((u >> 1) ^ (~(u & 1) + 1));
    return true;
  }
  bool U32(std::uint32_t* v) {
    std::uint64_t u;
    if (!Varint(&u) || u > 0xFFFFFFFFu) return false;
    *v = static_cast<std::uint32_t>(u);
    return true;
  }
  bool Bytes(std::string_view* s, std::size_t max) {
    std::uint64_t n;
    if (!Varint(&n) || n > in_.size() || n > max) return false;
    *s = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  bool Byte(std::uint8_t* b) {
    if (in_.empty()) return false;
    *b = static_cast<std::uint8_t>(in_.front());
    in_.remove_prefix(1);
    return true;
  }
  bool Raw(void* dst, std::size_t n) {
    if (in_.size() < n) return false;
    std::memcpy(dst, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

// Record layout: flags(state, outcome, has fp) created lease-created expires-created token
// attempt [fp] response.
// At most 1 + 5 * kMaxVarint + 32 + kMaxVarint bytes and the response.
void PutRecord(Out& out, const Entry& e) {
  const core::RecordHead& r = e.record;
  auto flags =
      static_cast<std::uint8_t>((r.state == RecordState::kCompleted ? 1 : 0) |
                                (r.outcome == Outcome::kFailure ? 2 : 0) | (e.fingerprint ? 4 : 0));
  out.Byte(flags);
  out.Signed(Ms(r.created));
  out.Signed(Ms(r.lease_deadline) - Ms(r.created));
  out.Signed(Ms(r.expires) - Ms(r.created));
  out.Varint(r.token);
  out.Varint(r.attempt);
  if (e.fingerprint) out.Raw(e.fingerprint->bytes.data(), 32);
  out.Bytes(e.response);
}

bool GetRecord(Reader& in, Entry* e) {
  std::uint8_t flags;
  std::int64_t created, lease, expires;
  if (!in.Byte(&flags) || (flags & ~7u) != 0) return false;
  if (!in.Signed(&created) || !in.Signed(&lease) || !in.Signed(&expires)) return false;
  std::int64_t lease_at, expires_at;
  if (__builtin_add_overflow(created, lease, &lease_at) ||
      __builtin_add_overflow(created, expires, &expires_at)) {
    return false;
  }
  core::RecordHead& r = e->record;
  r.state = (flags & 1) ? RecordState::kCompleted : RecordState::kInProgress;
  r.outcome = (flags & 2) ? Outcome::kFailure : Outcome::kSuccess;
  r.created = AtMs(created);
  r.lease_deadline = AtMs(lease_at);
  r.expires = AtMs(expires_at);
  if (!in.Varint(&r.token) || !in.U32(&r.attempt)) return false;
  e->fingerprint.reset();
  if (flags & 4) {
    Fingerprint fp;
    if (!in.Raw(fp.bytes.data(), 32)) return false;
    e->fingerprint = fp;
  }
  // Any response a frame can hold is read; the store writes none over kMaxResponseBytes.
  return in.Bytes(&e->response, kMaxFrameBytes);
}

}  // namespace

void EncodeEntry(const Entry& e, std::string* out) {
  // Scope and name with their lengths, then the most any type adds: a record after a seq
  // (1 + 7 varints + a fingerprint) and its response.
  Out o(out, 2 * kMaxVarint + e.scope.size() + e.name.size() + 1 + 7 * kMaxVarint + 32 +
                 e.response.size());
  if (e.type == EntryType::kTokenFloor) {
    o.Varint(e.token_floor);
    return;
  }
  o.Bytes(e.scope);
  o.Bytes(e.name);
  switch (e.type) {
    case EntryType::kRecordPut:
      PutRecord(o, e);
      break;
    case EntryType::kSeqPut:
      o.Varint(e.seq);
      PutRecord(o, e);
      break;
    case EntryType::kSeqDelete:
      o.Varint(e.seq);
      break;
    case EntryType::kSessionPut:
      o.Varint(e.session.low_water);
      o.Varint(e.session.window);
      o.Signed(e.session.ttl.count());
      o.Signed(Ms(e.session.expires));
      break;
    case EntryType::kEntityPut:
      o.Varint(e.entity.applied);
      o.Varint(e.entity.in_progress);
      o.Varint(e.entity.token);
      o.Varint(e.entity.attempt);
      o.Signed(Ms(e.entity.lease_deadline));
      o.Signed(Ms(e.entity.expires));
      break;
    case EntryType::kRecordDelete:
    case EntryType::kSessionDelete:
    case EntryType::kEntityDelete:
    case EntryType::kTokenFloor:
      break;
  }
}

Status DecodeEntry(std::uint8_t type, std::string_view payload, Entry* out) {
  Reader in(payload);
  auto bad = [&](std::string_view what) {
    return DataLossError("malformed log entry of type " + std::to_string(type) + ": " +
                         std::string(what));
  };
  if (type < 1 || type > 9) return bad("unknown type");
  out->type = static_cast<EntryType>(type);
  if (out->type == EntryType::kTokenFloor) {
    if (!in.Varint(&out->token_floor)) return bad("truncated token floor");
    return in.done() ? OkStatus() : bad("trailing bytes");
  }
  if (!in.Bytes(&out->scope, kMaxNameBytes) || !in.Bytes(&out->name, kMaxNameBytes)) {
    return bad("truncated scope or name");
  }
  bool ok = true;
  switch (out->type) {
    case EntryType::kRecordPut:
      ok = GetRecord(in, out);
      break;
    case EntryType::kSeqPut:
      ok = in.Varint(&out->seq) && GetRecord(in, out);
      break;
    case EntryType::kSeqDelete:
      ok = in.Varint(&out->seq);
      break;
    case EntryType::kSessionPut: {
      std::int64_t ttl, expires;
      ok = in.Varint(&out->session.low_water) && in.U32(&out->session.window) && in.Signed(&ttl) &&
           in.Signed(&expires);
      if (ok) {
        out->session.ttl = std::chrono::milliseconds(ttl);
        out->session.expires = AtMs(expires);
      }
      break;
    }
    case EntryType::kEntityPut: {
      std::int64_t lease, expires;
      ok = in.Varint(&out->entity.applied) && in.Varint(&out->entity.in_progress) &&
           in.Varint(&out->entity.token) && in.U32(&out->entity.attempt) && in.Signed(&lease) &&
           in.Signed(&expires);
      if (ok) {
        out->entity.lease_deadline = AtMs(lease);
        out->entity.expires = AtMs(expires);
      }
      break;
    }
    default:
      break;
  }
  if (!ok) return bad("truncated or invalid fields");
  return in.done() ? OkStatus() : bad("trailing bytes");
}

}  // namespace idem::log
