// The embedded log store against what else could keep idempotency records durably, all on one
// disk in one run. The workload is the full cycle of the benchmark spec: Begin on a new
// 32-hex-character key, then Complete with a 100-byte response.
//
//   raw_append/batch:N        the disk's limit: N 64-byte records appended to an O_APPEND file
//                             in one write(), then fdatasync; one thread. items = records.
//   raw_append/syncs_in_flight:2/batch:N   context, not a target: the same from two threads,
//                             writing in turn, each syncing through its own descriptor, so
//                             two fdatasyncs overlap. items = records (both threads).
//   log_store/sync:always     idem, one cycle per caller at a time, 1/16/64 callers (threads)
//                             sharing one store, so concurrent callers share a group commit.
//                             Compare with raw_append/batch:<callers>: a cycle is two log
//                             records (Begin's and Complete's).
//   log_store/sync:always/batch:100   idem's batch API, as the batch:100 peers get it: per
//                             group of 100 keys one BeginBatch, then one CompleteBatch
//                             (each answer durable before it is given); 1/16/64 threads,
//                             each on its own keys. items = cycles (keys).
//   rocksdb/batch:100         per key Get (absent), then for each group of 100 keys one synced
//                             WriteBatch of 100 Put(reserved) and one of 100 Put(completed);
//                             WriteOptions.sync = true; 1/16/64 threads, each on its own keys.
//   rocksdb/batch:1           context, not a target: the same with one key per synced write,
//                             as an idem caller has, leaving batching to RocksDB's group commit.
//   sqlite/batch:100          WAL, synchronous=FULL, table (key TEXT PRIMARY KEY, state INT,
//                             response BLOB); per group of 100 keys one transaction of INSERT
//                             OR IGNORE (reserved) and one of UPDATE (completed). One
//                             connection shared by all threads behind a mutex: SQLite runs one
//                             writer at a time anyway, and busy_timeout's sleeping retries
//                             would only make it slower.
//   log_store/sync:none       idem, never synced: the CPU cost of a cycle; 1 and 2 threads.
//   log_store/recovery/...    OpenLogStore on a store of IDEM_BENCH_RECOVERY_KEYS completed
//                             records with no response (written with sync=none, closed first);
//                             cache:warm with the files in the page cache, cache:cold after
//                             posix_fadvise(DONTNEED) on each (the host may still cache them).
//
// items_per_second is cycles/s (records/s for raw_append). The threaded runs report, as manual
// time, the wall time of the whole run (see RunClock). Counters:
//   bytes_per_record      the store's directory after the run (closed; RocksDB after
//                         CompactRange, SQLite after a TRUNCATE checkpoint) over the keys.
//   records_per_write     idem: log records (two a cycle) per write() call, from /proc/self/io
//                         syscw: the average group-commit batch.
//   write_bytes_per_cycle bytes handed to write() calls (/proc/self/io wchar) per cycle.
//
// Targets (sync=always, 64 callers): >= 100k cycles/s, >= 2x rocksdb/batch:100, >= 4x
// sqlite/batch:100, >= 50% of raw_append/batch:64's record rate; sync=none on 2 threads
// >= 1M cycles/s; recovery of 10M records <= 5 s. scripts/bench-log.sh prints the ratios.
//
// Environment (each count is multiplied by IDEM_BENCH_SCALE, default 1; 0.02 is a quick run):
//   IDEM_BENCH_DIR              base directory for every store (default /tmp/idem-bench); each
//                               run gets a fresh directory under it, removed afterwards.
//   IDEM_BENCH_RAW_SYNCS        fdatasyncs per raw_append run (default 3000)
//   IDEM_BENCH_CYCLES_PER_CALLER   cycles per caller for sync=always (default 1500), and a
//                               quarter of that for rocksdb/batch:1
//   IDEM_BENCH_PEER_KEYS        keys per rocksdb/sqlite batch:100 run, split over the threads
//                               (default 96000)
//   IDEM_BENCH_NOSYNC_CYCLES    cycles per sync=none run, split over the threads (2000000)
//   IDEM_BENCH_RECOVERY_KEYS    records in the recovery store (default 10000000)
//   IDEM_BENCH_RECOVERY_OPENS   opens per recovery benchmark (default 3)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "idem/record.h"
#include "idem/store.h"
#include "idem/stores/log.h"

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kKeyChars = 32;
constexpr std::size_t kResponseBytes = 100;
constexpr std::size_t kRawRecordBytes = 64;
constexpr std::size_t kPeerBatch = 100;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "log_store_bench: %s\n", what.c_str());
  std::exit(2);
}

