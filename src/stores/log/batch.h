// The log's framing: files of checksummed batches of checksummed frames. No I/O here.
//
//   file   := header batch*
//   header := "IDEMLOG\0" u32 version u64 salt u32 crc32c(first 20 bytes)       (24 bytes)
//   batch  := u32 kBatchMagic u32 crc32c'(seq..bytes) u64 seq u32 count u32 bytes (24 bytes)
//             frame{count}                                      (`bytes` bytes of frames)
//   frame  := u32 crc32c'(type, payload) u32 payload_len u8 type payload
//
// All integers little-endian. crc32c' is CRC-32C seeded with the store's salt (a random
// number chosen when the store is created, the same in every file of a store, and never in
// any answer): bytes written through the store (a response) may hold a well-formed batch, but
// without the salt its checksums do not verify, so no scan takes it for one.
//
// A batch is one group commit: it is written with one write() and
// made durable by one fdatasync, and batch seq numbers grow by one across files. Under
// sync=always only the last batch can be torn by a crash, so a damaged batch followed by an
// intact later batch is real damage, never a torn tail; so is a last batch that is complete
// but fails its checksum without a zeroed sector in its bad frame, or one followed by
// non-zero bytes (a crash cuts a write short or leaves sectors of zeros, possibly between
// sectors that were written, it does not flip bits).
//
// Sync marks (version 3). Under sync=interval and none several batches are written between
// syncs, and a power failure can keep a later one and lose an earlier one (the kernel writes
// pages back in any order). So the writer ends every batch with a sync mark frame (type
// kSyncMarkFrame, payload u64 X): every byte of this file before offset X was on disk
// (fdatasync'ed) when the batch was written. A damaged batch at offset P followed by more
// batches is then a write lost in a power failure, not damage, when a sector where it goes bad
// reads as zeros (never written), every later batch whose mark can be read has it <= P (no
// sync had covered P), and every later batch is intact or goes bad the same way: the scan cuts
// the file at P, dropping the later batches too, which were no more synced than it was.
// Marks are the batch layer's own: ScanLog and SalvageLog never hand them to their sink.
#ifndef IDEM_STORES_LOG_BATCH_H_
#define IDEM_STORES_LOG_BATCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

namespace idem::log {

// Version 1 (no salt) is refused: it was never released. Version 2 (no sync marks) is read;
// new files are version 3.
inline constexpr std::uint32_t kFormatVersion = 3;
inline constexpr std::uint32_t kOldestReadableVersion = 2;
inline constexpr std::size_t kFileHeaderSize = 24;
inline constexpr std::size_t kSaltOffset = 12;  // of the salt in the file header
inline constexpr std::uint32_t kBatchMagic = 0x1DE3B47Cu;
inline constexpr std::size_t kBatchHeaderSize = 24;
inline constexpr std::size_t kFrameHeaderSize = 9;
inline constexpr std::uint32_t kMaxFrameBytes = 64u << 20;
// The frame type of a sync mark; no entry type is this.
inline constexpr std::uint8_t kSyncMarkFrame = 0xFF;

// The CRC-32C seed of the batch and frame checksums of a store with `salt`. Salt 0 gives seed
// 0: plain CRC-32C.
inline std::uint32_t ChecksumSeed(std::uint64_t salt) {
  return static_cast<std::uint32_t>(salt ^ (salt >> 32));
}

std::string FileHeader(std::uint64_t salt);
// The salt of the file that starts with `data`. kFailedPrecondition for a header whose checksum
// holds and that names another format version (version 1's 16-byte header too); kDataLoss for
// any other header, a damaged one included (the checksum is checked before the version is
// believed). `path` names the file in the message.
Result<std::uint64_t> ReadFileHeader(std::string_view data, std::string_view path);
// The salt field of a file whose header ReadFileHeader refused as damaged, when the batch after
// the header is intact under it (so the field is the salt the file was written with); nullopt
// otherwise. For repair, when no file of the store has a good header.
std::optional<std::uint64_t> SaltOfDamagedHeader(std::string_view data);
// The format version of a file whose header ReadFileHeader accepted.
std::uint32_t FileVersion(std::string_view data);
// ReadFileHeader, and kDataLoss when the file's salt is not `salt` (the store's): a file of
// another store.
Status CheckFileHeader(std::string_view data, std::string_view path, std::uint64_t salt);
// The header of one of a store's files, read in order: the first good one gives the store's
// salt (`salt` is set), every later one must have that salt (CheckFileHeader).
Status AdoptOrCheckFileHeader(std::string_view data, std::string_view path,
                              std::optional<std::uint64_t>& salt);

// Makes `*frame` (kFrameHeaderSize bytes of room, then the payload) a whole frame of `type`
// for a store with `salt`: fills in its length and checksum.
void SealFrame(std::uint64_t salt, std::uint8_t type, std::string* frame);

// Builds one batch for a store with `salt`. Reusable after Clear().
class BatchBuilder {
 public:
  explicit BatchBuilder(std::uint64_t salt) : salt_(salt) { Clear(); }
  void Clear();
  void Add(std::uint8_t type, std::string_view payload);
  // Adds `count` frames SealFrame made (with this builder's salt), one after the other in
  // `frames`: a copy, so that a writer can encode and checksum outside its lock.
  void AddSealed(std::string_view frames, std::uint32_t count) {
    buf_.append(frames);
    count_ += count;
  }
  // The whole batch with its header filled in for `seq`; with `synced_through`, ended by a sync
  // mark saying every byte of the file before that offset is on disk. Once per batch: Clear()
  // before the next Add.
  std::string_view Finish(std::uint64_t seq, std::optional<std::uint64_t> synced_through = {});
  std::uint32_t count() const { return count_; }
  bool empty() const { return count_ == 0; }
  std::size_t size() const { return buf_.size(); }

