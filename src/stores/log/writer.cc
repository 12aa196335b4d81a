#include "stores/log/writer.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>

#include "core/thread_name.h"
#include "stores/log/files.h"

namespace idem::log {
namespace {

// Sleeps while `word` holds `expected` (or until any wake; callers re-check).
void FutexWait(std::atomic<std::uint32_t>& word, std::uint32_t expected) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
            nullptr, nullptr, 0);
}

void FutexWakeAll(std::atomic<std::uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
}

// Synced modes keep this much zeroed space reserved ahead of the log's end (see
// WritableFile::Reserve): an fdatasync of a batch then costs one write, not two.
constexpr std::uint64_t kReserveAhead = std::uint64_t{1} << 20;

// Under sync=none no caller waits for a write, so the flusher lets a batch fill for kLinger
// before writing it: one write() and one flusher wake-up per few hundred entries instead of
// per few. What a crash can lose grows by at most kLinger (docs/log-store.md).
constexpr std::chrono::microseconds kLinger{200};

// A moving average that follows changes within a few batches.
std::chrono::nanoseconds Average(std::chrono::nanoseconds avg, std::chrono::nanoseconds sample) {
  return avg.count() == 0 ? sample : (3 * avg + sample) / 4;
}

// Sticky log failures. A full disk is retryable once space is freed (after a reopen); an I/O
// error may have damaged what is on disk.
Status LogFailure(const Status& s) {
  if (s.code() == StatusCode::kResourceExhausted) {
    return UnavailableError("log store failed closed, disk full (" + s.message() +
                            "); free space and reopen the store");
  }
  return DataLossError("log store failed closed after an I/O error (" + s.message() +
                       "); reopen the store to recover what is on disk");
}

}  // namespace

Result<std::pair<SyncMode, std::chrono::milliseconds>> ParseSyncMode(std::string_view text) {
  using Mode = std::pair<SyncMode, std::chrono::milliseconds>;
  if (text == "always") return Mode{SyncMode::kAlways, std::chrono::milliseconds(0)};
  if (text == "none") return Mode{SyncMode::kNone, std::chrono::milliseconds(0)};
  constexpr std::string_view kInterval = "interval:";
  if (text.substr(0, kInterval.size()) == kInterval) {
    std::string_view num = text.substr(kInterval.size());
    std::int64_t ms = 0;
    // At most 9 digits (under 12 days), so ms cannot overflow: a longer number is refused
    // before it is summed.
    bool ok = !num.empty() && num.size() <= 9;
    for (std::size_t i = 0; ok && i < num.size(); ++i) {
      if (num[i] < '0' || num[i] > '9') ok = false;
      ms = ms * 10 + (num[i] - '0');
    }
    if (ok && ms > 0) return Mode{SyncMode::kInterval, std::chrono::milliseconds(ms)};
  }
  return InvalidArgumentError("sync mode \"" + std::string(text) +
                              "\": expected always, none or interval:<ms> with ms > 0");
}

LogWriter::LogWriter(FileSystem& fs, std::string dir, WriterOptions options)
    : fs_(fs), dir_(std::move(dir)), options_(options) {}

Result<std::unique_ptr<LogWriter>> LogWriter::Open(FileSystem& fs, std::string dir,
                                                   std::uint64_t segment_id, std::uint64_t next_seq,
                                                   WriterOptions options) {
  std::unique_ptr<LogWriter> w(new LogWriter(fs, std::move(dir), options));
  w->next_seq_ = next_seq;
  IDEM_RETURN_IF_ERROR(w->OpenSegment(segment_id));
  w->flusher_ = std::thread([p = w.get()] {
    core::NameThisThread("idem-log-flush");
    p->FlusherLoop();
  });
  return w;
}

LogWriter::~LogWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();
}

Status LogWriter::OpenSegment(std::uint64_t id) {
  std::string path = dir_ + "/" + LogFileName(id, /*snapshot=*/false);
  auto file = fs_.Append(path);
  if (!file) return file.error();
  const bool created = (*file)->Size() == 0;
  Status s;
  if (created) s = (*file)->Append(FileHeader(options_.salt));
  // Also when it existed: what recovery kept of it is then known to be on disk (synced_size_),
  // even if a process crash left some of it in the page cache only.
  if (s.ok()) s = (*file)->Sync();
  if (s.ok() && options_.sync != SyncMode::kNone) s = ReserveAhead(**file);
  if (!s.ok()) {
    // A new segment holds nothing yet; left behind, a header that never reached the disk would
    // look like damage after a power failure. Best effort: the store fails closed anyway.
    if (created) {
      file->reset();
      if (fs_.Remove(path).ok()) (void)fs_.SyncDir(dir_);
    }
    return s;
  }
  synced_size_ = (*file)->Size();
  file_ = std::move(*file);
  segment_id_.store(id, std::memory_order_relaxed);
  return OkStatus();
}