// ---- configuration ----

double Scale() {
  const char* env = std::getenv("IDEM_BENCH_SCALE");
  return env != nullptr ? std::strtod(env, nullptr) : 1.0;
}

// The count in `name` (or `fallback`) times IDEM_BENCH_SCALE, rounded up to a multiple of
// `multiple`, at least one multiple.
std::uint64_t Count(const char* name, std::uint64_t fallback, std::uint64_t multiple = 1) {
  const char* env = std::getenv(name);
  const double n =
      static_cast<double>(env != nullptr ? std::strtoull(env, nullptr, 10) : fallback) * Scale();
  const auto rounded =
      static_cast<std::uint64_t>(n + static_cast<double>(multiple) - 1) / multiple * multiple;
  return std::max(rounded, multiple);
}

std::string BaseDir() {
  const char* env = std::getenv("IDEM_BENCH_DIR");
  return env != nullptr && *env != '\0' ? env : "/tmp/idem-bench";
}

// A fresh empty directory under the base directory, removed with everything in it on
// destruction.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view name) {
    static std::atomic<int> counter{0};
    path_ = BaseDir() + "/" + std::string(name) + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter++);
    std::error_code ec;
    fs::remove_all(path_, ec);
    if (!fs::create_directories(path_, ec)) Die("cannot create " + path_ + ": " + ec.message());
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Apparent size of every regular file under `dir`.
std::uint64_t DirBytes(const std::string& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file(ec)) total += e.file_size(ec);
  }
  return total;
}

// Write calls and bytes this process has handed to write()-like calls so far.
struct IoCounters {
  std::uint64_t write_calls = 0;
  std::uint64_t write_bytes = 0;
};

IoCounters ReadIo() {
  IoCounters io;
  FILE* f = std::fopen("/proc/self/io", "r");
  if (f == nullptr) return io;
  char name[32];
  unsigned long long value = 0;
  while (std::fscanf(f, "%31[^:]: %llu\n", name, &value) == 2) {
    if (std::strcmp(name, "syscw") == 0) io.write_calls = value;
    if (std::strcmp(name, "wchar") == 0) io.write_bytes = value;
  }
  std::fclose(f);
  return io;
}

// ---- keys and responses ----

std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Key number `i`: 32 random-looking hex characters, the same in every run and for every peer.
void WriteKey(std::uint64_t i, char* out) {
  std::uint64_t halves[2] = {SplitMix64(2 * i), SplitMix64(2 * i + 1)};
  for (std::uint64_t h : halves) {
    for (int j = 0; j < 16; ++j, h >>= 4) *out++ = "0123456789abcdef"[h & 15];
  }
}

// Keys [0, n), generated before a run so that the timed loop only reads them.
class Keys {
 public:
  explicit Keys(std::uint64_t n) : chars_(n * kKeyChars, '\0') {
    for (std::uint64_t i = 0; i < n; ++i) WriteKey(i, chars_.data() + i * kKeyChars);
  }
  std::string_view operator[](std::uint64_t i) const {
    return std::string_view(chars_.data() + i * kKeyChars, kKeyChars);
  }

 private:
  std::string chars_;
};

