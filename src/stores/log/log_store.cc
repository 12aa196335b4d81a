// The embedded log store: the memory store's engine with a journal that appends every change
// to a checksummed log (group commit), replays the log on open, and compacts it in the
// background. See include/idem/stores/log.h for the durability contract.
#include "idem/stores/log.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/journal.h"
#include "core/thread_name.h"
#include "stores/log/batch.h"
#include "stores/log/codec.h"
#include "stores/log/file_system.h"
#include "stores/log/files.h"
#include "stores/log/log_store_internal.h"
#include "stores/log/writer.h"
#include "stores/memory/engine.h"

namespace idem {
namespace log {
namespace {

using memory_internal::Engine;

// The store as a Journal for the engine: every change goes to the log writer.
class LogJournal final : public core::Journal {
 public:
  void Attach(LogWriter* w) { writer_ = w; }
  std::uint64_t Record(const core::Change& c, std::uint32_t lane) override {
    return writer_ != nullptr ? writer_->Append(c, lane) : 0;
  }
  std::uint64_t Last() override { return writer_ != nullptr ? writer_->LastTicket() : 0; }
  Status Wait(std::uint64_t ticket) override {
    if (deferring == this) {
      deferred_ticket = std::max(deferred_ticket, ticket);
      return health();
    }
    return writer_ != nullptr && ticket != 0 ? writer_->Wait(ticket) : OkStatus();
  }

  // While one lives, this thread's Wait()s on `journal` do not block: they note the ticket,
  // and the caller hands ticket() to LogWriter::WhenDurable instead. The engine's answers
  // must then not be given before that says so.
  class Deferred {
   public:
    explicit Deferred(LogJournal& journal) {
      deferring = &journal;
      deferred_ticket = 0;
    }
    ~Deferred() { deferring = nullptr; }
    Deferred(const Deferred&) = delete;
    Deferred& operator=(const Deferred&) = delete;
    std::uint64_t ticket() const { return deferred_ticket; }
  };
  Status health() override { return writer_ != nullptr ? writer_->health() : OkStatus(); }
  void BeginGroup() override {
    if (writer_ != nullptr) writer_->HoldWakes();
  }
  void EndGroup() override {
    if (writer_ != nullptr) writer_->ReleaseWakes();
  }

 private:
  static thread_local LogJournal* deferring;
  static thread_local std::uint64_t deferred_ticket;
  LogWriter* writer_ = nullptr;
};

// static
thread_local LogJournal* LogJournal::deferring = nullptr;
thread_local std::uint64_t LogJournal::deferred_ticket = 0;

// An answer that depended on a write that failed is that failure instead.
template <typename T>
void FailAnswered(std::vector<Result<T>>& answers, const Status& failure) {
  for (Result<T>& a : answers) {
    if (a.has_value()) a = failure;
  }
}

// A response longer than the log can read back (kMaxResponseBytes) is refused before the
// engine sees it, so the change is neither made in memory nor written.
Status CheckResponse(std::string_view response) {
  if (response.size() <= kMaxResponseBytes) [[likely]] {
    return OkStatus();
  }
  return InvalidArgumentError(
      "response is " + std::to_string(response.size()) + " bytes; the log store holds at most " +
      std::to_string(kMaxResponseBytes) + " (its " + std::to_string(kMaxFrameBytes >> 20) +
      " MiB record frame less the record's other fields)");
}

// The completions of a batch that the log can hold, and the errors of those it cannot.
struct Screened {
  std::vector<Status> errors;         // per request: OK, or why it is refused
  std::vector<CompleteRequest> kept;  // the requests that fit, in order
};

// nullopt when every completion fits (the usual case: nothing is copied).
std::optional<Screened> Screen(std::span<const CompleteRequest> reqs) {
  if (std::all_of(reqs.begin(), reqs.end(),
                  [](const CompleteRequest& r) { return CheckResponse(r.response).ok(); })) {
    return std::nullopt;
  }
  Screened s;
  for (const CompleteRequest& r : reqs) {
    s.errors.push_back(CheckResponse(r.response));
    if (s.errors.back().ok()) s.kept.push_back(r);
  }
  return s;
}

// The answers to `s.kept` put back in place among the refusals.
std::vector<Result<WriteAnswer>> Merge(const Screened& s,
                                       std::vector<Result<WriteAnswer>> kept_answers) {
  std::vector<Result<WriteAnswer>> out;
  out.reserve(s.errors.size());
  std::size_t next = 0;
  for (const Status& e : s.errors) {
    if (e.ok()) {
      out.push_back(std::move(kept_answers[next++]));
    } else {
      out.push_back(e);
    }
  }
  return out;
}

struct Recovered {
  std::uint64_t snapshot_id = 0;        // 0: none
  std::vector<std::uint64_t> segments;  // ids after the snapshot, ascending
  std::uint64_t last_seq = 0;
  std::uint64_t max_token = 0;
  std::uint64_t disk_bytes = 0;
  std::uint64_t snapshot_bytes = 0;
  // The newest segment's format version: one older than this build's is not appended to (its
  // header would not say what its new batches hold).
  std::uint32_t last_segment_version = kFormatVersion;
};

constexpr std::size_t kLogStoreShards = 64;

// Replays one file's entries into the engine on two threads: the thread that scans the file
// reads, checks and decodes, and a helper applies the entries in the order they were handed
// over (about a quarter and three quarters of a serial replay's time here). An entry's string
// views point into the file, so Finish() must come before the file goes.
class PipelinedReplay {
 public:
  explicit PipelinedReplay(Engine& engine) : engine_(engine) {
    helper_ = std::thread([this] {
      core::NameThisThread("idem-log-open");
      Run();
    });
  }
  ~PipelinedReplay() { (void)Finish(); }
  PipelinedReplay(const PipelinedReplay&) = delete;
  PipelinedReplay& operator=(const PipelinedReplay&) = delete;

