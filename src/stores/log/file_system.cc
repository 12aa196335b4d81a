#include "stores/log/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

namespace idem::log {
namespace {

Status Errno(std::string_view what, const std::string& path, int err) {
  std::string msg = std::string(what) + " " + path + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return ResourceExhaustedError(msg);
  if (err == EIO) return DataLossError(msg);
  if (err == ENOENT) return NotFoundError(msg);
  return UnavailableError(msg);
}

// An open file descriptor and the file's size.
Result<std::pair<int, std::uint64_t>> OpenSized(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return Errno("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Errno("stat", path, err);
  }
  return std::pair<int, std::uint64_t>(fd, static_cast<std::uint64_t>(st.st_size));
}

// Writes at the appended size with pwrite (not O_APPEND), so that appends can fill zeros
// reserved past it.
class PosixWritable final : public WritableFile {
 public:
  PosixWritable(int fd, std::string path, std::uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size), allocated_(size) {}
  ~PosixWritable() override { ::close(fd_); }

  Status Append(std::string_view data) override {
    IDEM_RETURN_IF_ERROR(WriteAt(data, size_));
    size_ += data.size();
    allocated_ = std::max(allocated_, size_);
    return OkStatus();
  }
  Status Sync() override {
    if (::fdatasync(fd_) != 0) return Errno("fdatasync", path_, errno);
    return OkStatus();
  }
  std::uint64_t Size() const override { return size_; }

  Status Reserve(std::uint64_t ahead) override {
    if (allocated_ - size_ >= ahead) return OkStatus();
    static const std::string zeros(std::size_t{1} << 20, '\0');
    const std::uint64_t end = size_ + 2 * ahead;
    const std::uint64_t before = allocated_;
    while (allocated_ < end) {
      const auto n =
          static_cast<std::size_t>(std::min<std::uint64_t>(zeros.size(), end - allocated_));
      if (Status s = WriteAt(std::string_view(zeros.data(), n), allocated_); !s.ok()) {
        // Out of space: what this call wrote goes back, so that the disk is not left full for
        // every other process on it (and for the store's own next batch).
        if (::ftruncate(fd_, static_cast<off_t>(before)) == 0) allocated_ = before;
        return s;
      }
      allocated_ += n;
    }
    return Sync();
  }
  Status Trim() override {
    if (allocated_ == size_) return OkStatus();
    if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) return Errno("truncate", path_, errno);
    allocated_ = size_;
    return Sync();
  }
  Status Truncate(std::uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return Errno("truncate", path_, errno);
    size_ = allocated_ = size;
    return OkStatus();
  }

 private:
  Status WriteAt(std::string_view data, std::uint64_t offset) {
    while (!data.empty()) {
      ssize_t n = ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_, errno);
      }
      offset += static_cast<std::uint64_t>(n);
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return OkStatus();
  }

  int fd_;
  std::string path_;
  std::uint64_t size_;       // appended
  std::uint64_t allocated_;  // the file's size: appended, then reserved zeros
};

class PosixReadable final : public ReadableFile {
 public:
  PosixReadable(void* base, std::size_t size) : base_(base), size_(size) {}
  ~PosixReadable() override {
    if (size_ > 0) ::munmap(base_, size_);
  }
  std::string_view Data() const override { return {static_cast<const char*>(base_), size_}; }

 private:
  void* base_;
  std::size_t size_;
};

// flock is per open file description, so two stores in one process would both get it; the
// set catches that case.
std::mutex held_mu;
std::set<std::string> held_paths;

class PosixLock final : public DirLock {
 public:
  PosixLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixLock() override {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
    std::lock_guard g(held_mu);
    held_paths.erase(path_);
  }

 private:
  int fd_;
  std::string path_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Status CreateDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return Errno("mkdir", path, errno);
    return OkStatus();
  }

  Result<std::unique_ptr<DirLock>> Lock(const std::string& path) override {
    return LockFile(path, /*for_reading=*/false);
  }
  Result<std::unique_ptr<DirLock>> LockForReading(const std::string& path) override {
    return LockFile(path, /*for_reading=*/true);
  }

  Result<std::unique_ptr<DirLock>> LockFile(const std::string& path, bool for_reading) {
    {
      std::lock_guard g(held_mu);
      if (!held_paths.insert(path).second) {
        return FailedPreconditionError(path + " is locked by another store in this process");
      }
    }
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 && for_reading && (errno == EACCES || errno == EROFS)) {
      // A directory this user may only read (a read-only mount, another user's store): an
      // existing LOCK locks as well opened for reading. Not for a writer: a store that cannot
      // write its directory fails here, clearly, rather than later.
      const int denied = errno;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) errno = denied;
    }
    // A reader shares the lock with other readers, and conflicts with a writer (LOCK_SH also
    // works on a descriptor opened for reading over NFS, where flock is an fcntl lock).
    if (fd < 0 || ::flock(fd, (for_reading ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
      int err = errno;
      if (fd >= 0) ::close(fd);
      std::lock_guard g(held_mu);
      held_paths.erase(path);
      if (err == EWOULDBLOCK) {
        return FailedPreconditionError(path + " is locked: another process has this store open");
      }
      return Errno("lock", path, err);
    }
    return std::unique_ptr<DirLock>(new PosixLock(fd, path));
  }

  Result<std::vector<std::string>> List(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Errno("opendir", dir, errno);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(std::move(name));
    }
    ::closedir(d);
    return names;
  }

  Result<std::unique_ptr<ReadableFile>> Read(const std::string& path) override {
    auto opened = OpenSized(path, O_RDONLY | O_CLOEXEC);
    if (!opened) return opened.error();
    const auto [fd, file_size] = *opened;
    auto size = static_cast<std::size_t>(file_size);
    void* base = nullptr;
    if (size > 0) {
      base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
      if (base == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        return Errno("mmap", path, err);
      }
      ::madvise(base, size, MADV_SEQUENTIAL);
    }
    ::close(fd);
    return std::unique_ptr<ReadableFile>(new PosixReadable(base, size));
  }

  Result<std::unique_ptr<WritableFile>> Append(const std::string& path) override {
    bool existed = Exists(path);
    auto opened = OpenSized(path, O_WRONLY | O_CREAT | O_CLOEXEC);
    if (!opened) return opened.error();
    const auto [fd, size] = *opened;
    auto file = std::make_unique<PosixWritable>(fd, path, size);
    if (!existed) {
      std::string dir = path.substr(0, path.find_last_of('/'));
      IDEM_RETURN_IF_ERROR(SyncDir(dir.empty() ? "." : dir));
    }
    return std::unique_ptr<WritableFile>(std::move(file));
  }

  Status Truncate(const std::string& path, std::uint64_t size) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", path, errno);
    Status s;
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      s = Errno("truncate", path, errno);
    } else if (::fdatasync(fd) != 0) {
      s = Errno("fdatasync", path, errno);
    }
    ::close(fd);
    return s;
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return Errno("rename", from, errno);
    return OkStatus();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("unlink", path, errno);
    return OkStatus();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Errno("open", dir, errno);
    Status s;
    if (::fsync(fd) != 0) s = Errno("fsync", dir, errno);
    ::close(fd);
    return s;
  }

  bool Exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
};

}  // namespace

FileSystem& FileSystem::Posix() {
  static PosixFileSystem fs;
  return fs;
}

}  // namespace idem::log