// Key i's response: 100 bytes cut from 1 MiB of random bytes, so that responses do not
// compress away in the stores that compress (RocksDB).
std::string_view Response(std::uint64_t i) {
  static const std::string pool = [] {
    std::string p(1u << 20, '\0');
    std::mt19937_64 rng(7);
    for (char& c : p) c = static_cast<char>(rng());
    return p;
  }();
  return std::string_view(pool.data() + (i * 4099) % (pool.size() - kResponseBytes),
                          kResponseBytes);
}

std::uint64_t NowMillis() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

// ---- one run's shared state ----
//
// Thread 0 builds a run's state before the timed loop and tears it down after it; the loop's
// start and end are barriers across the benchmark's threads, so the other threads touch the
// state only inside the loop. Failures are counted, not acted on, so that every thread still
// reaches the closing barrier; thread 0 reports them afterwards with SkipWithError.

struct RunBase {
  RunBase(std::string_view name, std::uint64_t num_keys) : dir(name), keys(num_keys) {}
  ScratchDir dir;
  Keys keys;
  std::string setup_error;
  std::atomic<std::uint64_t> errors{0};
  IoCounters io_before;
};

std::uint64_t PerThread(const benchmark::State& state) {
  return static_cast<std::uint64_t>(state.max_iterations);
}
std::uint64_t FirstIteration(const benchmark::State& state) {
  return PerThread(state) * static_cast<std::uint64_t>(state.thread_index());
}
std::uint64_t TotalIterations(const benchmark::State& state) {
  return PerThread(state) * static_cast<std::uint64_t>(state.threads());
}

// The wall time of a multi-threaded run, reported as manual time. Google Benchmark divides
// the items of all threads by the mean of the threads' own times, which overstates the rate
// when a lock lets some threads finish early (SQLite's mutex does). Every thread here reports
// the time from its first iteration (just after the loop's start barrier) to after the loop
// (after its end barrier): the whole run, so items_per_second is items over the run's wall time.
// (Setting manual time once after the loop works because the library collects a thread's
// times when its function returns.)
class RunClock {
 public:
  void Start() {
    if (!started_) {
      started_ = true;
      start_ = std::chrono::steady_clock::now();
    }
  }
  // After the loop.
  void Report(benchmark::State& state) const {
    if (!started_) return;
    const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - start_;
    state.SetIterationTime(wall.count());
  }

 private:
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
};

// Sets the counters every store reports, and the outcome.
void Finish(benchmark::State& state, const RunBase& run, std::uint64_t cycles,
            std::uint64_t dir_bytes, std::uint64_t records_per_cycle) {
  const IoCounters io = ReadIo();
  const auto n = static_cast<double>(cycles);
  state.counters["bytes_per_record"] = static_cast<double>(dir_bytes) / n;
  state.counters["write_bytes_per_cycle"] =
      static_cast<double>(io.write_bytes - run.io_before.write_bytes) / n;
  if (records_per_cycle > 0 && io.write_calls > run.io_before.write_calls) {
    state.counters["records_per_write"] =
        n * static_cast<double>(records_per_cycle) /
        static_cast<double>(io.write_calls - run.io_before.write_calls);
  }
  if (!run.setup_error.empty()) {
    state.SkipWithError(run.setup_error.c_str());
  } else if (run.errors.load() != 0) {
    const std::string e = std::to_string(run.errors.load()) + " unexpected answers";
    state.SkipWithError(e.c_str());
  }
}

// ---- raw baseline ----

// `batch` random 64-byte records, as one write()'s worth.
std::string RawRecords(std::size_t batch, std::uint64_t seed) {
  std::string records(batch * kRawRecordBytes, '\0');
  std::mt19937_64 rng(seed);
  for (char& c : records) c = static_cast<char>(rng());
  return records;
}

void BM_RawAppend(benchmark::State& state) {
  const auto batch = static_cast<std::size_t>(state.range(0));
  ScratchDir dir("raw");
  const std::string path = dir.path() + "/raw.log";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
  const std::string records = RawRecords(batch, 1);
  bool ok = true;
  for (auto _ : state) {
    ok &= ::write(fd, records.data(), records.size()) == static_cast<ssize_t>(records.size());
    ok &= ::fdatasync(fd) == 0;
  }
  ::close(fd);
  if (!ok) state.SkipWithError("write or fdatasync failed");
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch));
}

