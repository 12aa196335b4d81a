#include "stores/log/writer.h"

#include <cstdio>

namespace idem::log {
namespace {

std::string SegmentPath(const std::string& dir, std::uint64_t id) {
  char name[32];
  std::snprintf(name, sizeof name, "%012llu.log", static_cast<unsigned long long>(id));
  return dir + "/" + name;
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
    bool ok = !num.empty() && num.size() <= 9;
    for (char c : num) {
      if (c < '0' || c > '9') ok = false;
      ms = ms * 10 + (c - '0');
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
  if (options.sync == SyncMode::kInterval)
    w->syncer_ = std::thread([p = w.get()] { p->SyncLoop(); });
  return w;
}

LogWriter::~LogWriter() {
  {
    std::unique_lock lock(mu_);
    stop_ = true;
    // Push out whatever is pending so a clean close loses nothing.
    while (flushing_now_) cv_.wait(lock);
    if (failed_.ok() && !pending_.empty()) (void)FlushLocked(lock);
    if (failed_.ok() && file_ != nullptr && options_.sync != SyncMode::kNone) (void)file_->Sync();
  }
  cv_.notify_all();
  if (syncer_.joinable()) syncer_.join();
}

Status LogWriter::OpenSegment(std::uint64_t id) {
  std::string path = SegmentPath(dir_, id);
  auto file = fs_.Append(path);
  if (!file) return file.error();
  if ((*file)->Size() == 0) {
    IDEM_RETURN_IF_ERROR((*file)->Append(FileHeader()));
    IDEM_RETURN_IF_ERROR((*file)->Sync());
  }
  file_ = std::move(*file);
  segment_id_ = id;
  return OkStatus();
}

std::uint64_t LogWriter::Append(const Entry& e) {
  thread_local std::string scratch;
  scratch.clear();
  EncodeEntry(e, &scratch);
  std::lock_guard lock(mu_);
  pending_.Add(static_cast<std::uint8_t>(e.type), scratch);
  if (pending_ticket_ == 0) pending_ticket_ = next_ticket_++;
  return pending_ticket_;
}

std::uint64_t LogWriter::LastTicket() const {
  std::lock_guard lock(mu_);
  return next_ticket_ - 1;
}

Status LogWriter::health() const {
  if (!failed_flag_.load(std::memory_order_acquire)) return OkStatus();
  std::lock_guard lock(mu_);
  return failed_;
}

Status LogWriter::Wait(std::uint64_t ticket) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!failed_.ok()) return failed_;
    if (durable_ >= ticket) return OkStatus();
    if (!flushing_now_ && !pending_.empty()) {
      (void)FlushLocked(lock);
      continue;
    }
    cv_.wait(lock);
  }
}

// Precondition: mu_ held, no flush running, pending_ not empty. Writes (and syncs, per mode)
// the pending batch with the lock released, so appends go on into the next batch.
Status LogWriter::FlushLocked(std::unique_lock<std::mutex>& lock) {
  flushing_now_ = true;
  std::swap(pending_, flushing_);
  const std::uint64_t ticket = pending_ticket_;
  pending_ticket_ = 0;
  const std::uint64_t seq = next_seq_++;
  lock.unlock();

  std::string_view data = flushing_.Finish(seq);
  Status s = file_->Append(data);
  if (s.ok() && options_.sync == SyncMode::kAlways) {
    s = file_->Sync();
    syncs_.fetch_add(1, std::memory_order_relaxed);
  }
  bytes_written_.fetch_add(data.size(), std::memory_order_relaxed);
  batches_.fetch_add(1, std::memory_order_relaxed);
  flushing_.Clear();
  if (s.ok() && file_->Size() >= options_.segment_bytes) {
    if (options_.sync != SyncMode::kNone) s = file_->Sync();
    if (s.ok()) s = OpenSegment(segment_id_ + 1);
  }

  lock.lock();
  flushing_now_ = false;
  if (s.ok()) {
    durable_ = ticket;
    dirty_ = true;
  } else if (failed_.ok()) {
    failed_ = LogFailure(s);
    failed_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return failed_;
}

Result<std::uint64_t> LogWriter::Rotate() {
  std::unique_lock lock(mu_);
  while (flushing_now_) cv_.wait(lock);
  if (!failed_.ok()) return failed_;
  if (!pending_.empty()) IDEM_RETURN_IF_ERROR(FlushLocked(lock));
  while (flushing_now_) cv_.wait(lock);
  std::uint64_t closed = segment_id_;
  Status s = options_.sync != SyncMode::kNone ? file_->Sync() : OkStatus();
  if (s.ok()) s = OpenSegment(segment_id_ + 1);
  if (!s.ok()) {
    failed_ = LogFailure(s);
    failed_flag_.store(true, std::memory_order_release);
    cv_.notify_all();
    return failed_;
  }
  return closed;
}

std::uint64_t LogWriter::active_segment() const {
  std::lock_guard lock(mu_);
  return segment_id_;
}

void LogWriter::SyncLoop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, options_.sync_interval);
    if (stop_ || !dirty_ || flushing_now_ || !failed_.ok()) continue;
    // Hold off flushers while syncing: the file must not be swapped under us.
    flushing_now_ = true;
    dirty_ = false;
    lock.unlock();
    Status s = file_->Sync();
    syncs_.fetch_add(1, std::memory_order_relaxed);
    lock.lock();
    flushing_now_ = false;
    if (!s.ok() && failed_.ok()) {
      failed_ = LogFailure(s);
      failed_flag_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
}

}  // namespace idem::log