  Status Add(const Entry& e) {
    chunk_.push_back(e);
    return chunk_.size() < kChunk ? OkStatus() : Hand();
  }
  // Hands over what is left and waits until the helper applied it; the first error of either
  // thread.
  Status Finish() {
    if (!helper_.joinable()) return error();
    Status s = chunk_.empty() ? OkStatus() : Hand();
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    work_cv_.notify_one();
    helper_.join();
    return s.ok() ? error() : s;
  }

 private:
  static constexpr std::size_t kChunk = 512;
  static constexpr std::size_t kMaxQueued = 8;

  Status error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  Status Hand() {
    std::unique_lock lock(mu_);
    room_cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || !error_.ok(); });
    if (!error_.ok()) return error_;
    queue_.push_back(std::move(chunk_));
    chunk_ = TakeSpare();
    work_cv_.notify_one();
    return OkStatus();
  }
  std::vector<Entry> TakeSpare() {  // mu_ held
    std::vector<Entry> v;
    if (!spare_.empty()) {
      v = std::move(spare_.back());
      spare_.pop_back();
    }
    v.clear();
    v.reserve(kChunk);
    return v;
  }
  void Run() {
    std::vector<Entry> chunk;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        if (!chunk.empty()) spare_.push_back(std::move(chunk));
        work_cv_.wait(lock, [&] { return !queue_.empty() || done_; });
        if (queue_.empty()) return;
        chunk = std::move(queue_.front());
        queue_.pop_front();
      }
      room_cv_.notify_one();
      for (const Entry& e : chunk) {
        Status s = engine_.Apply(e);
        if (s.ok()) continue;
        std::lock_guard lock(mu_);
        error_ = std::move(s);
        room_cv_.notify_all();
        return;
      }
    }
  }

  Engine& engine_;
  std::vector<Entry> chunk_;  // the scanning thread's, not yet handed over
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable room_cv_;
  std::deque<std::vector<Entry>> queue_;   // guarded by mu_
  std::vector<std::vector<Entry>> spare_;  // guarded by mu_
  bool done_ = false;                      // guarded by mu_
  Status error_;                           // guarded by mu_: the helper's
  std::thread helper_;
};

class LogStore final : public Store {
 public:
  LogStore(LogStoreOptions options, FileSystem& fs) : options_(std::move(options)), fs_(fs) {}
  ~LogStore() override;

  Status Open();

