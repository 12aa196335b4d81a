// ParseLogStoreUrl, VerifyLogStore and RepairLogStore: the log store's operator side.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>

#include "core/url_text.h"
#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/codec.h"
#include "stores/log/file_system.h"
#include "stores/log/files.h"
#include "stores/log/log_store_internal.h"
#include "stores/log/writer.h"

namespace idem {
namespace log {
namespace {

struct OpenedFile {
  LogFile file;
  std::unique_ptr<ReadableFile> data;
};

// The files a store replays, in order, each read once; `total` gets their combined size, and
// `missing` (when given) LogFiles::Missing().
Result<std::vector<OpenedFile>> OpenReplayFiles(FileSystem& fs, const std::string& dir,
                                                std::uint64_t* total,
                                                std::string* missing = nullptr) {
  auto listed = ListLogFiles(fs, dir);
  if (!listed) return listed.error();
  if (missing != nullptr) *missing = listed->Missing();
  std::vector<OpenedFile> out;
  *total = 0;
  for (LogFile& f : listed->ReplayOrder()) {
    auto r = fs.Read(dir + "/" + f.name);
    if (!r) return r.error();
    *total += (*r)->Data().size();
    out.push_back({std::move(f), std::move(*r)});
  }
  return out;
}

// Locks a store's directory for verify or repair. A directory without a segment or snapshot
// is no store (most likely a mistyped path): kNotFound, and nothing is created in it.
Status Locked(FileSystem& fs, const std::string& dir, std::unique_ptr<DirLock>* lock,
              bool for_reading = false) {
  if (!fs.Exists(dir)) return NotFoundError(dir + ": no such directory");
  auto listed = ListLogFiles(fs, dir);
  if (!listed) return listed.error();
  if (listed->snapshots.empty() && listed->segments.empty()) {
    return NotFoundError(dir + ": no log store here (no segment or snapshot file)");
  }
  auto l = for_reading ? fs.LockForReading(dir + "/LOCK") : fs.Lock(dir + "/LOCK");
  if (!l) return l.error();
  *lock = std::move(*l);
  return OkStatus();
}

// The store's salt as verify and repair take it: that of the first file (in replay order) whose
// header is good; failing that, the salt field of a damaged header under which the file's first
// batch is intact. nullopt when no file tells it. A file of another format version is
// kFailedPrecondition: neither verify nor repair reads on, and repair changes nothing.
Result<std::optional<std::uint64_t>> StoreSalt(const std::vector<OpenedFile>& files,
                                               const std::string& dir) {
  std::optional<std::uint64_t> salt;
  for (const OpenedFile& f : files) {
    auto read = ReadFileHeader(f.data->Data(), dir + "/" + f.file.name);
    if (!read && read.error().code() == StatusCode::kFailedPrecondition) return read.error();
    if (read && !salt) salt = *read;
  }
  for (const OpenedFile& f : files) {
    if (!salt) salt = SaltOfDamagedHeader(f.data->Data());
  }
  return salt;
}

}  // namespace
}  // namespace log

Result<LogStoreOptions> ParseLogStoreUrl(std::string_view url) {
  constexpr std::string_view kScheme = "log:";
  if (const std::size_t at = core::FirstControlByte(url); at != std::string_view::npos) {
    return InvalidArgumentError("log store URL: " + core::ControlByteMessage(url, at));
  }
  if (url.substr(0, kScheme.size()) != kScheme) {
    return InvalidArgumentError("store URL \"" + std::string(url) + "\" is not log:PATH");
  }
  std::string_view rest = url.substr(kScheme.size());
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.empty()) return InvalidArgumentError("store URL \"" + std::string(url) + "\": no path");
  LogStoreOptions o;
  o.dir = std::string(rest);
  bool sync_given = false;
  while (!query.empty()) {
    std::string_view param = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), param.size() + 1));
    if (param.substr(0, 5) == "sync=") {
      // Two would leave the last one in force, silently: "sync=always&sync=none" ran as none.
      if (sync_given) {
        return InvalidArgumentError("store URL \"" + std::string(url) + "\": sync= is given twice");
      }
      sync_given = true;
      auto mode = log::ParseSyncMode(param.substr(5));
      if (!mode) return InvalidArgumentError("store URL: " + mode.error().message());
      o.sync = mode->first;
      if (mode->first == SyncMode::kInterval) o.sync_interval = mode->second;
    } else {
      return InvalidArgumentError("store URL \"" + std::string(url) + "\": unknown option \"" +
                                  std::string(param) + "\" (known: sync)");
    }
  }
  return o;
}

