#include "stores/log/files.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <random>
#include <string_view>

#include "stores/log/batch.h"

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

std::string LogFiles::Missing() const {
  const std::vector<LogFile> replay = ReplayOrder();
  std::uint64_t expect = 1;
  std::string after = "the start";
  for (const LogFile& f : replay) {
    if (f.snapshot) {
      expect = f.id + 1;
      after = f.name;
      continue;
    }
    if (f.id != expect) {
      const std::string first = LogFileName(expect, /*snapshot=*/false);
      const std::string last = LogFileName(f.id - 1, /*snapshot=*/false);
      return (first == last ? first + " is" : first + " to " + last + " are") + " missing: after " +
             after + " comes " + f.name;
    }
    ++expect;
    after = f.name;
  }
  return {};
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

std::uint64_t NewSalt() {
  for (;;) {
    std::uint64_t salt = 0;
    ssize_t n = 0;
    do {
      n = getrandom(&salt, sizeof salt, 0);
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(sizeof salt)) {
      std::random_device rd;  // getrandom(2) missing (ENOSYS): the kernel's pool by another way
      salt = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }
    // Seed 0 would be plain CRC-32C, as anyone computes it.
    if (ChecksumSeed(salt) != 0) return salt;
  }
}

}  // namespace idem::log
