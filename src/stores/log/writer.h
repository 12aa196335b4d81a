// LogWriter: appends entries to the active segment with group commit.
//
// Callers Append() (cheap: encodes into the pending batch under a mutex) and get a ticket;
// Wait(ticket) returns when the batch holding it is written (sync=none), written and — per
// mode — fdatasync'ed. Whoever waits while no flush runs becomes the flusher for everything
// pending, so N concurrent callers share one write() and one fdatasync.
//
// A write or sync error is sticky: every later Wait and Append fails (kUnavailable for a full
// disk, kDataLoss for an I/O error) until the store is reopened, because what is on disk after
// a failed write or fsync is unknown, and the in-memory state may be ahead of it.
#ifndef IDEM_STORES_LOG_WRITER_H_
#define IDEM_STORES_LOG_WRITER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/codec.h"
#include "stores/log/file_system.h"

namespace idem::log {

using idem::SyncMode;

struct WriterOptions {
  SyncMode sync = SyncMode::kAlways;
  std::chrono::milliseconds sync_interval{100};
  std::uint64_t segment_bytes = 64u << 20;  // start a new segment past this size
};

class LogWriter {
 public:
  // `next_seq` is the seq of the first batch this writer writes; `segment_id` names the
  // active file `dir/<segment_id>.log` (appended to if it exists).
  static Result<std::unique_ptr<LogWriter>> Open(FileSystem& fs, std::string dir,
                                                 std::uint64_t segment_id, std::uint64_t next_seq,
                                                 WriterOptions options);
  ~LogWriter();

  // Adds `e` to the pending batch. Thread-safe; never blocks on I/O.
  std::uint64_t Append(const Entry& e);
  // The ticket of the newest entry appended so far (0: none): a read-only answer waits for it,
  // so it never reports state that is not yet durable.
  std::uint64_t LastTicket() const;
  // Blocks until `ticket` is durable per the sync mode, or the log failed.
  Status Wait(std::uint64_t ticket);
  Status Append(const Entry& e, bool wait) {
    std::uint64_t t = Append(e);
    return wait ? Wait(t) : OkStatus();
  }
  // Non-ok once a write or sync failed.
  Status health() const;

  // Closes the active segment and starts `dir/<segment_id+1>.log`; returns the id of the
  // segment that was closed. Everything appended before the call is in that segment or older.
  Result<std::uint64_t> Rotate();
  std::uint64_t active_segment() const;
  // Bytes written to segment files by this writer (for compaction decisions).
  std::uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  std::uint64_t syncs() const { return syncs_.load(std::memory_order_relaxed); }
  std::uint64_t batches() const { return batches_.load(std::memory_order_relaxed); }

 private:
  LogWriter(FileSystem& fs, std::string dir, WriterOptions options);
  Status FlushLocked(std::unique_lock<std::mutex>& lock);
  Status OpenSegment(std::uint64_t id);
  void SyncLoop();

  FileSystem& fs_;
  const std::string dir_;
  const WriterOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  BatchBuilder pending_;              // guarded by mu_
  BatchBuilder flushing_;             // owned by the flusher
  std::uint64_t next_ticket_ = 1;     // ticket of the next entry; entries of one batch share it
  std::uint64_t pending_ticket_ = 0;  // ticket of the pending batch (0: empty)
  std::uint64_t durable_ = 0;         // every ticket <= durable_ is written (and synced per mode)
  std::uint64_t next_seq_ = 1;
  bool flushing_now_ = false;
  Status failed_;
  std::atomic<bool> failed_flag_{false};  // failed_ is set: lets health() skip the lock
  std::unique_ptr<WritableFile> file_;
  std::uint64_t segment_id_ = 0;

  std::atomic<std::uint64_t> bytes_written_{0};
  std::atomic<std::uint64_t> syncs_{0};
  std::atomic<std::uint64_t> batches_{0};

  // sync=interval: a thread that fdatasyncs every interval.
  bool stop_ = false;
  bool dirty_ = false;
  std::thread syncer_;
};

// "always", "none" or "interval:<ms>".
Result<std::pair<SyncMode, std::chrono::milliseconds>> ParseSyncMode(std::string_view text);

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_WRITER_H_