Result<LogCheckReport> VerifyLogStore(const std::string& dir, const Progress& progress) {
  log::FileSystem& fs = log::FileSystem::Posix();
  std::unique_ptr<log::DirLock> lock;
  IDEM_RETURN_IF_ERROR(log::Locked(fs, dir, &lock, /*for_reading=*/true));
  std::uint64_t total = 0, done = 0;
  std::string missing;
  auto files = log::OpenReplayFiles(fs, dir, &total, &missing);
  if (!files) return files.error();
  auto salt = log::StoreSalt(*files, dir);
  if (!salt) return salt.error();
  LogCheckReport report;
  if (!missing.empty()) {
    report.damage.push_back(dir + ": " + missing +
                            " (its records are lost; repair keeps the rest)");
  }
  std::uint64_t last_seq = 0;
  for (std::size_t i = 0; i < files->size(); ++i) {
    const log::LogFile& f = (*files)[i].file;
    const std::string path = dir + "/" + f.name;
    std::string_view bytes = (*files)[i].data->Data();
    ++report.files;
    report.bytes += bytes.size();
    const bool newest_segment = i + 1 == files->size() && !f.snapshot;
    // This file's damaged places, by offset.
    std::vector<std::pair<std::uint64_t, std::string>> places;
    auto place = [&](std::uint64_t offset, const std::string& what) {
      places.emplace_back(offset, path + " offset " + std::to_string(offset) + ": " + what);
    };
    std::uint64_t entries = 0;
    auto decode = [&](const log::Frame& fr) {
      log::Entry e;
      if (Status s = log::DecodeEntry(fr.type, fr.payload, &e); !s.ok()) {
        place(fr.offset, s.message());
      }
      ++entries;
      if (progress && (entries & 0xFFFF) == 0) progress(done + fr.offset, total);
      return OkStatus();
    };
    auto read = log::ReadFileHeader(bytes, path);
    std::optional<std::pair<std::uint64_t, std::string>> first;  // where the open stops
    if (!read) {
      if (newest_segment && bytes.size() < log::kFileHeaderSize) {
        report.torn_tail = true;  // created, the crash came before its header was whole
        continue;
      }
      report.damage.push_back(read.error().message());
      if (!*salt || bytes.size() < log::kFileHeaderSize) {
        if (!f.snapshot) last_seq = 0;  // unknown: the next file's first seq is not checked
        continue;
      }
    } else if (*read != **salt) {
      report.damage.push_back(log::CheckFileHeader(bytes, path, **salt).message());
      if (!f.snapshot) last_seq = 0;
      continue;
    } else {
      // As the open reads it.
      auto scan = log::ScanLog(bytes, **salt, f.snapshot ? 0 : last_seq, decode);
      if (!scan) return scan.error();
      using End = log::ScanResult::End;
      if (scan->end == End::kClean || (scan->end == End::kTornTail && newest_segment)) {
        report.batches += scan->batches;
        report.entries += scan->frames;
        if (!f.snapshot) last_seq = scan->last_seq;
        if (scan->end == End::kTornTail) {
          report.torn_tail = true;
          report.lost_unsynced = scan->unsynced;
          report.unsynced_batches = scan->unsynced_batches;
        }
        for (auto& [offset, line] : places) report.damage.push_back(std::move(line));
        done += bytes.size();
        if (progress) progress(done, total);
        continue;
      }
      first.emplace(scan->damage_offset, scan->detail);
    }
    // Damaged: every place, found by the scan repair makes, which goes on past each one (so
    // the two cannot disagree); the open stops at the first.
    places.clear();
    entries = 0;
    auto salvage = log::SalvageLog(bytes, **salt, decode);
    if (!salvage) return salvage.error();
    report.batches += salvage->batches;
    report.entries += salvage->frames_kept;
    if (!f.snapshot) last_seq = salvage->last_seq;
    for (std::size_t k = 0; k < salvage->damage.size(); ++k) {
      const log::SalvageResult::Damage& d = salvage->damage[k];
      if (newest_segment && salvage->torn_tail && k + 1 == salvage->damage.size()) {
        report.torn_tail = true;  // what the open would cut, were the file not damaged before it
        break;
      }
      if (first && (d.batch == first->first || d.begin == first->first)) first.reset();
      place(d.batch,
            d.what + (d.begin == d.end ? ""
                                       : " (repair drops bytes [" + std::to_string(d.begin) + ", " +
                                             std::to_string(d.end) + "))"));
    }
    // Damage that drops nothing (an intact batch out of sequence) is listed as the open finds it.
    if (first) place(first->first, first->second);
    std::stable_sort(places.begin(), places.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [offset, line] : places) report.damage.push_back(std::move(line));
    done += bytes.size();
    if (progress) progress(done, total);
  }
  return report;
}