// Context for a possible writer with two syncs in flight, not a target: two threads append
// batches to one file in turn (one write() at a time, under a lock) and each then fdatasyncs it
// through its own open file description, so one thread's sync runs while the other writes and
// syncs. (Separate descriptions, because Linux reports a writeback error once per description:
// on a shared one, the second of two concurrent syncs could succeed after the first failed.)
std::unique_ptr<ScratchDir> g_overlap_dir;
std::mutex g_overlap_write_mu;

void BM_RawAppendOverlapped(benchmark::State& state) {
  const auto batch = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) g_overlap_dir = std::make_unique<ScratchDir>("raw-overlap");
  const std::string records =
      RawRecords(batch, static_cast<std::uint64_t>(state.thread_index()) + 1);
  int fd = -1;
  bool ok = true;
  for (auto _ : state) {
    // Opened in the loop: thread 0 made the directory before the loop's opening barrier.
    if (fd < 0) {
      const std::string path = g_overlap_dir->path() + "/raw.log";
      fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
    }
    {
      std::lock_guard<std::mutex> lock(g_overlap_write_mu);
      ok &= ::write(fd, records.data(), records.size()) == static_cast<ssize_t>(records.size());
    }
    ok &= ::fdatasync(fd) == 0;
  }
  if (fd >= 0) ::close(fd);
  if (!ok) state.SkipWithError("write or fdatasync failed");
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch));
  // After the loop's closing barrier: the other thread is done writing.
  if (state.thread_index() == 0) g_overlap_dir.reset();
}

// ---- idem's log store ----

struct LogRun : RunBase {
  using RunBase::RunBase;
  std::unique_ptr<idem::Store> store;
};
LogRun* g_log_run = nullptr;

// On thread 0, before the run: a fresh store for `cycles` keys.
void StartLogRun(std::uint64_t cycles, idem::SyncMode sync) {
  g_log_run = new LogRun("log", cycles);
  idem::LogStoreOptions options;
  options.dir = g_log_run->dir.path();
  options.sync = sync;
  idem::Result<std::unique_ptr<idem::Store>> store = idem::OpenLogStore(options);
  if (store.has_value()) {
    g_log_run->store = *std::move(store);
  } else {
    g_log_run->setup_error = "OpenLogStore: " + store.error().ToString();
  }
  g_log_run->io_before = ReadIo();
}

// On thread 0, after the run.
void FinishLogRun(benchmark::State& state, std::uint64_t cycles) {
  g_log_run->store.reset();  // closed, so that everything it writes is in the directory
  Finish(state, *g_log_run, cycles, DirBytes(g_log_run->dir.path()), 2);
  delete g_log_run;
  g_log_run = nullptr;
}

bool Cycle(idem::Store& store, std::string_view key, std::string_view response) {
  idem::BeginRequest b;
  b.key = key;
  idem::Result<idem::BeginAnswer> a = store.Begin(b);
  if (!a.has_value()) return false;
  const auto* acquired = std::get_if<idem::Acquired>(&*a);
  if (acquired == nullptr) return false;
  idem::CompleteRequest c;
  c.key = key;
  c.token = acquired->token;
  c.response = response;
  idem::Result<idem::WriteAnswer> w = store.Complete(c);
  return w.has_value() && *w == idem::WriteAnswer::kApplied;
}

void BM_LogStore(benchmark::State& state, idem::SyncMode sync) {
  if (state.thread_index() == 0) StartLogRun(TotalIterations(state), sync);
  std::uint64_t i = FirstIteration(state);
  RunClock clock;
  for (auto _ : state) {
    clock.Start();
    LogRun& run = *g_log_run;
    if (run.store == nullptr || !Cycle(*run.store, run.keys[i], Response(i))) ++run.errors;
    ++i;
  }
  clock.Report(state);
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) FinishLogRun(state, TotalIterations(state));
}