  std::string_view Name() const override { return "log"; }
  Status Broken() const override { return writer_ != nullptr ? writer_->health() : OkStatus(); }
  Result<BeginAnswer> Begin(const BeginRequest& r) override { return After(engine_->Begin(r)); }
  Result<WriteAnswer> Complete(const CompleteRequest& r) override {
    IDEM_RETURN_IF_ERROR(CheckResponse(r.response));
    return After(engine_->Complete(r));
  }
  Result<WriteAnswer> Release(std::string_view s, std::string_view k, Token t) override {
    return After(engine_->Release(s, k, t));
  }
  Result<WriteAnswer> Extend(std::string_view s, std::string_view k, Token t,
                             std::chrono::milliseconds lease) override {
    return After(engine_->Extend(s, k, t, lease));
  }
  std::vector<Result<BeginAnswer>> BeginBatch(std::span<const BeginRequest> r) override {
    return After(engine_->BeginBatch(r));
  }
  std::vector<Result<WriteAnswer>> ExtendBatch(std::span<const ExtendRequest> r) override {
    return After(engine_->ExtendBatch(r));
  }
  std::vector<Result<WriteAnswer>> CompleteBatch(std::span<const CompleteRequest> r) override {
    std::optional<Screened> screened = Screen(r);
    if (!screened) return After(engine_->CompleteBatch(r));
    return After(Merge(*screened, engine_->CompleteBatch(screened->kept)));
  }
  // The engine decides on this thread, without waiting; the flusher hands the answers over
  // once the changes behind them (or the state they read) are durable, failing them all if
  // that cannot be. Begins and completes are one group: one sync for both.
  bool StartBatch(std::span<const BeginRequest> begins, std::span<const CompleteRequest> completes,
                  std::function<void(BatchAnswers)> done) override {
    std::shared_ptr<BatchAnswers> answers;
    std::uint64_t ticket = 0;
    std::optional<Screened> screened = Screen(completes);
    {
      LogJournal::Deferred deferred(journal_);
      journal_.BeginGroup();
      answers = std::make_shared<BatchAnswers>(memory_internal::CompleteThenBegin(
          *engine_, begins,
          screened ? std::span<const CompleteRequest>(screened->kept) : completes));
      journal_.EndGroup();
      ticket = deferred.ticket();
    }
    if (screened) answers->completes = Merge(*screened, std::move(answers->completes));
    MaybeCompact();
    writer_->WhenDurable(ticket, [answers = std::move(answers),
                                  done = std::move(done)](const Status& durable) mutable {
      if (!durable.ok()) {
        FailAnswered(answers->begins, durable);
        FailAnswered(answers->completes, durable);
      }
      done(std::move(*answers));
    });
    return true;
  }
  Result<std::optional<Record>> Get(std::string_view s, std::string_view k) override {
    return engine_->Get(s, k);
  }
  Result<std::vector<Record>> List(const ListFilter& f) override { return engine_->List(f); }
  Result<bool> Erase(std::string_view s, std::string_view k) override {
    return engine_->Erase(s, k);
  }
  Result<StoreStats> Stats() override;
  Result<std::uint64_t> Purge() override;
  Result<SessionInfo> OpenSession(const SessionRequest& r) override {
    return engine_->OpenSession(r);
  }
  Result<BeginAnswer> BeginSequenced(const SequencedBeginRequest& r) override {
    return engine_->BeginSequenced(r);
  }
  Result<WriteAnswer> CompleteSequenced(const SequencedCompleteRequest& r) override {
    IDEM_RETURN_IF_ERROR(CheckResponse(r.response));
    return After(engine_->CompleteSequenced(r));
  }
  Result<WriteAnswer> ReleaseSequenced(std::string_view s, std::string_view c, std::uint64_t q,
                                       Token t) override {
    return engine_->ReleaseSequenced(s, c, q, t);
  }
  Result<SessionInfo> Acknowledge(std::string_view s, std::string_view c,
                                  std::uint64_t ack) override {
    return engine_->Acknowledge(s, c, ack);
  }
  Result<BeginAnswer> BeginVersioned(const VersionedBeginRequest& r) override {
    return engine_->BeginVersioned(r);
  }
  Result<WriteAnswer> CompleteVersioned(const VersionedCompleteRequest& r) override {
    return After(engine_->CompleteVersioned(r));
  }
  Result<WriteAnswer> ReleaseVersioned(std::string_view s, std::string_view e, Token t) override {
    return engine_->ReleaseVersioned(s, e, t);
  }
  Result<std::optional<EntityVersion>> GetVersion(std::string_view s, std::string_view e) override {
    return engine_->GetVersion(s, e);
  }

