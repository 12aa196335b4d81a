// ParseLogStoreUrl, VerifyLogStore and RepairLogStore: the log store's operator side.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>

#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/codec.h"
#include "stores/log/file_system.h"
#include "stores/log/writer.h"

namespace idem {
namespace log {
namespace {

struct LogFile {
  std::string name;
  std::uint64_t id;
  bool snapshot;
};

// The store's files in replay order: the newest snapshot, then the segments after it.
Result<std::vector<LogFile>> ListLogFiles(FileSystem& fs, const std::string& dir) {
  auto names = fs.List(dir);
  if (!names) return names.error();
  std::vector<LogFile> snaps, segs;
  for (const std::string& n : *names) {
    unsigned long long id = 0;
    char ext[8] = {};
    if (std::sscanf(n.c_str(), "%12llu.%4s", &id, ext) != 2) continue;
    if (n == std::to_string(id) || n.find(".tmp") != std::string::npos) continue;
    if (std::string_view(ext) == "log") segs.push_back({n, id, false});
    if (std::string_view(ext) == "snap") snaps.push_back({n, id, true});
  }
  auto by_id = [](const LogFile& a, const LogFile& b) { return a.id < b.id; };
  std::sort(snaps.begin(), snaps.end(), by_id);
  std::sort(segs.begin(), segs.end(), by_id);
  std::vector<LogFile> out;
  std::uint64_t after = 0;
  if (!snaps.empty()) {
    out.push_back(snaps.back());
    after = snaps.back().id;
  }
  for (const LogFile& f : segs) {
    if (f.id > after) out.push_back(f);
  }
  return out;
}

Status Locked(FileSystem& fs, const std::string& dir, std::unique_ptr<DirLock>* lock) {
  if (!fs.Exists(dir)) return NotFoundError(dir + ": no such directory");
  auto l = fs.Lock(dir + "/LOCK");
  if (!l) return l.error();
  *lock = std::move(*l);
  return OkStatus();
}

}  // namespace
}  // namespace log

Result<LogStoreOptions> ParseLogStoreUrl(std::string_view url) {
  constexpr std::string_view kScheme = "log:";
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
  while (!query.empty()) {
    std::string_view param = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), param.size() + 1));
    if (param.substr(0, 5) == "sync=") {
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
  IDEM_RETURN_IF_ERROR(log::Locked(fs, dir, &lock));
  auto files = log::ListLogFiles(fs, dir);
  if (!files) return files.error();
  std::vector<std::unique_ptr<log::ReadableFile>> data;
  std::uint64_t total = 0, done = 0;
  for (const auto& f : *files) {
    auto r = fs.Read(dir + "/" + f.name);
    if (!r) return r.error();
    total += (*r)->Data().size();
    data.push_back(std::move(*r));
  }
  LogCheckReport report;
  std::uint64_t last_seq = 0;
  for (std::size_t i = 0; i < files->size(); ++i) {
    const auto& f = (*files)[i];
    const std::string path = dir + "/" + f.name;
    std::string_view bytes = data[i]->Data();
    ++report.files;
    report.bytes += bytes.size();
    const bool last = i + 1 == files->size();
    if (Status h = log::CheckFileHeader(bytes, path); !h.ok()) {
      if (last && !f.snapshot && bytes.size() < log::kFileHeaderSize) {
        report.torn_tail = true;
      } else {
        report.damage.push_back(h.message());
      }
      continue;
    }
    log::Entry e;
    std::uint64_t entries = 0;
    auto scan = log::ScanLog(bytes, f.snapshot ? 0 : last_seq, [&](const log::Frame& fr) {
      Status s = log::DecodeEntry(fr.type, fr.payload, &e);
      if (!s.ok()) {
        report.damage.push_back(path + " offset " + std::to_string(fr.offset) + ": " + s.message());
      }
      ++entries;
      if (progress && (entries & 0xFFFF) == 0) progress(done + fr.offset, total);
      return OkStatus();
    });
    if (!scan) return scan.error();
    report.batches += scan->batches;
    report.entries += scan->frames;
    if (!f.snapshot) last_seq = scan->last_seq;
    using End = log::ScanResult::End;
    if (scan->end == End::kTornTail && last && !f.snapshot) {
      report.torn_tail = true;
    } else if (scan->end != End::kClean) {
      report.damage.push_back(path + " offset " + std::to_string(scan->damage_offset) + ": " +
                              scan->detail);
    }
    done += bytes.size();
    if (progress) progress(done, total);
  }
  return report;
}

