// The log store's only way to the disk (leveldb's Env, reduced to what an append-only log
// needs), so tests can inject ENOSPC, I/O errors and lost writes.
#ifndef IDEM_STORES_LOG_FILE_SYSTEM_H_
#define IDEM_STORES_LOG_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

namespace idem::log {

// An append-only file. Not thread-safe: the log has one writer.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // kResourceExhausted for a full disk, kDataLoss for an I/O error; after an error the file's
  // tail is unknown and the caller must stop using it.
  virtual Status Append(std::string_view data) = 0;
  // fdatasync: everything appended so far is on disk when this returns ok.
  virtual Status Sync() = 0;
  // Bytes appended (the file may extend past them with reserved zeros).
  virtual std::uint64_t Size() const = 0;
  // Makes sure at least `ahead` bytes after Size() are zeros already on disk (written and
  // synced, extending by 2 * `ahead` when needed), so that Appends into them and their Syncs
  // change no file metadata: an fdatasync then writes the data alone, not also the inode.
  // Recovery cuts such a zero tail off. The default reserves nothing.
  virtual Status Reserve(std::uint64_t ahead) {
    (void)ahead;
    return OkStatus();
  }
  // Cuts reserved zeros off (the file ends at Size() again) and syncs that.
  virtual Status Trim() { return OkStatus(); }
  // Cuts the file to `size` (<= Size()), reserved zeros included, without syncing; later
  // Appends go at `size`. The cut bytes leave the page cache too, so no later reader sees them
  // (the writer's way to drop what a failed write or sync left there; see LogWriter::CutBack).
  virtual Status Truncate(std::uint64_t size) = 0;
};

// A whole file, read-only (mmap'd for the posix file system).
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual std::string_view Data() const = 0;
};

// Held while a store owns its directory; released on destruction.
class DirLock {
 public:
  virtual ~DirLock() = default;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual Status CreateDir(const std::string& path) = 0;
  // Exclusive, advisory lock (flock) on `path`, created if missing. kFailedPrecondition when
  // another process (or another store in this process) holds it.
  virtual Result<std::unique_ptr<DirLock>> Lock(const std::string& path) = 0;
  // The same for a reader that writes nothing (`idem store verify`): where this user may not
  // write the directory or LOCK (another user's store, a read-only mount), an existing LOCK is
  // locked opened for reading. Default: Lock.
  virtual Result<std::unique_ptr<DirLock>> LockForReading(const std::string& path) {
    return Lock(path);
  }
  virtual Result<std::vector<std::string>> List(const std::string& dir) = 0;
  virtual Result<std::unique_ptr<ReadableFile>> Read(const std::string& path) = 0;
  // Opens for appending, creating it when missing (a new file is fsynced into its directory).
  virtual Result<std::unique_ptr<WritableFile>> Append(const std::string& path) = 0;
  virtual Status Truncate(const std::string& path, std::uint64_t size) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual bool Exists(const std::string& path) = 0;

  static FileSystem& Posix();
};

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_FILE_SYSTEM_H_
