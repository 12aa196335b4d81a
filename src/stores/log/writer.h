// LogWriter: appends entries to the active segment with group commit.
//
// Callers Append() (cheap: encodes, then copies the frame into one of kLanes lanes under that
// lane's spin lock) and get a ticket. One flusher thread takes whatever the lanes hold as one
// batch (a round), writes it with one write() and, under sync=always, one fdatasync, while the
// next round fills up: N concurrent callers share one sync. Appenders share no lock: the store
// passes its shard's number as the lane, so callers on different shards touch different
// lines, and a lane keeps its entries in order (a batch holds the lanes one after the other).
// Waiters sleep on a futex, so waking a batch's callers does not make them queue for a lock. Under
// sync=always the flusher measures how long the callers it wakes take to append their next entries;
// when a sync takes more than twice that, it waits for them before starting the next sync (one big
// group per sync); otherwise it syncs what is pending at once, and the callers' CPU work overlaps
// that sync (two smaller groups that alternate). On this machine each choice is the faster one in
// its regime.
//
// Wait(ticket) returns when the batch holding the ticket is
//   always:   written and fdatasync'ed;
//   interval: written (the flusher fdatasyncs every sync_interval);
//   none:     at once (the flusher writes in the background, within about a millisecond;
//             a process crash loses what was not yet written).
//
// A write or sync error is sticky: every later Wait fails (kUnavailable for a full disk,
// kDataLoss for an I/O error) until the store is reopened, because what is on disk after a
// failed write or fsync is unknown, and the in-memory state may be ahead of it. The active
// segment is then cut back to what is known to be on disk (everything before the failed write;
// after a failed sync, what the last good sync covered), so a reopen never replays a change
// whose callers were told it failed.
#ifndef IDEM_STORES_LOG_WRITER_H_
#define IDEM_STORES_LOG_WRITER_H_

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/spin_lock.h"
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
  // Append blocks while its lane holds a kLanes-th of this, not yet taken (backpressure).
  std::size_t max_pending_bytes = 16u << 20;
  std::uint64_t salt = 0;  // the store's (batch.h): in new segments' headers
};

class LogWriter {
 public:
  // `next_seq` is the seq of the first batch this writer writes; `segment_id` names the
  // active file `dir/<segment_id>.log` (appended to if it exists).
  static Result<std::unique_ptr<LogWriter>> Open(FileSystem& fs, std::string dir,
                                                 std::uint64_t segment_id, std::uint64_t next_seq,
                                                 WriterOptions options);
  // Writes (and syncs, unless sync=none) what is pending, then stops the flusher.
  ~LogWriter();

  // Entries appended in one lane are written in the order they were appended; entries of
  // different lanes may be written in either order.
  static constexpr std::uint32_t kLanes = 16;

  // Adds `e` to the pending round in `lane` (taken modulo kLanes) and returns its ticket.
  // Thread-safe; blocks only when the lane holds max_pending_bytes / kLanes not yet taken.
  std::uint64_t Append(const Entry& e, std::uint32_t lane);
  // A ticket no smaller than that of any entry appended so far (0: none): a read-only answer
  // waits for it, so it never reports state that is not yet durable. Lock-free.
  std::uint64_t LastTicket() const {
    const std::uint64_t s = round_.load(std::memory_order_acquire);
    return (s >> kLanes) - ((s & kLaneMask) == 0 ? 1 : 0);
  }
  // Blocks until `ticket` is durable per the sync mode, or the log failed.
  Status Wait(std::uint64_t ticket);
  // Wait() without blocking: calls `done` with what Wait(ticket) would return, exactly once,
  // at once if that is known already, else on the flusher thread once it is.
  void WhenDurable(std::uint64_t ticket, std::function<void(Status)> done);
  // A batch of Appends from this thread: between HoldWakes() and ReleaseWakes() an Append does
  // not wake the flusher (which would sync the first entry alone and leave the rest for a
  // second sync); ReleaseWakes() does, if one was held back. Call ReleaseWakes() before Wait().
  void HoldWakes();
  void ReleaseWakes();
  // Non-ok once a write or sync failed. Lock-free while healthy.
  Status health() const;

  // Everything appended before the call goes to the active segment, which is then closed
  // (and synced, unless sync=none); later entries go to the next one. Returns the closed
  // segment's id.
  Result<std::uint64_t> Rotate();
  std::uint64_t active_segment() const;
  // Bytes written to segment files by this writer (for compaction decisions).
  std::uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  std::uint64_t syncs() const { return syncs_.load(std::memory_order_relaxed); }
  std::uint64_t batches() const { return batches_.load(std::memory_order_relaxed); }

 private:
  LogWriter(FileSystem& fs, std::string dir, WriterOptions options);
  // Opens (creating it when missing) and syncs segment `id`, then makes it the active one.
  Status OpenSegment(std::uint64_t id);
  // Syncs the active segment; what was appended is then known to be on disk (synced_size_).
  Status SyncFile();
  // Trims and syncs the active segment, then opens the next one (flusher, mu_ not held).
  Status CloseSegment();
  // After a failed write or sync: cuts the active segment back to `keep` bytes (flusher, mu_
  // not held). See the comment in writer.cc.
  void CutBack(std::uint64_t keep);
  void FlusherLoop();
  void Fail(const Status& s);  // mu_ held
  // file.Reserve(kReserveAhead); a disk without room for it is no error.
  static Status ReserveAhead(WritableFile& file);
  struct Callback {
    std::uint64_t ticket;
    std::function<void(Status)> done;
  };
  // Takes the callbacks whose answer is known: ticket durable, or the log failed; with
  // `everything`, all of them (the writer stops) (mu_ held).
  std::vector<Callback> TakeDue(bool everything = false);
  // Calls what TakeDue() took, without mu_.
  void CallDue(std::vector<Callback>& due);
  // TakeDue(everything), then calls them with mu_ released through `lock` (held again after).
  void RunDue(std::unique_lock<std::mutex>& lock, bool everything = false);