  // Rewrites the live state into a snapshot and drops the segments it covers. Callers are
  // held off only per engine slice.
  Status Compact();

 private:
  template <typename T>
  T After(T result) {
    MaybeCompact();
    return result;
  }
  // The log's size on disk: the base (snapshot and segments) plus what the writer added since.
  std::uint64_t DiskBytes() const {
    return base_bytes_.load(std::memory_order_relaxed) + writer_->bytes_written() -
           written_at_base_.load(std::memory_order_relaxed);
  }
  void MaybeCompact();
  void CompactionLoop();
  // Whether the log really outgrew the live data (see CompactionLoop).
  bool StillOutgrown();
  Status Recover(Recovered* rec);
  // Replays one file into the engine; returns its size after any torn tail was cut off.
  Result<std::uint64_t> ReplayFile(const std::string& name, bool is_last, bool is_snapshot,
                                   std::uint64_t* last_seq, std::uint64_t* max_token,
                                   std::uint32_t* version);
  std::string Path(std::string_view name) const { return options_.dir + "/" + std::string(name); }
  void Warn(const std::string& msg) const {
    if (options_.warn) {
      options_.warn(msg);
    } else {
      std::fprintf(stderr, "idem log store: %s\n", msg.c_str());
    }
  }

  LogStoreOptions options_;
  FileSystem& fs_;
  std::unique_ptr<DirLock> lock_;
  LogJournal journal_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<LogWriter> writer_;
  // The salt of the store's files (batch.h): read from the first file replayed, or chosen for
  // a new store; set before the writer and the compactor start.
  std::optional<std::uint64_t> salt_;

  // Compaction: a background thread woken when the log outgrows the live data.
  std::mutex compact_mu_;
  std::condition_variable compact_cv_;
  bool compact_wanted_ = false;
  bool stop_ = false;
  std::thread compactor_;
  std::atomic<std::uint64_t> base_bytes_{0};       // snapshot + segments at the last check point
  std::atomic<std::uint64_t> written_at_base_{0};  // writer bytes at that point
  std::atomic<std::uint64_t> live_bytes_{0};       // the live data's size, as last estimated
  std::uint64_t snapshot_id_ = 0;                  // guarded by compacting_
  // Size of the last snapshot and how many things (records, sessions, entities) it held; 0
  // things: no snapshot since open. Guarded by compacting_.
  std::uint64_t snapshot_bytes_ = 0;
  std::uint64_t snapshot_things_ = 0;
  std::mutex compacting_;
};

LogStore::~LogStore() {
  {
    std::lock_guard g(compact_mu_);
    stop_ = true;
  }
  compact_cv_.notify_all();
  if (compactor_.joinable()) compactor_.join();
  // The engine stops its reaper first, then the writer flushes what is pending.
  engine_.reset();
  writer_.reset();
}

