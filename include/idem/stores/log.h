// The embedded log store: idem's default. One directory, owned by one process, holding an
// append-only, checksummed log that is replayed into the memory store's compact tables on
// open. Every answer is given only after the change behind it is durable per `sync`:
//
//   kAlways    an answer (Acquired, a completion, a release, and any answer that reads state)
//              is given only after its record is fdatasync'ed; concurrent callers share one
//              sync (group commit). Loses nothing on a process crash or a power failure.
//   kInterval  written before answering, fdatasync'ed every `sync_interval`: loses nothing on a
//              process crash; up to `sync_interval` of answers on a power failure.
//   kNone      written in the background right after answering, never synced by idem: a
//              process crash loses the answers not yet written (the last moments); a power
//              failure, whatever the kernel had not written back.
//
// On open, a torn batch at the tail (a crash mid-write) is cut off with a logged warning;
// damage anywhere else refuses to open with kDataLoss naming the file and offset (use
// VerifyLogStore / RepairLogStore, or `idem store verify|repair DIR`). A write or sync error
// makes the store refuse every call (fail closed) until it is reopened.
#ifndef IDEM_STORES_LOG_H_
#define IDEM_STORES_LOG_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/store.h"

namespace idem {

enum class SyncMode : std::uint8_t { kAlways, kInterval, kNone };

struct LogStoreOptions {
  std::string dir{};  // created if missing
  SyncMode sync = SyncMode::kAlways;
  std::chrono::milliseconds sync_interval{100};  // kInterval only
  Clock* clock = nullptr;                        // nullptr: Clock::System()
  std::size_t max_key_bytes = kDefaultMaxKeyBytes;
  // Above 0, at most 10 years (else OpenLogStore is kInvalidArgument).
  std::chrono::milliseconds abandoned_retention{24 * 3600 * 1000};
  std::chrono::milliseconds reclaim_interval{1000};  // 0: no background reaper
  bool prepare_on_own_thread = false;                // as MemoryStoreOptions says
  std::uint64_t segment_bytes = 64u << 20;           // a new log segment past this size
  // Compaction rewrites the live state when the log is larger than this many times the live
  // data and larger than compact_min_bytes. 0 for compact_ratio turns it off.
  double compact_ratio = 1.5;
  std::uint64_t compact_min_bytes = 64u << 20;
  // Where warnings go (a torn tail cut off on open); default: stderr.
  std::function<void(std::string_view)> warn{};
};

// "log:/var/lib/idem?sync=interval:50" -> options. Accepts sync=always|none|interval:<ms>.
Result<LogStoreOptions> ParseLogStoreUrl(std::string_view url);

// Opens (creating if needed) the store in options.dir. kFailedPrecondition when another
// process holds the directory or the format version differs; kDataLoss for damage.
Result<std::unique_ptr<Store>> OpenLogStore(const LogStoreOptions& options);

// Progress of a long verify/repair: bytes done of total.
using Progress = std::function<void(std::uint64_t done, std::uint64_t total)>;

struct LogCheckReport {
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
  std::uint64_t batches = 0;
  std::uint64_t entries = 0;
  bool torn_tail = false;  // a torn batch at the very end (open cuts it off)
  // The torn tail is batches a power failure lost before a sync covered them (sync=interval or
  // none, see docs/log-store.md): open cuts the newest segment at the first lost one, and the
  // `unsynced_batches` batches after it go too.
  bool lost_unsynced = false;
  std::uint64_t unsynced_batches = 0;
  std::vector<std::string> damage;  // "FILE offset N: what", one per damaged place
  bool ok() const { return damage.empty(); }
};

// Reads every file and checks every checksum without changing anything. Needs the directory
// not to be open by another process.
Result<LogCheckReport> VerifyLogStore(const std::string& dir, const Progress& progress = {});

struct LogRepairReport {
  std::uint64_t entries_kept = 0;
  std::uint64_t bytes_dropped = 0;
  std::vector<std::string> dropped;  // "FILE bytes [a, b)", one per dropped range
  std::string backup;                // where the old files went; empty when there were none
};

// Rewrites the store keeping every intact entry and dropping damaged bytes; reports what it
// dropped. The old files are kept in DIR/repair-backup-<time>/ (-<time>-2/, ... when a repair in
// the same second made that one: each repair's files stay apart).
Result<LogRepairReport> RepairLogStore(const std::string& dir, const Progress& progress = {});

}  // namespace idem

#endif  // IDEM_STORES_LOG_H_