  FileSystem& fs_;
  const std::string dir_;
  const WriterOptions options_;

  // Wakes the waiters of `ticket` (and, after a failure, everyone).
  void WakeWaiters(std::uint64_t ticket);
  // Under sync=always, before taking the pending batch: when gathering pays, waits (mu_ held
  // through `lock`) until the callers of the last batch have appended again, or for at most
  // one sync's time.
  void Gather(std::unique_lock<std::mutex>& lock);
  // Under sync=none, before taking the pending batch: lets it fill (mu_ held through `lock`).
  void Linger(std::unique_lock<std::mutex>& lock);
  // After batch of `count` entries became durable and its callers were woken (mu_ held).
  void ExpectCallersBack(std::uint32_t count);
  // Append's slow paths: wake the flusher for a new round (unless this thread holds wakes);
  // under sync=always, count the entry and tell a gathering flusher when the callers are back;
  // wait (lane lock not held) until the flusher has taken a round after `rounds_seen`.
  void WakeFlusher();
  void CountAppended();
  void WaitForRoom(std::uint64_t rounds_seen);
  // Whether a lane holds entries (lock-free).
  bool Pending() const { return (round_.load(std::memory_order_acquire) & kLaneMask) != 0; }
  // Starts a new round and swaps what the lanes held out into taken_ (mu_ held). Returns the
  // ticket of what it took.
  std::uint64_t TakeRound();
  // Copies what TakeRound took into flushing_ (flusher, mu_ not needed).
  void FillBatch();

  static constexpr std::uint64_t kLaneMask = (std::uint64_t{1} << kLanes) - 1;
  struct alignas(64) Lane {
    core::SpinLock mu;
    std::string frames;  // sealed frames, appended in order
    std::uint32_t count = 0;
    std::uint64_t ticket = 0;  // of the round its frames go in: set by the first of them
  };
  std::array<Lane, kLanes> lanes_;
  // (ticket of the round being filled) << kLanes | a bit for each lane holding frames. An
  // appender that makes its lane non-empty sets the lane's bit and reads the round in one
  // fetch_or; the flusher takes a round by exchanging the word for the next round with no bits
  // set, then empties the lanes whose bits it took. So an entry's ticket is the round that
  // writes it.
  alignas(64) std::atomic<std::uint64_t> round_{std::uint64_t{1} << kLanes};
  // Rounds taken, for appenders waiting for room (written under mu_).
  std::atomic<std::uint64_t> rounds_taken_{0};
  // Under sync=always: entries appended, ever; and the count at which the callers woken last
  // are all back (0: not expecting them). back_target_ is written under mu_; appenders read it
  // without mu_ first, so only the one that reaches it takes the lock.
  alignas(64) std::atomic<std::uint64_t> appended_{0};
  std::atomic<std::uint64_t> back_target_{0};
  // Owned by the flusher: the lanes' frames TakeRound swapped out, for FillBatch.
  struct Taken {
    std::string frames;
    std::uint32_t count = 0;
  };
  std::array<Taken, kLanes> taken_;
  std::uint64_t taken_lanes_ = 0;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // the flusher waits for work
  std::condition_variable space_cv_;  // appenders wait for room (a round taken)
  std::condition_variable rotate_cv_;
  // Waiters of ticket t sleep on the futex done_word_[t & 1], which the flusher bumps after
  // publishing durable_ (so a waiter that read the old word value cannot miss the wake).
  std::atomic<std::uint32_t> done_word_[2] = {0, 0};
  std::vector<Callback> callbacks_;  // WhenDurable's, not yet due; guarded by mu_
  // Gathering (sync=always). The callers of the last batch are back when appended_ reaches
  // back_target_; Append notes when (back_at_), so the flusher learns how long they take
  // (back_time_) even when it does not wait for them. Guarded by mu_.
  using SteadyTime = std::chrono::steady_clock::time_point;
  SteadyTime woke_at_;
  SteadyTime back_at_;
  bool gathering_ = false;                  // the flusher waits in Gather
  std::chrono::nanoseconds back_time_{0};   // flusher: moving average of callers' return time
  std::chrono::nanoseconds flush_time_{0};  // flusher: moving average of write + sync
  std::atomic<std::uint64_t> durable_{0};   // written by the flusher; every ticket <= it is durable
  std::uint64_t next_seq_ = 1;
  bool stop_ = false;
  bool rotate_wanted_ = false;
  std::uint64_t rotate_after_ = 0;  // rotate once this ticket is durable
  std::uint64_t rotations_ = 0;
  Status failed_;
  std::atomic<bool> failed_flag_{false};  // failed_ is set: lets health() skip the lock

  // Owned by the flusher thread (and by Open/the destructor when it does not run).
  std::unique_ptr<WritableFile> file_;
  std::atomic<std::uint64_t> segment_id_{0};
  BatchBuilder flushing_{options_.salt};
  bool dirty_ = false;  // written since the last sync
  // Bytes of file_ known to be on disk: its size at its last successful sync.
  std::uint64_t synced_size_ = 0;

  std::atomic<std::uint64_t> bytes_written_{0};
  std::atomic<std::uint64_t> syncs_{0};
  std::atomic<std::uint64_t> batches_{0};
  std::thread flusher_;
};

// "always", "none" or "interval:<ms>".
Result<std::pair<SyncMode, std::chrono::milliseconds>> ParseSyncMode(std::string_view text);

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_WRITER_H_