Result<std::uint64_t> LogStore::ReplayFile(const std::string& name, bool is_last, bool is_snapshot,
                                           std::uint64_t* last_seq, std::uint64_t* max_token,
                                           std::uint32_t* version) {
  const std::string path = Path(name);
  auto file = fs_.Read(path);
  if (!file) return file.error();
  std::string_view data = (*file)->Data();
  if (is_last && !is_snapshot && data.size() < kFileHeaderSize) {
    // Created, but the crash came before its header was complete: nothing was in it.
    Warn(path + ": incomplete header of the newest segment (" + std::to_string(data.size()) +
         " bytes), removed");
    file->reset();
    IDEM_RETURN_IF_ERROR(fs_.Remove(path));
    return std::uint64_t{0};
  }
  // The first file replayed gives the store's salt; every later one must have it too.
  if (Status h = AdoptOrCheckFileHeader(data, path, salt_); !h.ok()) {
    if (h.code() != StatusCode::kDataLoss) return h;  // another format version
    return DataLossError(h.message() + ". Run `idem store verify " + options_.dir +
                         "`, then `idem store repair " + options_.dir + "`");
  }
  *version = FileVersion(data);
  Entry e;
  PipelinedReplay apply(*engine_);
  auto scan = ScanLog(data, *salt_, is_snapshot ? 0 : *last_seq, [&](const Frame& f) -> Status {
    Status s = DecodeEntry(f.type, f.payload, &e);
    if (!s.ok()) {
      return DataLossError(path + " offset " + std::to_string(f.offset) + ": " + s.message());
    }
    std::uint64_t token = e.type == EntryType::kTokenFloor  ? e.token_floor
                          : e.type == EntryType::kEntityPut ? e.entity.token
                                                            : e.record.token;
    if (e.type == EntryType::kTokenFloor || e.type == EntryType::kRecordPut ||
        e.type == EntryType::kSeqPut || e.type == EntryType::kEntityPut) {
      *max_token = std::max(*max_token, token);
    }
    return apply.Add(e);
  });
  const Status applied = apply.Finish();
  if (!scan) return scan.error();
  IDEM_RETURN_IF_ERROR(applied);
  using End = ScanResult::End;
  if (scan->end == End::kDamaged || (scan->end == End::kTornTail && (!is_last || is_snapshot))) {
    return DataLossError(path + " offset " + std::to_string(scan->damage_offset) + ": " +
                         scan->detail +
                         "; this is damage, not a torn write. Run `idem store verify " +
                         options_.dir + "`, then `idem store repair " + options_.dir + "`");
  }
  if (scan->end == End::kTornTail) {
    const std::string_view tail = data.substr(scan->valid_end);
    if (scan->unsynced) {
      Warn(path + " offset " + std::to_string(scan->damage_offset) +
           ": a batch lost in a power failure before any sync covered it (" + scan->detail +
           "), and the " + std::to_string(scan->unsynced_batches) +
           " intact batches written after it and no more synced, " + std::to_string(tail.size()) +
           " bytes, cut off: sync=interval and sync=none lose what was not yet synced");
    } else if (tail.find_first_not_of('\0') == std::string_view::npos) {
      Warn(path + " offset " + std::to_string(scan->valid_end) + ": " +
           std::to_string(tail.size()) +
           " zero bytes after the last batch (space reserved ahead of the log, or blocks a " +
           "crash left unwritten) cut off; nothing in them was acknowledged");
    } else {
      Warn(path + " offset " + std::to_string(scan->damage_offset) + ": torn batch at the tail (" +
           scan->detail + ", " + std::to_string(tail.size()) +
           " bytes) cut off; it was never acknowledged");
    }
    file->reset();
    IDEM_RETURN_IF_ERROR(fs_.Truncate(path, scan->valid_end));
  }
  if (!is_snapshot) *last_seq = scan->last_seq;
  return std::uint64_t{scan->end == End::kTornTail ? scan->valid_end : data.size()};
}

Status LogStore::Recover(Recovered* rec) {
  auto files = ListLogFiles(fs_, options_.dir);
  if (!files) return files.error();
  for (const std::string& t : files->temporary) {
    IDEM_RETURN_IF_ERROR(fs_.Remove(Path(t)));  // an unfinished compaction
  }
  if (const std::string missing = files->Missing(); !missing.empty()) {
    return DataLossError(options_.dir + ": " + missing + "; the records in " +
                         "what is missing are lost. Run `idem store verify " + options_.dir +
                         "`, then `idem store repair " + options_.dir + "`");
  }
  const std::vector<LogFile> replay = files->ReplayOrder();
  // Segment seqs continue across files; the first segment after a snapshot starts anew.
  std::uint64_t last_seq = 0;
  for (std::size_t i = 0; i < replay.size(); ++i) {
    const LogFile& f = replay[i];
    std::uint32_t version = kFormatVersion;
    auto bytes = ReplayFile(f.name, i + 1 == replay.size(), f.snapshot, &last_seq, &rec->max_token,
                            &version);
    if (!bytes) return bytes.error();
    rec->disk_bytes += *bytes;
    if (f.snapshot) {
      rec->snapshot_id = f.id;
      rec->snapshot_bytes = *bytes;
    } else {
      rec->segments.push_back(f.id);
      rec->last_segment_version = version;
    }
  }
  rec->last_seq = last_seq;
  // Leftovers of a compaction that stopped after writing its snapshot.
  for (const LogFile& f : files->snapshots) {
    if (f.id < rec->snapshot_id) IDEM_RETURN_IF_ERROR(fs_.Remove(Path(f.name)));
  }
  for (const LogFile& f : files->segments) {
    if (f.id <= rec->snapshot_id) IDEM_RETURN_IF_ERROR(fs_.Remove(Path(f.name)));
  }
  return OkStatus();
}