Result<LogRepairReport> RepairLogStore(const std::string& dir, const Progress& progress) {
  log::FileSystem& fs = log::FileSystem::Posix();
  std::unique_ptr<log::DirLock> lock;
  IDEM_RETURN_IF_ERROR(log::Locked(fs, dir, &lock));
  auto files = log::ListLogFiles(fs, dir);
  if (!files) return files.error();
  LogRepairReport report;
  if (files->empty()) return report;
  // Every intact entry, in order, into one new segment after the newest file.
  const std::uint64_t new_id = files->back().id + 1;
  char name[40];
  std::snprintf(name, sizeof name, "%012llu.log", static_cast<unsigned long long>(new_id));
  const std::string tmp = dir + "/" + name + ".tmp";
  auto out = fs.Append(tmp);
  if (!out) return out.error();
  IDEM_RETURN_IF_ERROR((*out)->Append(log::FileHeader()));
  log::BatchBuilder batch;
  std::uint64_t seq = 0, total = 0, done = 0;
  for (const auto& f : *files) {
    auto r = fs.Read(dir + "/" + f.name);
    if (r) total += (*r)->Data().size();
  }
  Status write_error;
  auto flush = [&] {
    if (batch.empty() || !write_error.ok()) return;
    write_error = (*out)->Append(batch.Finish(++seq));
    batch.Clear();
  };
  for (const auto& f : *files) {
    const std::string path = dir + "/" + f.name;
    auto r = fs.Read(path);
    if (!r) return r.error();
    std::string_view bytes = (*r)->Data();
    if (!log::CheckFileHeader(bytes, path).ok()) {
      report.bytes_dropped += bytes.size();
      report.dropped.push_back(path + " bytes [0, " + std::to_string(bytes.size()) +
                               ") (bad header)");
      continue;
    }
    log::Entry e;
    auto salvage = log::SalvageLog(bytes, [&](const log::Frame& fr) {
      if (!log::DecodeEntry(fr.type, fr.payload, &e).ok()) {
        report.bytes_dropped += fr.payload.size() + log::kFrameHeaderSize;
        report.dropped.push_back(
            path + " bytes [" + std::to_string(fr.offset) + ", " +
            std::to_string(fr.offset + log::kFrameHeaderSize + fr.payload.size()) +
            ") (undecodable entry)");
        return OkStatus();
      }
      batch.Add(fr.type, fr.payload);
      ++report.entries_kept;
      if (batch.size() >= (1u << 20)) flush();
      if (progress && (report.entries_kept & 0xFFFF) == 0) progress(done + fr.offset, total);
      return OkStatus();
    });
    if (!salvage) return salvage.error();
    for (const auto& [a, b] : salvage->dropped) {
      report.bytes_dropped += b - a;
      report.dropped.push_back(path + " bytes [" + std::to_string(a) + ", " + std::to_string(b) +
                               ")");
    }
    done += bytes.size();
    if (progress) progress(done, total);
  }
  flush();
  IDEM_RETURN_IF_ERROR(write_error);
  IDEM_RETURN_IF_ERROR((*out)->Sync());
  out->reset();
  // The old files go to a backup folder: nothing is deleted by a repair.
  const std::string backup = dir + "/repair-backup-" + std::to_string(std::time(nullptr));
  IDEM_RETURN_IF_ERROR(fs.CreateDir(backup));
  for (const auto& f : *files) {
    IDEM_RETURN_IF_ERROR(fs.Rename(dir + "/" + f.name, backup + "/" + f.name));
  }
  IDEM_RETURN_IF_ERROR(fs.Rename(tmp, dir + "/" + name));
  IDEM_RETURN_IF_ERROR(fs.SyncDir(dir));
  return report;
}

}  // namespace idem