namespace log {

Result<LogRepairReport> RepairLogStoreWith(const std::string& dir, FileSystem& fs,
                                           const Progress& progress) {
  std::unique_ptr<DirLock> lock;
  IDEM_RETURN_IF_ERROR(Locked(fs, dir, &lock));
  auto listed = ListLogFiles(fs, dir);
  if (!listed) return listed.error();
  std::uint64_t total = 0, done = 0;
  auto files = OpenReplayFiles(fs, dir, &total);
  if (!files) return files.error();
  LogRepairReport report;
  if (const std::string missing = listed->Missing(); !missing.empty()) {
    // Nothing to keep of those; the repaired store is whole again without them.
    report.dropped.push_back(dir + ": " + missing + " (their records were lost before repair)");
  }
  // The repaired store keeps the store's salt (a new one when no file tells it). A file of
  // another format version stops the repair before anything changes.
  auto learnt = StoreSalt(*files, dir);
  if (!learnt) return learnt.error();
  const std::uint64_t salt = learnt->has_value() ? **learnt : NewSalt();
  // Every intact entry, in order, into one new snapshot above every file there is (leftover
  // segments of an interrupted compaction included): a snapshot covers every id up to its own,
  // so an open replays it alone and removes whatever older files are still there.
  std::uint64_t newest = 0;
  for (const auto* group : {&listed->snapshots, &listed->segments}) {
    for (const LogFile& f : *group) newest = std::max(newest, f.id);
  }
  const std::string name = LogFileName(newest + 1, /*snapshot=*/true);
  const std::string tmp = dir + "/" + name + ".tmp";
  // One left by a repair that stopped: Append would add to it.
  if (fs.Exists(tmp)) IDEM_RETURN_IF_ERROR(fs.Remove(tmp));
  auto out = fs.Append(tmp);
  if (!out) return out.error();
  IDEM_RETURN_IF_ERROR((*out)->Append(FileHeader(salt)));
  BatchBuilder batch(salt);
  std::uint64_t seq = 0;
  Status write_error;
  auto flush = [&] {
    if (batch.empty() || !write_error.ok()) return;
    write_error = (*out)->Append(batch.Finish(++seq));
    batch.Clear();
  };
  for (const auto& opened : *files) {
    const std::string path = dir + "/" + opened.file.name;
    std::string_view bytes = opened.data->Data();
    auto whole_file = [&](const std::string& why) {
      report.bytes_dropped += bytes.size();
      report.dropped.push_back(path + " bytes [0, " + std::to_string(bytes.size()) + ") (" + why +
                               ")");
    };
    if (auto read = ReadFileHeader(bytes, path); read && *read != salt) {
      whole_file("the salt of another store");
      continue;
    } else if (!read) {
      // Its batches can still be read when the store's salt is known: they check out under it
      // or not at all.
      if (!learnt->has_value() || bytes.size() < kFileHeaderSize) {
        whole_file("bad header");
        continue;
      }
      report.bytes_dropped += kFileHeaderSize;
      report.dropped.push_back(path + " bytes [0, " + std::to_string(kFileHeaderSize) +
                               ") (bad header; its batches are read with the store's salt)");
    }
    Entry e;
    auto keep = [&](const Frame& fr) {
      batch.Add(fr.type, fr.payload);
      ++report.entries_kept;
      if (batch.size() >= (1u << 20)) flush();
      if (progress && (report.entries_kept & 0xFFFF) == 0) progress(done + fr.offset, total);
    };
    // The newest segment's frames wait until its end is known: a torn batch at its tail was
    // never acknowledged, and the open cuts it whole, so repair does too (it kept the frames
    // before the tear, bringing back records the store had never answered for).
    const bool newest_segment = &opened == &files->back() && !opened.file.snapshot;
    std::vector<Frame> held;
    auto salvage = SalvageLog(bytes, salt, [&](const Frame& fr) {
      if (!DecodeEntry(fr.type, fr.payload, &e).ok()) {
        report.bytes_dropped += fr.payload.size() + kFrameHeaderSize;
        report.dropped.push_back(path + " bytes [" + std::to_string(fr.offset) + ", " +
                                 std::to_string(fr.offset + kFrameHeaderSize + fr.payload.size()) +
                                 ") (undecodable entry)");
        return OkStatus();
      }
      if (newest_segment) {
        held.push_back(fr);
      } else {
        keep(fr);
      }
      return OkStatus();
    });
    if (!salvage) return salvage.error();
    const bool torn = newest_segment && salvage->torn_tail && !salvage->damage.empty();
    const std::uint64_t cut = torn ? salvage->damage.back().batch : bytes.size();
    for (const Frame& fr : held) {
      if (fr.offset < cut) keep(fr);
    }
    for (std::size_t k = 0; k < salvage->damage.size(); ++k) {
      const SalvageResult::Damage& d = salvage->damage[k];
      if (torn && k + 1 == salvage->damage.size()) {
        report.bytes_dropped += d.end - d.batch;
        report.dropped.push_back(path + " bytes [" + std::to_string(d.batch) + ", " +
                                 std::to_string(d.end) + ") (" + d.what +
                                 ": the newest segment's torn tail, never acknowledged, cut "
                                 "whole as opening the store cuts it)");
        break;
      }
      report.bytes_dropped += d.end - d.begin;
      if (d.begin == d.end) {
        report.dropped.push_back(path + " offset " + std::to_string(d.begin) + ": " + d.what +
                                 " (nothing dropped)");
      } else {
        report.dropped.push_back(path + " bytes [" + std::to_string(d.begin) + ", " +
                                 std::to_string(d.end) + ") (" + d.what + ")");
      }
    }
    done += bytes.size();
    if (progress) progress(done, total);
  }
  flush();
  IDEM_RETURN_IF_ERROR(write_error);
  IDEM_RETURN_IF_ERROR((*out)->Sync());
  out->reset();
  files->clear();
  // Invariant: at every point a crash can stop this, an open finds a whole store: the old
  // files (until the snapshot's rename is durable; the .tmp is removed by that open), or the
  // repaired snapshot, which supersedes every old file still beside it. So the snapshot is
  // made durable under its name before any old file moves, never the other way round.
  IDEM_RETURN_IF_ERROR(fs.Rename(tmp, dir + "/" + name));
  IDEM_RETURN_IF_ERROR(fs.SyncDir(dir));
  // The old files go to a backup folder: nothing is deleted by a repair (if this stops
  // halfway, the next open removes those left behind, as it does a compaction's leftovers).
  const std::string stamp = dir + "/repair-backup-" + std::to_string(std::time(nullptr));
  std::string backup = stamp;
  for (int n = 2; fs.Exists(backup); ++n) backup = stamp + "-" + std::to_string(n);
  IDEM_RETURN_IF_ERROR(fs.CreateDir(backup));
  report.backup = backup;
  for (const auto* group : {&listed->snapshots, &listed->segments}) {
    for (const LogFile& f : *group) {
      IDEM_RETURN_IF_ERROR(fs.Rename(dir + "/" + f.name, backup + "/" + f.name));
    }
  }
  IDEM_RETURN_IF_ERROR(fs.SyncDir(dir));
  return report;
}

}  // namespace log

Result<LogRepairReport> RepairLogStore(const std::string& dir, const Progress& progress) {
  return log::RepairLogStoreWith(dir, log::FileSystem::Posix(), progress);
}

}  // namespace idem
