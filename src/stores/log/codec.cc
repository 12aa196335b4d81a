#include "stores/log/codec.h"

#include <cstring>

namespace idem::log {
namespace {

void PutVarint(std::string* out, std::uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, static_cast<std::size_t>(n));
}

// Times are stored as signed offsets: zigzag keeps small negatives small.
void PutSigned(std::string* out, std::int64_t v) {
  PutVarint(out, (static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63));
}

void PutBytes(std::string* out, std::string_view s) {
  PutVarint(out, s.size());
  out->append(s);
}

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
void PutRecord(std::string* out, const Entry& e) {
  const core::RecordHead& r = e.record;
  auto flags =
      static_cast<std::uint8_t>((r.state == RecordState::kCompleted ? 1 : 0) |
                                (r.outcome == Outcome::kFailure ? 2 : 0) | (e.fingerprint ? 4 : 0));
  out->push_back(static_cast<char>(flags));
  PutSigned(out, Ms(r.created));
  PutSigned(out, Ms(r.lease_deadline) - Ms(r.created));
  PutSigned(out, Ms(r.expires) - Ms(r.created));
  PutVarint(out, r.token);
  PutVarint(out, r.attempt);
  if (e.fingerprint) out->append(reinterpret_cast<const char*>(e.fingerprint->bytes.data()), 32);
  PutBytes(out, e.response);
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
  if (e.type == EntryType::kTokenFloor) {
    PutVarint(out, e.token_floor);
    return;
  }
  PutBytes(out, e.scope);
  PutBytes(out, e.name);
  switch (e.type) {
    case EntryType::kRecordPut:
      PutRecord(out, e);
      break;
    case EntryType::kSeqPut:
      PutVarint(out, e.seq);
      PutRecord(out, e);
      break;
    case EntryType::kSeqDelete:
      PutVarint(out, e.seq);
      break;
    case EntryType::kSessionPut:
      PutVarint(out, e.session.low_water);
      PutVarint(out, e.session.window);
      PutSigned(out, e.session.ttl.count());
      PutSigned(out, Ms(e.session.expires));
      break;
    case EntryType::kEntityPut:
      PutVarint(out, e.entity.applied);
      PutVarint(out, e.entity.in_progress);
      PutVarint(out, e.entity.token);
      PutVarint(out, e.entity.attempt);
      PutSigned(out, Ms(e.entity.lease_deadline));
      PutSigned(out, Ms(e.entity.expires));
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