Status LogWriter::ReserveAhead(WritableFile& file) {
  Status s = file.Reserve(kReserveAhead);
  // Reserving is ahead of need (so that a sync has no file size to update): a disk without
  // room for it may still hold the next batches, and the store answers until a batch itself
  // finds no space. Failing here failed the store closed with space left, and an open needed
  // 2 MiB free beyond the data (a read-only `idem stats` included).
  if (s.code() == StatusCode::kResourceExhausted) return OkStatus();
  return s;
}

Status LogWriter::SyncFile() {
  IDEM_RETURN_IF_ERROR(file_->Sync());
  synced_size_ = file_->Size();
  return OkStatus();
}

// Why cut: after a failed fdatasync Linux marks the pages it could not write clean but keeps
// them in the page cache. A reopen in this boot would read the failed batch from there, find it
// intact and replay it (a Complete whose caller was told kDataLoss would then be answered as a
// Replay), and append after it; once those pages are evicted, or after a reboot, they read as
// zeros (or as whatever reached the disk) in front of the batches appended later, and the open
// refuses the log as damaged. ftruncate drops the cut bytes from the cache at once, so a reopen
// finds the log ending at `keep` and appends there, overwriting the region. If the cut itself
// does not reach the disk before a power failure, the file keeps its old size and the region
// holds reserved zeros or part of the failed batch with nothing intact after it: a torn tail,
// which the next open cuts off. (Rotating instead would leave the bytes readable in the old
// segment, which is then not the last one, so they would be replayed or refused.)
void LogWriter::CutBack(std::uint64_t keep) {
  if (keep > file_->Size()) return;
  if (file_->Truncate(keep).ok()) {
    // Best effort: after a failed fdatasync the next one normally succeeds (the error is
    // reported once), and makes the cut durable.
    (void)file_->Sync();
  }
}

void LogWriter::Fail(const Status& s) {
  if (failed_.ok()) {
    failed_ = LogFailure(s);
    failed_flag_.store(true, std::memory_order_release);
  }
  WakeWaiters(0);
  WakeWaiters(1);
  space_cv_.notify_all();
  rotate_cv_.notify_all();
}

namespace {
// This thread's HoldWakes() depth, and whether an Append held a wake back meanwhile.
thread_local int hold_depth = 0;
thread_local bool wake_owed = false;
}  // namespace

void LogWriter::HoldWakes() { ++hold_depth; }

void LogWriter::ReleaseWakes() {
  if (--hold_depth > 0 || !wake_owed) return;
  wake_owed = false;
  std::lock_guard lock(mu_);
  work_cv_.notify_one();
}

std::uint64_t LogWriter::Append(const Entry& e, std::uint32_t lane) {
  // The whole frame, checksum included, is made before taking the lane's lock: under it, only
  // a copy.
  thread_local std::string frame;
  frame.assign(kFrameHeaderSize, '\0');
  EncodeEntry(e, &frame);
  // The store refuses what would not fit before the engine changes anything (kMaxResponseBytes):
  // a frame too long to read back would keep the store from opening.
  IDEM_CHECK(frame.size() - kFrameHeaderSize <= kMaxFrameBytes);
  SealFrame(options_.salt, static_cast<std::uint8_t>(e.type), &frame);
  Lane& l = lanes_[lane % kLanes];
  const std::size_t room = options_.max_pending_bytes / kLanes;
  std::unique_lock<core::SpinLock> lock(l.mu);
  while (l.count != 0 && l.frames.size() >= room && !failed_flag_.load(std::memory_order_relaxed)) {
    // Read under the lane's lock: the round that takes these frames counts after it.
    const std::uint64_t seen = rounds_taken_.load(std::memory_order_acquire);
    lock.unlock();
    WaitForRoom(seen);
    lock.lock();
  }
  bool first = false;
  if (l.count == 0) {
    const std::uint64_t was =
        round_.fetch_or(std::uint64_t{1} << (lane % kLanes), std::memory_order_acq_rel);
    l.ticket = was >> kLanes;
    first = (was & kLaneMask) == 0;
  }
  l.frames.append(frame);
  ++l.count;
  const std::uint64_t ticket = l.ticket;
  lock.unlock();
  if (first) WakeFlusher();
  if (options_.sync == SyncMode::kAlways) CountAppended();
  return ticket;
}

