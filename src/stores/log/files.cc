#include "stores/log/files.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

namespace idem::log {
namespace {

constexpr std::size_t kIdDigits = 12;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string LogFileName(std::uint64_t id, bool snapshot) {
  char name[40];
  std::snprintf(name, sizeof name, "%012llu.%s", static_cast<unsigned long long>(id),
                snapshot ? "snap" : "log");
  return name;
}

std::vector<LogFile> LogFiles::ReplayOrder() const {
  std::vector<LogFile> out;
  std::uint64_t after = 0;
  if (!snapshots.empty()) {
    out.push_back(snapshots.back());
    after = snapshots.back().id;
  }
  for (const LogFile& f : segments) {
    if (f.id > after) out.push_back(f);
  }
  return out;
}

Result<LogFiles> ListLogFiles(FileSystem& fs, const std::string& dir) {
  auto names = fs.List(dir);
  if (!names) return names.error();
  LogFiles files;
  for (std::string& n : *names) {
    if (EndsWith(n, ".tmp")) {
      files.temporary.push_back(std::move(n));
      continue;
    }
    const bool snapshot = EndsWith(n, ".snap");
    if (!snapshot && !EndsWith(n, ".log")) continue;
    const std::size_t digits = n.find('.');
    if (digits != kIdDigits || !std::all_of(n.begin(), n.begin() + kIdDigits,
                                            [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    LogFile f{n, std::stoull(n.substr(0, kIdDigits)), snapshot};
    (snapshot ? files.snapshots : files.segments).push_back(std::move(f));
  }
  auto by_id = [](const LogFile& a, const LogFile& b) { return a.id < b.id; };
  std::sort(files.snapshots.begin(), files.snapshots.end(), by_id);
  std::sort(files.segments.begin(), files.segments.end(), by_id);
  return files;
}

}  // namespace idem::log