Status LogStore::Open() {
  IDEM_RETURN_IF_ERROR(fs_.CreateDir(options_.dir));
  auto lock = fs_.Lock(options_.dir + "/LOCK");
  if (!lock) return lock.error();
  lock_ = std::move(*lock);

  MemoryStoreOptions mem;
  mem.clock = options_.clock;
  // A longer key (or client id, or entity) could not be read back from the log.
  mem.max_key_bytes = std::min(options_.max_key_bytes, kMaxNameBytes);
  mem.abandoned_retention = options_.abandoned_retention;
  // Tokens carry their shard in their low bits, so the shard count must never change for a
  // store's data: it is fixed.
  mem.shards = kLogStoreShards;
  mem.reclaim_interval = options_.reclaim_interval;
  mem.prepare_on_own_thread = options_.prepare_on_own_thread;
  engine_ = Engine::Create(mem, &journal_);

  Recovered rec;
  IDEM_RETURN_IF_ERROR(Recover(&rec));
  if (!salt_) salt_ = NewSalt();  // a new store (or one whose only file held nothing)
  // Replay kept whatever a later image could still have refreshed; what is expired now goes.
  auto reclaimed = engine_->Purge();
  if (!reclaimed) return reclaimed.error();
  engine_->RaiseTokenFloor(rec.max_token);
  snapshot_id_ = rec.snapshot_id;

  std::uint64_t segment = rec.segments.empty() ? rec.snapshot_id + 1 : rec.segments.back();
  // A segment of an older format is left as it is: new batches go to a new file, whose header
  // names what they hold, so a build of that older format refuses the store by its version
  // instead of misreading the new batches as damage.
  if (!rec.segments.empty() && rec.last_segment_version < kFormatVersion) ++segment;
  WriterOptions w;
  w.sync = options_.sync;
  w.sync_interval = options_.sync_interval;
  w.segment_bytes = options_.segment_bytes;
  w.salt = *salt_;
  auto writer = LogWriter::Open(fs_, options_.dir, segment, rec.last_seq + 1, w);
  if (!writer) return writer.error();
  writer_ = std::move(*writer);
  journal_.Attach(writer_.get());

  live_bytes_ = rec.snapshot_bytes;
  base_bytes_ = rec.disk_bytes;
  written_at_base_ = 0;
  if (options_.compact_ratio > 0)
    compactor_ = std::thread([this] {
      core::NameThisThread("idem-compact");
      CompactionLoop();
    });
  return OkStatus();
}

void LogStore::MaybeCompact() {
  if (options_.compact_ratio <= 0) return;
  const std::uint64_t disk = DiskBytes();
  auto limit =
      static_cast<std::uint64_t>(options_.compact_ratio * static_cast<double>(live_bytes_.load()));
  if (disk < options_.compact_min_bytes || disk < limit) return;
  std::lock_guard g(compact_mu_);
  if (!compact_wanted_) {
    compact_wanted_ = true;
    compact_cv_.notify_one();
  }
}

void LogStore::CompactionLoop() {
  std::unique_lock lock(compact_mu_);
  for (;;) {
    compact_cv_.wait(lock, [&] { return stop_ || compact_wanted_; });
    if (stop_) return;
    lock.unlock();
    if (StillOutgrown()) {
      Status s = Compact();
      if (!s.ok()) Warn("compaction failed: " + s.ToString());
    }
    lock.lock();
    compact_wanted_ = false;
  }
}

// MaybeCompact compares the log with the last snapshot's size, so every record written since
// counts as garbage until a compaction proves otherwise; when most new records are new keys
// (they still live), compacting then would only rewrite them. Here, off the callers' path, the
// live data is estimated as the last snapshot's bytes per thing times the things the engine
// holds now, and the log is compacted only if it outgrew that too. If not, the estimate
// becomes the live size that MaybeCompact compares with, so the next check comes when the
// log has grown by compact_ratio times it again.
bool LogStore::StillOutgrown() {
  std::uint64_t snap_bytes = 0;
  std::uint64_t snap_things = 0;
  {
    std::lock_guard g(compacting_);
    snap_bytes = snapshot_bytes_;
    snap_things = snapshot_things_;
  }
  if (snap_things == 0) return true;
  auto stats = engine_->Stats();
  if (!stats) return true;
  const std::uint64_t things =
      stats->in_progress + stats->completed + stats->sessions + stats->entities;
  const auto live =
      static_cast<std::uint64_t>(static_cast<double>(snap_bytes) * static_cast<double>(things) /
                                 static_cast<double>(snap_things));
  const std::uint64_t disk = DiskBytes();
  if (static_cast<double>(disk) >= options_.compact_ratio * static_cast<double>(live)) return true;
  live_bytes_ = live;
  return false;
}