void LogWriter::WakeFlusher() {
  if (hold_depth > 0) {
    wake_owed = true;
    return;
  }
  std::lock_guard lock(mu_);
  work_cv_.notify_one();
}

void LogWriter::CountAppended() {
  const std::uint64_t n = appended_.fetch_add(1, std::memory_order_relaxed) + 1;
  auto reached = [&] {
    const std::uint64_t target = back_target_.load(std::memory_order_relaxed);
    return target != 0 && n >= target;
  };
  if (!reached()) return;
  std::lock_guard lock(mu_);
  if (!reached()) return;
  back_at_ = std::chrono::steady_clock::now();
  back_target_.store(0, std::memory_order_relaxed);
  if (gathering_) work_cv_.notify_one();
}

void LogWriter::WaitForRoom(std::uint64_t rounds_seen) {
  std::unique_lock lock(mu_);
  if (wake_owed) {
    // This thread's own held wake may be what the flusher needs to take the lane.
    wake_owed = false;
    work_cv_.notify_one();
  }
  space_cv_.wait(lock, [&] {
    return rounds_taken_.load(std::memory_order_relaxed) != rounds_seen || !failed_.ok() || stop_;
  });
}

Status LogWriter::health() const {
  if (!failed_flag_.load(std::memory_order_acquire)) return OkStatus();
  std::lock_guard lock(mu_);
  return failed_;
}

Status LogWriter::Wait(std::uint64_t ticket) {
  if (options_.sync == SyncMode::kNone) return health();
  std::atomic<std::uint32_t>& word = done_word_[ticket & 1];
  for (;;) {
    const std::uint32_t seen = word.load(std::memory_order_acquire);
    if (durable_.load(std::memory_order_acquire) >= ticket ||
        failed_flag_.load(std::memory_order_acquire)) {
      return health();
    }
    FutexWait(word, seen);
  }
}

void LogWriter::WhenDurable(std::uint64_t ticket, std::function<void(Status)> done) {
  if (options_.sync != SyncMode::kNone && ticket != 0) {
    std::lock_guard lock(mu_);
    if (failed_.ok() && durable_.load(std::memory_order_relaxed) < ticket) {
      if (stop_) {
        // Only a caller racing the store's destruction gets here.
        done(UnavailableError("log store closed"));
        return;
      }
      callbacks_.push_back({ticket, std::move(done)});
      return;
    }
  }
  done(health());
}

std::vector<LogWriter::Callback> LogWriter::TakeDue(bool everything) {
  std::vector<Callback> due;
  if (callbacks_.empty()) return due;
  const std::uint64_t durable = durable_.load(std::memory_order_relaxed);
  const bool all = everything || !failed_.ok();
  auto keep = std::partition(callbacks_.begin(), callbacks_.end(),
                             [&](const Callback& c) { return !all && c.ticket > durable; });
  due.reserve(static_cast<std::size_t>(callbacks_.end() - keep));
  for (auto it = keep; it != callbacks_.end(); ++it) due.push_back(std::move(*it));
  callbacks_.erase(keep, callbacks_.end());
  return due;
}

void LogWriter::CallDue(std::vector<Callback>& due) {
  if (due.empty()) return;
  const Status st = health();
  const std::uint64_t durable = durable_.load(std::memory_order_acquire);
  for (Callback& c : due) {
    if (st.ok() && c.ticket > durable) {
      c.done(UnavailableError("log store closed before the change was written"));
    } else {
      c.done(st);
    }
  }
  due.clear();
}

void LogWriter::RunDue(std::unique_lock<std::mutex>& lock, bool everything) {
  std::vector<Callback> due = TakeDue(everything);
  if (due.empty()) return;
  lock.unlock();
  CallDue(due);
  lock.lock();
}

void LogWriter::WakeWaiters(std::uint64_t ticket) {
  std::atomic<std::uint32_t>& word = done_word_[ticket & 1];
  word.fetch_add(1, std::memory_order_release);
  FutexWakeAll(word);
}

