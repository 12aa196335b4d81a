// The names of a log store's files: DIR/<12-digit id>.log for segments, DIR/<id>.snap for
// snapshots (a snapshot covers every segment up to its id), and *.tmp for an unfinished one;
// and the salt of a new store's files.
#ifndef IDEM_STORES_LOG_FILES_H_
#define IDEM_STORES_LOG_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "idem/status.h"
#include "stores/log/file_system.h"

namespace idem::log {

struct LogFile {
  std::string name;  // within the directory
  std::uint64_t id = 0;
  bool snapshot = false;
};

std::string LogFileName(std::uint64_t id, bool snapshot);

struct LogFiles {
  std::vector<LogFile> snapshots;  // ascending ids
  std::vector<LogFile> segments;   // ascending ids
  std::vector<std::string> temporary;

  // What a store replays, in order: the newest snapshot, then the segments after it.
  std::vector<LogFile> ReplayOrder() const;

  // Which files are missing from what a store replays, or "" when none is. A store's segments
  // are numbered 1, 2, 3, ... and a snapshot takes the id of the last segment it covers, so
  // what follows snapshot N (or, without a snapshot, the start) is segment N + 1, N + 2, ...
  // with no gap. A deleted oldest segment or snapshot is otherwise undetectable: every file
  // left is intact, and the records of the missing one are silently gone.
  std::string Missing() const;
};

// Other names in the directory (LOCK, backups) are ignored.
Result<LogFiles> ListLogFiles(FileSystem& fs, const std::string& dir);

// A random salt for a new store (see batch.h), from getrandom(2); never one whose checksums
// would be plain CRC-32C.
std::uint64_t NewSalt();

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_FILES_H_