 private:
  std::uint64_t salt_;
  std::string buf_;
  std::uint32_t count_ = 0;
};

struct Frame {
  std::uint8_t type;
  std::string_view payload;
  std::uint64_t offset;  // of the frame in its file
};

struct ScanResult {
  enum class End : std::uint8_t {
    kClean,     // every byte belongs to an intact batch
    kTornTail,  // the bytes after `valid_end` are a last batch cut short, or with sectors
                // left zero, by a crash (then zeros to the end), or (`unsynced`) a batch a
                // power failure lost before it was synced: cut them off
    kDamaged,   // a bad batch at `damage_offset` is followed by intact data, or is a complete
                // last batch whose checksum fails
  };
  End end = End::kClean;
  std::uint64_t valid_end = 0;      // offset just after the last intact batch read in order
  std::uint64_t damage_offset = 0;  // kTornTail/kDamaged: where the first bad batch starts
  std::uint64_t resume_offset = 0;  // kDamaged: where the next intact batch starts
  std::uint64_t last_seq = 0;       // seq of the last intact batch (0: none)
  std::uint64_t batches = 0;
  std::uint64_t frames = 0;
  // kTornTail: the bad batch has intact batches after it, whose sync marks say it was never
  // synced; `unsynced_batches` of them are dropped with it.
  bool unsynced = false;
  std::uint64_t unsynced_batches = 0;
  std::string detail;  // what was wrong at damage_offset
};

using FrameSink = std::function<Status(const Frame&)>;

// Reads a whole file (header included) of a store with `salt` in order and gives every frame of
// every intact batch to `sink`, stopping at the first bad batch; the result says whether what
// follows is a torn tail or damage. A non-ok Status from `sink` stops the scan and is returned.
// Batches must have seq > `after_seq` and consecutive seqs; a gap is damage.
Result<ScanResult> ScanLog(std::string_view file, std::uint64_t salt, std::uint64_t after_seq,
                           const FrameSink& sink);

struct SalvageResult {
  // One damaged place: the bytes [begin, end) are dropped. An empty range drops nothing: a frame
  // whose length field alone is damaged is kept at its true length.
  struct Damage {
    std::uint64_t batch = 0;  // where the damaged batch starts (`begin` when not in a batch)
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
    std::string what;
  };
  std::uint64_t frames_kept = 0;
  std::uint64_t batches = 0;   // batches whose every frame checked out as written
  std::uint64_t last_seq = 0;  // of the last batch whose header reads (0: none)
  std::uint64_t bytes_dropped = 0;
  std::vector<Damage> damage;  // in file order
  // The last damaged range runs to the end of the file and is what a crash leaves of a last
  // batch (as ScanLog's kTornTail): not damage in a store's newest segment.
  bool torn_tail = false;
};

// For repair and verify: gives `sink` every frame whose checksum holds with `salt` anywhere after
// the header, skipping damage, and lists every damaged place. Inside a damaged batch it keeps
// the frames before the damage; past a frame whose checksum fails it goes on where the frame's
// length leads when a frame that checks out is there (the damage was in its payload), or, when
// its length field alone is damaged, keeps it at the length where its checksum holds.
// Otherwise the batch's later frames cannot be found (frames carry no marker to resynchronise
// on): they are dropped up to the next batch header that reads.
Result<SalvageResult> SalvageLog(std::string_view file, std::uint64_t salt, const FrameSink& sink);

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_BATCH_H_