void LogWriter::ExpectCallersBack(std::uint32_t count) {
  // How long the previous batch's callers took; if they are not all back yet, at least this.
  const auto now = std::chrono::steady_clock::now();
  if (woke_at_ != SteadyTime()) {
    back_time_ = Average(back_time_, (back_target_ == 0 ? back_at_ : now) - woke_at_);
  }
  woke_at_ = now;
  back_target_.store(appended_.load(std::memory_order_relaxed) + count, std::memory_order_relaxed);
}

std::uint64_t LogWriter::TakeRound() {
  // Only the flusher changes the round's ticket; appenders only set lane bits.
  const std::uint64_t next = ((round_.load(std::memory_order_relaxed) >> kLanes) + 1) << kLanes;
  const std::uint64_t was = round_.exchange(next, std::memory_order_acq_rel);
  taken_lanes_ = was & kLaneMask;
  for (std::uint32_t i = 0; i < kLanes; ++i) {
    if ((taken_lanes_ & (std::uint64_t{1} << i)) == 0) continue;
    Lane& l = lanes_[i];
    std::lock_guard<core::SpinLock> lane_lock(l.mu);
    taken_[i].frames.swap(l.frames);
    taken_[i].count = l.count;
    l.count = 0;
  }
  rounds_taken_.fetch_add(1, std::memory_order_release);
  space_cv_.notify_all();
  return was >> kLanes;
}

void LogWriter::FillBatch() {
  for (std::uint32_t i = 0; i < kLanes; ++i) {
    if ((taken_lanes_ & (std::uint64_t{1} << i)) == 0) continue;
    flushing_.AddSealed(taken_[i].frames, taken_[i].count);
    taken_[i].frames.clear();
  }
  taken_lanes_ = 0;
}

void LogWriter::Gather(std::unique_lock<std::mutex>& lock) {
  // Waiting for the callers idles the disk for about back_time_ to save a sync; syncing at
  // once overlaps their CPU work with the sync but halves the batch. Measured here (2 cores,
  // 64 callers), waiting wins only when a sync takes over twice the callers' return time.
  if (back_target_ == 0 || flush_time_ <= 2 * back_time_) return;
  gathering_ = true;
  work_cv_.wait_until(lock, woke_at_ + flush_time_, [&] {
    return stop_ || rotate_wanted_ || !failed_.ok() || back_target_ == 0;
  });
  gathering_ = false;
}

void LogWriter::Linger(std::unique_lock<std::mutex>& lock) {
  work_cv_.wait_for(lock, kLinger, [&] { return stop_ || rotate_wanted_ || !failed_.ok(); });
}