// One iteration: BeginBatch of `batch` new keys (all must be Acquired), then CompleteBatch.
void BM_LogStoreBatch(benchmark::State& state, std::size_t batch) {
  if (state.thread_index() == 0) {
    StartLogRun(TotalIterations(state) * batch, idem::SyncMode::kAlways);
  }
  std::vector<idem::BeginRequest> begins(batch);
  std::vector<idem::CompleteRequest> completes(batch);
  std::uint64_t first = FirstIteration(state) * batch;
  RunClock clock;
  for (auto _ : state) {
    clock.Start();
    LogRun& run = *g_log_run;
    if (run.store == nullptr) {
      ++run.errors;
      continue;
    }
    for (std::size_t j = 0; j < batch; ++j) begins[j].key = run.keys[first + j];
    const std::vector<idem::Result<idem::BeginAnswer>> acquired = run.store->BeginBatch(begins);
    for (std::size_t j = 0; j < batch; ++j) {
      const auto* a =
          acquired[j].has_value() ? std::get_if<idem::Acquired>(&*acquired[j]) : nullptr;
      if (a == nullptr) {
        ++run.errors;
        continue;
      }
      completes[j].key = run.keys[first + j];
      completes[j].token = a->token;
      completes[j].response = Response(first + j);
    }
    for (const idem::Result<idem::WriteAnswer>& w : run.store->CompleteBatch(completes)) {
      if (!w.has_value() || *w != idem::WriteAnswer::kApplied) ++run.errors;
    }
    first += batch;
  }
  clock.Report(state);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch));
  if (state.thread_index() == 0) FinishLogRun(state, TotalIterations(state) * batch);
}

// ---- RocksDB ----

struct RocksRun : RunBase {
  using RunBase::RunBase;
  std::unique_ptr<rocksdb::DB> db;
};
RocksRun* g_rocks_run = nullptr;

// Values as a receiver on RocksDB would keep them: a state byte and a deadline, then the
// response once completed.
std::string RocksValue(char state, std::uint64_t deadline, std::string_view response) {
  std::string v(1 + sizeof deadline, state);
  std::memcpy(v.data() + 1, &deadline, sizeof deadline);
  v.append(response);
  return v;
}

