#include "stores/log/batch.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "stores/log/crc32c.h"

namespace idem::log {
namespace {

constexpr char kMagic[8] = {'I', 'D', 'E', 'M', 'L', 'O', 'G', '\0'};

void Put32(char* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
void Put64(char* p, std::uint64_t v) { std::memcpy(p, &v, 8); }
std::uint32_t Get32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint64_t Get64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

struct BatchHeader {
  std::uint64_t seq;
  std::uint32_t count;
  std::uint32_t bytes;
};

// A batch header at `pos` whose magic and checksum hold, and whose body fits in the file.
bool ReadHeader(std::string_view f, std::uint64_t salt, std::size_t pos, BatchHeader* h) {
  if (f.size() - pos < kBatchHeaderSize) return false;
  const char* p = f.data() + pos;
  if (Get32(p) != kBatchMagic) return false;
  if (Get32(p + 4) != Crc32c(ChecksumSeed(salt), p + 8, 16)) return false;
  h->seq = Get64(p + 8);
  h->count = Get32(p + 16);
  h->bytes = Get32(p + 20);
  return true;
}

// The frame at `pos` if its length fits in `end` and its checksum holds.
bool ReadFrame(std::string_view f, std::uint64_t salt, std::size_t pos, std::size_t end, Frame* fr,
               std::size_t* next) {
  if (end - pos < kFrameHeaderSize) return false;
  const char* p = f.data() + pos;
  std::uint32_t crc = Get32(p);
  std::uint32_t len = Get32(p + 4);
  if (len > kMaxFrameBytes || end - pos - kFrameHeaderSize < len) return false;
  if (Crc32c(ChecksumSeed(salt), p + 8, 1 + static_cast<std::size_t>(len)) != crc) return false;
  fr->type = static_cast<std::uint8_t>(p[8]);
  fr->payload = f.substr(pos + kFrameHeaderSize, len);
  fr->offset = pos;
  *next = pos + kFrameHeaderSize + len;
  return true;
}

// Checks a whole batch at `pos` without giving its frames to anyone. On failure, `*bad` is
// where the damage starts.
bool BatchIntact(std::string_view f, std::uint64_t salt, std::size_t pos, const BatchHeader& h,
                 std::string* why, std::size_t* bad = nullptr) {
  std::size_t body = pos + kBatchHeaderSize;
  if (bad) *bad = body;
  if (f.size() - body < h.bytes) {
    *why = "batch extends past the end of the file";
    return false;
  }
  std::size_t end = body + h.bytes, at = body;
  for (std::uint32_t i = 0; i < h.count; ++i) {
    Frame fr;
    if (!ReadFrame(f, salt, at, end, &fr, &at)) {
      *why =
          "frame " + std::to_string(i) + " at offset " + std::to_string(at) + " fails its checksum";
      if (bad) *bad = at;
      return false;
    }
  }
  if (at != end) {
    *why = "batch length does not match its frames";
    if (bad) *bad = at;
    return false;
  }
  return true;
}

bool AllZero(std::string_view s) { return s.find_first_not_of('\0') == std::string_view::npos; }

// A disk writes a sector (512 bytes, aligned in the file) whole or not at all.
constexpr std::size_t kSectorSize = 512;

// Whether a sector overlapping [begin, end) reads as zeros (the file's last sector counts by
// the part of it in the file).
bool ZeroSectorIn(std::string_view f, std::size_t begin, std::size_t end) {
  for (std::size_t s = begin / kSectorSize * kSectorSize; s < end && s < f.size();
       s += kSectorSize) {
    if (AllZero(f.substr(s, kSectorSize))) return true;
  }
  return false;
}

// Whether a sector's share of the batch header at `pos` reads as zeros: that sector of the write
// never reached the disk. Every share of a real header holds a non-zero byte (the magic, or
// the frame count and length, which a batch never has as zero), so this is never a header
// that was written whole.
bool HeaderSectorLost(std::string_view f, std::size_t pos) {
  const std::size_t end = pos + kBatchHeaderSize;
  for (std::size_t s = pos / kSectorSize * kSectorSize; s < end; s += kSectorSize) {
    const std::size_t from = std::max(s, pos);
    if (AllZero(f.substr(from, std::min(end, s + kSectorSize) - from))) return true;
  }
  return false;
}

// Where the first bad frame of the damaged batch at `pos` (whose header reads) starts, and
// where it ends as far as its length can be believed; nullopt when the batch runs past the end
// of the file.
std::optional<std::pair<std::size_t, std::size_t>> BadFrame(std::string_view f, std::uint64_t salt,
                                                            std::size_t pos, const BatchHeader& h) {
  std::string why;
  std::size_t bad;
  if (BatchIntact(f, salt, pos, h, &why, &bad)) return std::pair{bad, bad};
  const std::size_t body = pos + kBatchHeaderSize;
  if (f.size() - body < h.bytes) return std::nullopt;
  const std::size_t end = body + h.bytes;
  std::size_t frame_end = end;
  if (end - bad >= kFrameHeaderSize) {
    frame_end = std::min<std::size_t>(end, bad + kFrameHeaderSize + Get32(f.data() + bad + 4));
  }
  return std::pair{bad, frame_end};
}

// A crash tears the last batch in one of the ways a crash can: cut short (the write did not
// finish), or with sectors that never reached the disk and read as zeros (blocks the file grew
// by, or the zeros reserved ahead of the log). The pages of one write reach the disk in any
// order, so written sectors may follow a zeroed one, but only within the batch's declared
// length, with nothing but zeros after it. The first bad frame must then hold a zeroed sector
// (or zeros up to the end of the file): a complete batch whose checksum fails without one, or
// non-zero bytes past the batch, are damage. When the header's own sector is the one lost, the
// declared length went with it: the later sectors of that write are all that can follow
// (the caller has found no intact batch after it).
bool LooksTorn(std::string_view f, std::uint64_t salt, std::size_t pos) {
  if (f.size() - pos < kBatchHeaderSize) return true;
  BatchHeader h;
  if (!ReadHeader(f, salt, pos, &h)) return AllZero(f.substr(pos)) || HeaderSectorLost(f, pos);
  const auto bad = BadFrame(f, salt, pos, h);
  if (!bad) return true;  // cut short
  const auto [bad_at, frame_end] = *bad;
  if (bad_at == frame_end) return false;  // intact
  const std::size_t end = pos + kBatchHeaderSize + h.bytes;
  // Zeros that start inside the bad frame and run to the end of the file.
  std::size_t last_nonzero = f.find_last_not_of('\0');
  if (last_nonzero == std::string_view::npos || last_nonzero + 1 < frame_end) return true;
  // A zeroed sector in the bad frame, written sectors after it within the batch.
  return AllZero(f.substr(end)) && ZeroSectorIn(f, bad_at, frame_end);
}

// Whether the damaged batch at `pos` shows the mark of a write that never reached the disk: a
// zeroed sector in its header or in its first bad frame, or an end past the end of the file
// (the file's size reached the disk before the write did). Bytes of an append-only file are
// either what was written or zeros; anything else is damage.
bool LostWriteAt(std::string_view f, std::uint64_t salt, std::size_t pos) {
  BatchHeader h;
  if (!ReadHeader(f, salt, pos, &h)) return HeaderSectorLost(f, pos);
  const auto bad = BadFrame(f, salt, pos, h);
  if (!bad) return true;
  return bad->first != bad->second && ZeroSectorIn(f, bad->first, bad->second);
}

// The sync mark of the batch at `pos`, whose header reads, when its last frame is one whose
// checksum holds (the batch's other frames may be damaged); nullopt when it has none, or it
// cannot be read.
std::optional<std::uint64_t> SyncMarkOf(std::string_view f, std::uint64_t salt, std::size_t pos,
                                        const BatchHeader& h) {
  constexpr std::size_t kMarkFrameSize = kFrameHeaderSize + 8;
  const std::size_t end = pos + kBatchHeaderSize + std::size_t{h.bytes};
  if (h.bytes < kMarkFrameSize || end > f.size()) return std::nullopt;
  Frame fr;
  std::size_t next;
  if (!ReadFrame(f, salt, end - kMarkFrameSize, end, &fr, &next) || fr.type != kSyncMarkFrame ||
      fr.payload.size() != 8) {
    return std::nullopt;
  }
  return Get64(fr.payload.data());
}

// The next intact batch after `from` with a seq above `after_seq`. Byte by byte: only the salt
// keeps a batch inside a frame's payload from being taken for one.
std::size_t NextHeader(std::string_view f, std::uint64_t salt, std::size_t from,
                       std::uint64_t after_seq, BatchHeader* h) {
  for (std::size_t pos = from; pos + kBatchHeaderSize <= f.size(); ++pos) {
    if (ReadHeader(f, salt, pos, h) && h->seq > after_seq) {
      std::string why;
      if (BatchIntact(f, salt, pos, *h, &why)) return pos;
    }
  }
  return std::string_view::npos;
}

// Whether the damage at `pos` is a power failure's loss under sync=interval or none. Sectors
// that were synced never read back as zeros (the assumption the torn-tail rule makes too), so it
// is when a sector of it reads as zeros, nothing after it says a sync covered it, and the file
// was written by a writer that marks its syncs (`marked_before`: a mark was read before `pos`).
// Each batch after it must be either intact with a sync mark at or below `pos`, or damaged the
// same way (a lost sector); an intact one without a mark (a version 2 writer's) is damage. A
// batch whose header was lost cannot be checked and is taken as lost. Counts the later batches
// that go with it.
bool LostBeforeSync(std::string_view f, std::uint64_t salt, std::size_t pos,
                    std::uint64_t after_seq, bool marked_before, std::uint64_t* later_batches) {
  if (!LostWriteAt(f, salt, pos)) return false;
  *later_batches = 0;
  bool marked = marked_before;
  for (std::size_t at = pos + 1; at + kBatchHeaderSize <= f.size(); ++at) {
    BatchHeader h;
    if (!ReadHeader(f, salt, at, &h) || h.seq <= after_seq) continue;
    ++*later_batches;
    const auto mark = SyncMarkOf(f, salt, at, h);
    if (mark && *mark > pos) return false;
    marked = marked || mark.has_value();
    std::string why;
    const bool intact = BatchIntact(f, salt, at, h, &why);
    if (intact ? !mark : !LostWriteAt(f, salt, at)) return false;
    // Past an intact batch's frames; into a damaged one's, where the next header may be.
    at += kBatchHeaderSize + (intact ? std::size_t{h.bytes} : 0) - 1;
  }
  return marked;
}

}  // namespace

std::string FileHeader(std::uint64_t salt) {
  std::string h(kFileHeaderSize, '\0');
  std::memcpy(h.data(), kMagic, 8);
  Put32(h.data() + 8, kFormatVersion);
  Put64(h.data() + kSaltOffset, salt);
  Put32(h.data() + 20, Crc32c(0, h.data(), 20));
  return h;
}

Result<std::uint64_t> ReadFileHeader(std::string_view data, std::string_view path) {
  const bool magic = data.size() >= 8 && std::memcmp(data.data(), kMagic, 8) == 0;
  // The checksum is checked before the version is believed: a header whose checksum fails is
  // damage (a flipped bit in the version field is not another version), and one whose checksum
  // holds says exactly what wrote it, whatever version that is.
  if (magic && data.size() >= kFileHeaderSize &&
      Get32(data.data() + 20) == Crc32c(0, data.data(), 20)) {
    const std::uint32_t version = Get32(data.data() + 8);
    if (version < kOldestReadableVersion || version > kFormatVersion) {
      return FailedPreconditionError(
          std::string(path) + ": log format version " + std::to_string(version) +
          ", this build reads versions " + std::to_string(kOldestReadableVersion) + " to " +
          std::to_string(kFormatVersion) +
          (version == 1 ? " only (version 1, unreleased, had no salt: start a new store)" : ""));
    }
    return Get64(data.data() + kSaltOffset);
  }
  // Version 1's 16-byte header: magic, version, crc32c of those 12 bytes.
  if (magic && data.size() >= 16 && Get32(data.data() + 8) == 1 &&
      Get32(data.data() + 12) == Crc32c(0, data.data(), 12)) {
    return FailedPreconditionError(
        std::string(path) + ": log format version 1, this build reads versions " +
        std::to_string(kOldestReadableVersion) + " to " + std::to_string(kFormatVersion) +
        " only (version 1, unreleased, had no salt: start a new store)");
  }
  std::string why = data.size() < kFileHeaderSize
                        ? std::to_string(data.size()) + " bytes, shorter than a header"
                    : magic ? "its checksum fails"
                            : "no IDEMLOG magic: damaged, or not an idem log file";
  return DataLossError(std::string(path) + " offset 0: bad header (" + why + ")");
}

std::optional<std::uint64_t> SaltOfDamagedHeader(std::string_view data) {
  if (data.size() < kFileHeaderSize + kBatchHeaderSize) return std::nullopt;
  const std::uint64_t salt = Get64(data.data() + kSaltOffset);
  BatchHeader h;
  std::string why;
  if (!ReadHeader(data, salt, kFileHeaderSize, &h) ||
      !BatchIntact(data, salt, kFileHeaderSize, h, &why)) {
    return std::nullopt;
  }
  return salt;
}

std::uint32_t FileVersion(std::string_view data) { return Get32(data.data() + 8); }

Status CheckFileHeader(std::string_view data, std::string_view path, std::uint64_t salt) {
  auto got = ReadFileHeader(data, path);
  if (!got) return got.error();
  if (*got != salt) {
    return DataLossError(std::string(path) + " offset " + std::to_string(kSaltOffset) +
                         ": the file's salt is not the store's (a file of another store?)");
  }
  return OkStatus();
}

Status AdoptOrCheckFileHeader(std::string_view data, std::string_view path,
                              std::optional<std::uint64_t>& salt) {
  if (salt) return CheckFileHeader(data, path, *salt);
  auto read = ReadFileHeader(data, path);
  if (!read) return read.error();
  salt = *read;
  return OkStatus();
}

void BatchBuilder::Clear() {
  buf_.assign(kBatchHeaderSize, '\0');
  count_ = 0;
}

namespace {
// Fills in the header of the frame at `p` whose payload of `len` bytes follows it.
void SealAt(std::uint64_t salt, std::uint8_t type, char* p, std::size_t len) {
  Put32(p + 4, static_cast<std::uint32_t>(len));
  p[8] = static_cast<char>(type);
  Put32(p, Crc32c(ChecksumSeed(salt), p + 8, 1 + len));
}
}  // namespace

void SealFrame(std::uint64_t salt, std::uint8_t type, std::string* frame) {
  SealAt(salt, type, frame->data(), frame->size() - kFrameHeaderSize);
}

void BatchBuilder::Add(std::uint8_t type, std::string_view payload) {
  std::size_t at = buf_.size();
  buf_.resize(at + kFrameHeaderSize + payload.size());
  char* p = buf_.data() + at;
  if (!payload.empty()) std::memcpy(p + kFrameHeaderSize, payload.data(), payload.size());
  SealAt(salt_, type, p, payload.size());
  ++count_;
}

std::string_view BatchBuilder::Finish(std::uint64_t seq,
                                      std::optional<std::uint64_t> synced_through) {
  if (synced_through) {
    char mark[8];
    Put64(mark, *synced_through);
    Add(kSyncMarkFrame, std::string_view(mark, sizeof mark));
  }
  char* p = buf_.data();
  Put32(p, kBatchMagic);
  Put64(p + 8, seq);
  Put32(p + 16, count_);
  Put32(p + 20, static_cast<std::uint32_t>(buf_.size() - kBatchHeaderSize));
  Put32(p + 4, Crc32c(ChecksumSeed(salt_), p + 8, 16));
  return buf_;
}

Result<ScanResult> ScanLog(std::string_view f, std::uint64_t salt, std::uint64_t after_seq,
                           const FrameSink& sink) {
  ScanResult r;
  r.last_seq = after_seq;
  bool marked = false;  // a sync mark was read
  std::size_t pos = kFileHeaderSize;
  r.valid_end = pos;
  while (pos < f.size()) {
    BatchHeader h;
    std::string why;
    bool ok = ReadHeader(f, salt, pos, &h);
    if (!ok) {
      why = "bad batch header";
    } else {
      ok = BatchIntact(f, salt, pos, h, &why);
    }
    if (ok && h.seq != r.last_seq + 1 && r.batches + after_seq != 0) {
      // An intact batch out of sequence was not torn by a crash: something else wrote here.
      r.end = ScanResult::End::kDamaged;
      r.damage_offset = r.resume_offset = pos;
      r.detail = "batch seq " + std::to_string(h.seq) + " after " + std::to_string(r.last_seq);
      return r;
    }
    if (!ok) {
      BatchHeader later;
      std::size_t next = NextHeader(f, salt, pos + 1, r.last_seq, &later);
      r.damage_offset = pos;
      r.detail = why;
      if (next == std::string_view::npos && LooksTorn(f, salt, pos)) {
        r.end = ScanResult::End::kTornTail;
      } else if (std::uint64_t dropped = 0;
                 LostBeforeSync(f, salt, pos, r.last_seq, marked, &dropped)) {
        r.end = ScanResult::End::kTornTail;
        r.unsynced = true;
        r.unsynced_batches = dropped;
      } else if (next == std::string_view::npos) {
        r.end = ScanResult::End::kDamaged;
        r.resume_offset = f.size();
        r.detail += " (a complete batch at the tail that fails its checksum is not a torn write)";
      } else {
        r.end = ScanResult::End::kDamaged;
        r.resume_offset = next;
      }
      return r;
    }
    std::size_t at = pos + kBatchHeaderSize, end = at + h.bytes;
    for (std::uint32_t i = 0; i < h.count; ++i) {
      Frame fr{};
      ReadFrame(f, salt, at, end, &fr, &at);  // holds: the batch is intact
      if (fr.type == kSyncMarkFrame) {
        marked = true;
        continue;
      }
      IDEM_RETURN_IF_ERROR(sink(fr));
      ++r.frames;
    }
    ++r.batches;
    r.last_seq = h.seq;
    pos = end;
    r.valid_end = pos;
  }
  return r;
}

namespace {

// Where the frames after a damaged frame at `at` (before `end`, its batch's end) start, or
// npos. Its checksum failed, but if its length field is plausible and the frame that length
// points to checks out (or the batch ends there, before a batch header or the end of the file),
// the damage is inside its payload and the later frames of the batch can be trusted.
std::size_t PastDamagedFrame(std::string_view f, std::uint64_t salt, std::size_t at,
                             std::size_t end) {
  constexpr std::size_t kNone = std::string_view::npos;
  if (end - at < kFrameHeaderSize) return kNone;
  const std::uint32_t len = Get32(f.data() + at + 4);
  if (len > kMaxFrameBytes || end - at - kFrameHeaderSize < len) return kNone;
  const std::size_t next = at + kFrameHeaderSize + len;
  if (next < end) {
    Frame fr;
    std::size_t after;
    return ReadFrame(f, salt, next, end, &fr, &after) ? next : kNone;
  }
  BatchHeader h;
  return end == f.size() || ReadHeader(f, salt, end, &h) ? next : kNone;
}

// The true length of the damaged frame at `at` (before `end`, its batch's end) when its length
// field is all that is damaged: the length at which its checksum holds and after which the
// batch goes on (a frame that checks out, or the batch's end). The checksum does not cover the
// length, so it is extended a byte at a time over the candidate lengths: one pass over at most
// one frame's bytes. A wrong length passes both checks with probability about 2^-64.
std::optional<std::size_t> TrueLength(std::string_view f, std::uint64_t salt, std::size_t at,
                                      std::size_t end) {
  if (end - at < kFrameHeaderSize) return std::nullopt;
  const std::uint32_t want = Get32(f.data() + at);
  const std::size_t limit = std::min<std::size_t>(end, at + kFrameHeaderSize + kMaxFrameBytes);
  std::uint32_t crc = Crc32c(ChecksumSeed(salt), f.data() + at + 8, 1);  // the type
  for (std::size_t q = at + kFrameHeaderSize;; ++q) {
    if (crc == want) {
      Frame fr;
      std::size_t next;
      if (q == end || ReadFrame(f, salt, q, end, &fr, &next)) return q - at - kFrameHeaderSize;
    }
    if (q == limit) return std::nullopt;
    crc = Crc32c(crc, f.data() + q, 1);
  }
}

}  // namespace

Result<SalvageResult> SalvageLog(std::string_view f, std::uint64_t salt, const FrameSink& sink) {
  constexpr std::size_t kNone = std::string_view::npos;
  SalvageResult r;
  std::size_t pos = kFileHeaderSize;
  // The damaged range being skipped: from `drop_from`, in the batch at `drop_batch`.
  std::size_t drop_from = kNone, drop_batch = kNone;
  std::string drop_what;
  auto drop = [&](std::size_t batch, std::size_t from, std::string what) {
    if (drop_from != kNone) return;
    drop_batch = batch;
    drop_from = from;
    drop_what = std::move(what);
  };
  auto drop_until = [&](std::size_t end) {
    if (drop_from != kNone && end > drop_from) {
      r.damage.push_back({drop_batch, drop_from, end, std::move(drop_what)});
      r.bytes_dropped += end - drop_from;
    }
    drop_from = kNone;
  };
  while (pos < f.size()) {
    BatchHeader h;
    if (!ReadHeader(f, salt, pos, &h)) {
      drop(pos, pos, "bad batch header");
      ++pos;
      continue;
    }
    drop_until(pos);
    r.last_seq = h.seq;
    const std::size_t body = pos + kBatchHeaderSize;
    const std::size_t end = std::min<std::size_t>(f.size(), body + h.bytes);
    std::size_t at = body;
    const bool fits = f.size() - body >= h.bytes;
    bool whole = true;       // every frame checked out as written
    bool lost_rest = !fits;  // the frames from `at` to the batch's end cannot be found
    std::string why = "batch extends past the end of the file";
    std::uint32_t i = 0;
    for (; i < h.count && at < end; ++i) {
      Frame fr;
      std::size_t next;
      if (!ReadFrame(f, salt, at, end, &fr, &next)) {
        whole = false;
        const std::string frame = "frame " + std::to_string(i) + " at offset " + std::to_string(at);
        if (next = PastDamagedFrame(f, salt, at, end); next != kNone) {
          r.damage.push_back({pos, at, next, frame + " fails its checksum"});
          r.bytes_dropped += next - at;
          at = next;
          continue;
        }
        if (auto len = TrueLength(f, salt, at, end)) {
          // Nothing dropped: the frame is read as written, at its true length.
          r.damage.push_back({pos, at, at,
                              frame + ": its length field is damaged; the frame checks out at " +
                                  "its true length " + std::to_string(*len) + " and is kept"});
          fr = Frame{static_cast<std::uint8_t>(f[at + 8]), f.substr(at + kFrameHeaderSize, *len),
                     at};
          next = at + kFrameHeaderSize + *len;
        } else {
          lost_rest = true;
          why = frame + " fails its checksum and its length cannot be trusted, so the batch's " +
                "later frames cannot be found";
          break;
        }
      }
      if (fr.type != kSyncMarkFrame) {
        IDEM_RETURN_IF_ERROR(sink(fr));
        ++r.frames_kept;
      }
      at = next;
    }
    if (!lost_rest && at != end) {
      lost_rest = true;
      why = "batch length does not match its frames";
    }
    if (lost_rest) {
      drop(pos, at, std::move(why));
      pos = at + 1;
      continue;
    }
    if (whole && i == h.count) ++r.batches;
    pos = end;
  }
  // Nothing intact after it (a batch header that reads would have ended the range): a crash's
  // torn last batch when it looks like one.
  r.torn_tail = drop_from != kNone && LooksTorn(f, salt, drop_batch);
  drop_until(f.size());
  return r;
}

}  // namespace idem::log