void LogWriter::FlusherLoop() {
  using SteadyClock = std::chrono::steady_clock;
  auto next_sync = SteadyClock::now() + options_.sync_interval;
  std::unique_lock lock(mu_);
  for (;;) {
    auto has_work = [&] {
      return stop_ || Pending() || (!failed_.ok() && !callbacks_.empty()) ||
             (rotate_wanted_ && durable_.load(std::memory_order_relaxed) >= rotate_after_);
    };
    if (options_.sync == SyncMode::kInterval && dirty_) {
      work_cv_.wait_until(lock, next_sync, has_work);
    } else {
      work_cv_.wait(lock, has_work);
    }
    if (!failed_.ok()) {
      RunDue(lock);
      if (stop_) return;
      // Nothing more can be written; drop what callers keep appending.
      if (Pending()) TakeRound();
      FillBatch();
      flushing_.Clear();
      continue;
    }
    Status s;
    if (Pending() && options_.sync == SyncMode::kAlways && !stop_) Gather(lock);
    if (Pending() && options_.sync == SyncMode::kNone && !stop_) Linger(lock);
    if (Pending()) {
      const std::uint64_t ticket = TakeRound();
      const std::uint64_t seq = next_seq_++;
      lock.unlock();
      FillBatch();

      const auto started = std::chrono::steady_clock::now();
      const std::uint32_t count = flushing_.count();
      // The mark lets recovery tell a batch a power failure lost before any sync covered it
      // (under interval and none) from damage (batch.h).
      std::string_view data = flushing_.Finish(seq, synced_size_);
      const std::uint64_t start = file_->Size();
      s = file_->Append(data);
      if (!s.ok()) {
        // What was written before this batch stays (under sync=interval and none it may have
        // been answered already); the batch's own bytes go.
        CutBack(start);
      } else if (options_.sync == SyncMode::kAlways) {
        s = SyncFile();
        syncs_.fetch_add(1, std::memory_order_relaxed);
        if (!s.ok()) CutBack(synced_size_);
      } else {
        dirty_ = true;
      }
      bytes_written_.fetch_add(data.size(), std::memory_order_relaxed);
      batches_.fetch_add(1, std::memory_order_relaxed);
      flushing_.Clear();
      if (s.ok() && file_->Size() >= options_.segment_bytes) s = CloseSegment();

      flush_time_ = Average(flush_time_, std::chrono::steady_clock::now() - started);

      lock.lock();
      if (!s.ok()) {
        Fail(s);
        continue;
      }
      durable_.store(ticket, std::memory_order_release);
      // Before the wake, so that what is pending now does not count the woken callers.
      if (options_.sync == SyncMode::kAlways) ExpectCallersBack(count);
      std::vector<Callback> due = TakeDue();
      lock.unlock();
      if (options_.sync != SyncMode::kNone) WakeWaiters(ticket);  // none: nobody waits
      CallDue(due);
      // While the callers just woken come back with their next entries.
      if (options_.sync != SyncMode::kNone) s = ReserveAhead(*file_);
      // Reserve writes zeros, then syncs: after an I/O error only what a good sync covered is
      // known to be on disk.
      if (!s.ok()) CutBack(synced_size_);
      lock.lock();
      if (!s.ok()) {
        Fail(s);
        continue;
      }
    }
    if (options_.sync == SyncMode::kInterval && dirty_ && SteadyClock::now() >= next_sync) {
      lock.unlock();
      s = SyncFile();
      syncs_.fetch_add(1, std::memory_order_relaxed);
      // The batches written since the last good sync were answered already (sync=interval
      // loses them in a power failure too); they may not be on disk, so they go.
      if (!s.ok()) CutBack(synced_size_);
      dirty_ = false;
      next_sync = SteadyClock::now() + options_.sync_interval;
      lock.lock();
      if (!s.ok()) {
        Fail(s);
        continue;
      }
    }
    if (rotate_wanted_ && durable_.load(std::memory_order_relaxed) >= rotate_after_) {
      lock.unlock();
      s = CloseSegment();
      lock.lock();
      rotate_wanted_ = false;
      ++rotations_;
      if (!s.ok()) Fail(s);
      rotate_cv_.notify_all();
    }
    if (stop_ && !Pending()) {
      // Everything appended is durable by now (or the log failed above).
      RunDue(lock, /*everything=*/true);
      if (failed_.ok()) {
        lock.unlock();
        // Best effort: a reopen cuts off reserved zeros left behind anyway.
        Status closed = file_->Trim();
        if (closed.ok() && dirty_ && options_.sync != SyncMode::kNone) closed = SyncFile();
        if (!closed.ok()) CutBack(synced_size_);
        lock.lock();
      }
      return;
    }
  }
}

Status LogWriter::CloseSegment() {
  // Synced under sync=none too (rotation is rare): a segment that is not the last one must be
  // whole after a power failure, because recovery cuts a torn tail off the last segment only
  // and refuses one anywhere else. Without this sync, a power failure after the next segment
  // was created (and its directory entry synced) left this one torn, and the store would not
  // open, where sync=none promises to lose only what the kernel had not written back.
  Status s = file_->Trim();
  if (s.ok()) s = SyncFile();
  if (!s.ok()) {
    CutBack(synced_size_);
    return s;
  }
  dirty_ = false;
  return OpenSegment(segment_id_.load(std::memory_order_relaxed) + 1);
}

Result<std::uint64_t> LogWriter::Rotate() {
  std::unique_lock lock(mu_);
  if (!failed_.ok()) return failed_;
  const std::uint64_t rotations = rotations_;
  rotate_wanted_ = true;
  rotate_after_ = LastTicket();
  work_cv_.notify_one();
  rotate_cv_.wait(lock, [&] { return !failed_.ok() || rotations_ != rotations; });
  if (!failed_.ok()) return failed_;
  // Everything appended before the call is in the segments before the active one (a size
  // based rotation may have happened meanwhile too).
  return segment_id_.load(std::memory_order_relaxed) - 1;
}

std::uint64_t LogWriter::active_segment() const {
  return segment_id_.load(std::memory_order_relaxed);
}

}  // namespace idem::log