// One iteration: `batch` keys, each Get (must be absent), then the reserved Puts in one synced
// WriteBatch and the completed Puts in another.
void BM_RocksDb(benchmark::State& state, std::size_t batch) {
  if (state.thread_index() == 0) {
    g_rocks_run = new RocksRun("rocksdb", TotalIterations(state) * batch);
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(options, g_rocks_run->dir.path(), &db);
    if (s.ok()) {
      g_rocks_run->db.reset(db);
    } else {
      g_rocks_run->setup_error = "rocksdb::DB::Open: " + s.ToString();
    }
    g_rocks_run->io_before = ReadIo();
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  std::string value;
  std::uint64_t first = FirstIteration(state) * batch;
  RunClock clock;
  for (auto _ : state) {
    clock.Start();
    RocksRun& run = *g_rocks_run;
    if (run.db == nullptr) {
      ++run.errors;
      continue;
    }
    for (std::uint64_t i = first; i < first + batch; ++i) {
      if (!run.db->Get(rocksdb::ReadOptions(), run.keys[i], &value).IsNotFound()) ++run.errors;
    }
    const std::uint64_t now = NowMillis();
    rocksdb::WriteBatch reserved;
    for (std::uint64_t i = first; i < first + batch; ++i) {
      if (!reserved.Put(run.keys[i], RocksValue('R', now + 30'000, {})).ok()) ++run.errors;
    }
    if (!run.db->Write(sync, &reserved).ok()) ++run.errors;
    rocksdb::WriteBatch completed;
    for (std::uint64_t i = first; i < first + batch; ++i) {
      if (!completed.Put(run.keys[i], RocksValue('C', now + 86'400'000, Response(i))).ok()) {
        ++run.errors;
      }
    }
    if (!run.db->Write(sync, &completed).ok()) ++run.errors;
    first += batch;
  }
  clock.Report(state);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch));
  if (state.thread_index() == 0) {
    RocksRun& run = *g_rocks_run;
    const IoCounters io_after_run = ReadIo();
    if (run.db != nullptr &&
        !run.db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr).ok()) {
      ++run.errors;
    }
    run.db.reset();
    // The compaction's writes are not the run's: count only what the run wrote.
    const IoCounters compacted = ReadIo();
    run.io_before.write_calls += compacted.write_calls - io_after_run.write_calls;
    run.io_before.write_bytes += compacted.write_bytes - io_after_run.write_bytes;
    Finish(state, run, TotalIterations(state) * batch, DirBytes(run.dir.path()), 0);
    delete g_rocks_run;
    g_rocks_run = nullptr;
  }
}

// ---- SQLite ----

struct SqliteRun : RunBase {
  using RunBase::RunBase;
  ~SqliteRun() {
    for (sqlite3_stmt* s : {begin, commit, insert, update}) sqlite3_finalize(s);
    sqlite3_close(db);
  }
  sqlite3* db = nullptr;
  sqlite3_stmt* begin = nullptr;
  sqlite3_stmt* commit = nullptr;
  sqlite3_stmt* insert = nullptr;
  sqlite3_stmt* update = nullptr;
  std::mutex mu;  // the connection and its statements
};
SqliteRun* g_sqlite_run = nullptr;

std::string SqliteSetup(SqliteRun& run) {
  const std::string path = run.dir.path() + "/records.db";
  auto error = [&](std::string_view what) {
    return std::string(what) + ": " + (run.db != nullptr ? sqlite3_errmsg(run.db) : "no db");
  };
  if (sqlite3_open_v2(path.c_str(), &run.db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return error("sqlite3_open_v2");
  }
  const char* setup =
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
      "CREATE TABLE records (key TEXT PRIMARY KEY, state INT, response BLOB);";
  if (sqlite3_exec(run.db, setup, nullptr, nullptr, nullptr) != SQLITE_OK) return error(setup);
  const std::pair<sqlite3_stmt**, const char*> statements[] = {
      {&run.begin, "BEGIN IMMEDIATE"},
      {&run.commit, "COMMIT"},
      {&run.insert, "INSERT OR IGNORE INTO records (key, state) VALUES (?1, 1)"},
      {&run.update, "UPDATE records SET state = 2, response = ?2 WHERE key = ?1 AND state = 1"},
  };
  for (const auto& [stmt, sql] : statements) {
    if (sqlite3_prepare_v2(run.db, sql, -1, stmt, nullptr) != SQLITE_OK) return error(sql);
  }
  return "";
}

// Runs `stmt` to completion and resets it; true if it changed exactly `changes` rows (or,
// for changes < 0, succeeded).
bool Step(sqlite3* db, sqlite3_stmt* stmt, int changes) {
  const bool ok =
      sqlite3_step(stmt) == SQLITE_DONE && (changes < 0 || sqlite3_changes(db) == changes);
  sqlite3_reset(stmt);
  return ok;
}

// One iteration: 100 keys, a transaction of INSERT OR IGNORE (each must insert), then one of
// UPDATE to completed.
void BM_Sqlite(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_sqlite_run = new SqliteRun("sqlite", TotalIterations(state) * kPeerBatch);
    g_sqlite_run->setup_error = SqliteSetup(*g_sqlite_run);
    g_sqlite_run->io_before = ReadIo();
  }
  std::uint64_t first = FirstIteration(state) * kPeerBatch;
  RunClock clock;
  for (auto _ : state) {
    clock.Start();
    SqliteRun& run = *g_sqlite_run;
    if (!run.setup_error.empty()) {
      ++run.errors;
      continue;
    }
    std::uint64_t errors = 0;
    {
      std::lock_guard<std::mutex> lock(run.mu);
      errors += !Step(run.db, run.begin, -1);
      for (std::uint64_t i = first; i < first + kPeerBatch; ++i) {
        const std::string_view key = run.keys[i];
        sqlite3_bind_text(run.insert, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
        errors += !Step(run.db, run.insert, 1);
      }
      errors += !Step(run.db, run.commit, -1);
    }
    {
      std::lock_guard<std::mutex> lock(run.mu);
      errors += !Step(run.db, run.begin, -1);
      for (std::uint64_t i = first; i < first + kPeerBatch; ++i) {
        const std::string_view key = run.keys[i];
        const std::string_view response = Response(i);
        sqlite3_bind_text(run.update, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
        sqlite3_bind_blob(run.update, 2, response.data(), static_cast<int>(response.size()),
                          SQLITE_STATIC);
        errors += !Step(run.db, run.update, 1);
      }
      errors += !Step(run.db, run.commit, -1);
    }
    if (errors != 0) run.errors += errors;
    first += kPeerBatch;
  }
  clock.Report(state);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kPeerBatch));
  if (state.thread_index() == 0) {
    SqliteRun& run = *g_sqlite_run;
    if (run.db != nullptr && sqlite3_exec(run.db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr,
                                          nullptr, nullptr) != SQLITE_OK) {
      ++run.errors;
    }
    // What the database holds now, before closing deletes the (empty) WAL and -shm files.
    const std::uint64_t bytes = DirBytes(run.dir.path());
    Finish(state, run, TotalIterations(state) * kPeerBatch, bytes, 0);
    delete g_sqlite_run;
    g_sqlite_run = nullptr;
  }
}

// ---- recovery ----

// The store the recovery benchmarks open: built on first use, removed at exit.
class RecoveryStore {
 public:
  RecoveryStore() : records_(Count("IDEM_BENCH_RECOVERY_KEYS", 10'000'000, 2)) {
    idem::LogStoreOptions options;
    options.dir = dir_.path();
    options.sync = idem::SyncMode::kNone;
    idem::Result<std::unique_ptr<idem::Store>> opened = idem::OpenLogStore(options);
    if (!opened.has_value()) {
      error_ = "OpenLogStore: " + opened.error().ToString();
      return;
    }
    idem::Store& store = **opened;
    std::atomic<std::uint64_t> failures{0};
    auto fill = [&](std::uint64_t from, std::uint64_t to) {
      char key[kKeyChars];
      for (std::uint64_t i = from; i < to; ++i) {
        WriteKey(i, key);
        if (!Cycle(store, std::string_view(key, kKeyChars), {})) ++failures;
      }
    };
    std::thread other(fill, 0, records_ / 2);
    fill(records_ / 2, records_);
    other.join();
    opened->reset();
    if (failures.load() != 0) error_ = std::to_string(failures.load()) + " failed cycles";
    bytes_ = DirBytes(dir_.path());
  }
  const std::string& dir() const { return dir_.path(); }
  std::uint64_t records() const { return records_; }
  std::uint64_t bytes() const { return bytes_; }
  const std::string& error() const { return error_; }

 private:
  ScratchDir dir_{"recovery"};
  std::uint64_t records_;
  std::uint64_t bytes_ = 0;
  std::string error_;
};

// Drops the directory's files from the page cache (after writing back any dirty pages, which
// DONTNEED would keep).
void EvictFromPageCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::fdatasync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void BM_Recovery(benchmark::State& state, bool cold) {
  static const RecoveryStore store;  // built outside the timed loop
  std::string error = store.error();
  for (auto _ : state) {
    state.PauseTiming();
    if (cold) EvictFromPageCache(store.dir());
    idem::LogStoreOptions options;
    options.dir = store.dir();
    state.ResumeTiming();
    idem::Result<std::unique_ptr<idem::Store>> opened = idem::OpenLogStore(options);
    state.PauseTiming();
    if (!opened.has_value()) {
      error = "OpenLogStore: " + opened.error().ToString();
    } else {
      if (error.empty()) {
        idem::Result<idem::StoreStats> stats = (*opened)->Stats();
        if (!stats.has_value() || stats->completed != store.records()) {
          error = "the reopened store does not hold every record";
        }
      }
      opened->reset();
    }
    state.ResumeTiming();
  }
  state.counters["records"] = static_cast<double>(store.records());
  state.counters["bytes_per_record"] =
      static_cast<double>(store.bytes()) / static_cast<double>(store.records());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(store.records()));
  if (!error.empty()) state.SkipWithError(error.c_str());
}