Status LogStore::Compact() {
  // Purge() and the background thread may both want to compact; one at a time.
  std::lock_guard one_at_a_time(compacting_);
  auto closed = writer_->Rotate();
  if (!closed) return closed.error();
  const std::uint64_t written_then = writer_->bytes_written();
  const std::string tmp = Path(LogFileName(*closed, /*snapshot=*/true) + ".tmp");
  auto out = fs_.Append(tmp);
  if (!out) return out.error();
  Status s = (*out)->Append(FileHeader(*salt_));
  BatchBuilder batch(*salt_);
  std::uint64_t seq = 0;
  std::string scratch;
  auto flush = [&]() -> Status {
    if (batch.empty()) return OkStatus();
    Status st = (*out)->Append(batch.Finish(++seq));
    batch.Clear();
    return st;
  };
  std::uint64_t things = 0;
  auto add = [&](const core::Change& c) -> Status {
    if (c.type != core::ChangeType::kTokenFloor) ++things;
    scratch.clear();
    EncodeEntry(c, &scratch);
    batch.Add(static_cast<std::uint8_t>(c.type), scratch);
    return batch.size() >= (1u << 20) ? flush() : OkStatus();
  };
  // Tokens of records that were released or erased are gone from the snapshot; the floor
  // keeps every later token above them.
  core::Change floor;
  floor.type = core::ChangeType::kTokenFloor;
  floor.token_floor = engine_->MaxToken();
  if (s.ok()) s = add(floor);
  if (s.ok()) s = engine_->Snapshot(add);
  if (s.ok()) s = flush();
  if (s.ok()) s = (*out)->Sync();
  std::uint64_t snap_bytes = (*out)->Size();
  out->reset();
  const std::string snap = Path(LogFileName(*closed, /*snapshot=*/true));
  if (s.ok()) s = fs_.Rename(tmp, snap);
  if (s.ok()) s = fs_.SyncDir(options_.dir);
  if (!s.ok()) {
    (void)fs_.Remove(tmp);
    return s;
  }
  // The snapshot now covers every segment up to `closed`.
  auto files = ListLogFiles(fs_, options_.dir);
  if (!files) return files.error();
  for (const LogFile& f : files->segments) {
    if (f.id <= *closed) IDEM_RETURN_IF_ERROR(fs_.Remove(Path(f.name)));
  }
  for (const LogFile& f : files->snapshots) {
    if (f.id < *closed) IDEM_RETURN_IF_ERROR(fs_.Remove(Path(f.name)));
  }
  snapshot_id_ = *closed;
  snapshot_bytes_ = snap_bytes;
  snapshot_things_ = things;
  live_bytes_ = snap_bytes;
  base_bytes_ = snap_bytes;
  written_at_base_ = written_then;
  return OkStatus();
}

Result<StoreStats> LogStore::Stats() {
  auto stats = engine_->Stats();
  if (!stats) return stats;
  stats->bytes = DiskBytes();
  return stats;
}

Result<std::uint64_t> LogStore::Purge() {
  auto n = engine_->Purge();
  if (!n) return n;
  IDEM_RETURN_IF_ERROR(Compact());
  return n;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenLogStoreWith(const LogStoreOptions& options, FileSystem& fs) {
  if (options.dir.empty()) return InvalidArgumentError("log store: dir is empty");
  if (options.sync == SyncMode::kInterval && options.sync_interval.count() <= 0) {
    return InvalidArgumentError("log store: sync interval must be positive");
  }
  if (Status s = core::CheckAbandonedRetention(options.abandoned_retention); !s.ok()) {
    return InvalidArgumentError("log store: " + s.message());
  }
  auto store = std::make_unique<LogStore>(options, fs);
  IDEM_RETURN_IF_ERROR(store->Open());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace log

Result<std::unique_ptr<Store>> OpenLogStore(const LogStoreOptions& options) {
  return log::OpenLogStoreWith(options, log::FileSystem::Posix());
}

}  // namespace idem