// ---- registration ----

void Register() {
  using benchmark::IterationCount;
  using benchmark::RegisterBenchmark;
  const auto raw_syncs = static_cast<IterationCount>(Count("IDEM_BENCH_RAW_SYNCS", 3000));
  const auto per_caller = static_cast<IterationCount>(Count("IDEM_BENCH_CYCLES_PER_CALLER", 1500));
  // Multiples of 64 groups, so that every thread count gets whole groups.
  const std::uint64_t peer_keys = Count("IDEM_BENCH_PEER_KEYS", 96'000, 64 * kPeerBatch);
  const std::uint64_t nosync = Count("IDEM_BENCH_NOSYNC_CYCLES", 2'000'000, 2);
  const auto opens = static_cast<IterationCount>(Count("IDEM_BENCH_RECOVERY_OPENS", 3));
  auto split = [](std::uint64_t n, int threads) {
    return static_cast<IterationCount>(n / static_cast<std::uint64_t>(threads));
  };

  RegisterBenchmark("raw_append", BM_RawAppend)
      ->ArgName("batch")
      ->Arg(1)
      ->Arg(16)
      ->Arg(64)
      ->Iterations(raw_syncs)
      ->UseRealTime();
  RegisterBenchmark("raw_append/syncs_in_flight:2", BM_RawAppendOverlapped)
      ->ArgName("batch")
      ->Arg(32)
      ->Arg(64)
      ->Threads(2)
      ->Iterations(raw_syncs / 2)
      ->UseRealTime();
  for (int threads : {1, 16, 64}) {
    RegisterBenchmark("log_store/sync:always", BM_LogStore, idem::SyncMode::kAlways)
        ->Threads(threads)
        ->Iterations(per_caller)
        ->UseManualTime();
  }
  for (int threads : {1, 16, 64}) {
    RegisterBenchmark("log_store/sync:always/batch:100", BM_LogStoreBatch, kPeerBatch)
        ->Threads(threads)
        ->Iterations(split(peer_keys / kPeerBatch, threads))
        ->UseManualTime();
  }
  for (int threads : {1, 16, 64}) {
    RegisterBenchmark("rocksdb/batch:100", BM_RocksDb, kPeerBatch)
        ->Threads(threads)
        ->Iterations(split(peer_keys / kPeerBatch, threads))
        ->UseManualTime();
  }
  for (int threads : {1, 16, 64}) {
    RegisterBenchmark("rocksdb/batch:1", BM_RocksDb, std::size_t{1})
        ->Threads(threads)
        ->Iterations(std::max<IterationCount>(per_caller / 4, 1))
        ->UseManualTime();
  }
  for (int threads : {1, 16, 64}) {
    RegisterBenchmark("sqlite/batch:100", BM_Sqlite)
        ->Threads(threads)
        ->Iterations(split(peer_keys / kPeerBatch, threads))
        ->UseManualTime();
  }
  for (int threads : {1, 2}) {
    RegisterBenchmark("log_store/sync:none", BM_LogStore, idem::SyncMode::kNone)
        ->Threads(threads)
        ->Iterations(split(nosync, threads))
        ->UseManualTime();
  }
  for (bool cold : {false, true}) {
    RegisterBenchmark(cold ? "log_store/recovery/cache:cold" : "log_store/recovery/cache:warm",
                      BM_Recovery, cold)
        ->Iterations(opens)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
