// FaultyFileSystem: the log store's file layer over the real disk, with injected faults:
// a full disk after a byte budget, I/O errors on write or sync, and a simulated power failure
// that drops every byte not yet fdatasync'ed.
//
// It models the page cache as Linux keeps it: a failed sync leaves the bytes it did not write
// readable (the kernel marks those pages clean and keeps them) until the power fails, when
// they read as zeros, unless they were written again and synced meanwhile.
#ifndef IDEM_TESTS_SUPPORT_FAULTY_FILE_SYSTEM_H_
#define IDEM_TESTS_SUPPORT_FAULTY_FILE_SYSTEM_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "stores/log/file_system.h"

namespace idem::testing {

class FaultyFileSystem final : public log::FileSystem {
 public:
  explicit FaultyFileSystem(log::FileSystem& real = log::FileSystem::Posix()) : real_(real) {}

  // Appends fail with ENOSPC (kResourceExhausted) once `bytes` more bytes were appended.
  void FailAppendsAfter(std::uint64_t bytes) {
    append_budget_.store(static_cast<std::int64_t>(bytes));
  }
  // Syncs fail with EIO (kDataLoss).
  void FailSyncs(bool on) { fail_syncs_.store(on); }
  // Reserving space ahead of a file's data fails with ENOSPC (kResourceExhausted), as on a disk
  // with less room left than the reservation; appends go on as before.
  void FailReserves(bool on) { fail_reserves_.store(on); }
  // Power failure: every file gets back the size it had at its last sync, every byte written
  // but not synced since, or whose sync failed, reads as zeros, and every later write or sync
  // through this file system fails. `written_back` (0..1) of each file's growth since its last
  // sync reached the disk anyway (the kernel had written it back): the file then ends there,
  // usually in the middle of a batch.
  void PowerFail(double written_back = 0);
  // Power failure with write-back in any order, as the kernel does it: every 4 KiB page written
  // since the last sync reached the disk as it is now with probability `kept`; otherwise as it
  // was after some earlier number of the writes into it (none, possibly), the bytes of the
  // later ones reading as zeros (chosen by `seed`). Every file keeps the size it has. Lost
  // bytes (a failed sync's) read as zeros, and later writes and syncs fail, as with PowerFail.
  void PowerFailLosingPages(std::uint64_t seed, double kept);
  std::uint64_t syncs() const { return syncs_.load(); }
  // Renames done so far (the log store renames each snapshot it writes into place).
  std::uint64_t renames() const { return renames_.load(); }

  Status CreateDir(const std::string& path) override { return real_.CreateDir(path); }
  Result<std::unique_ptr<log::DirLock>> Lock(const std::string& path) override {
    return real_.Lock(path);
  }
  Result<std::vector<std::string>> List(const std::string& dir) override { return real_.List(dir); }
  Result<std::unique_ptr<log::ReadableFile>> Read(const std::string& path) override {
    return real_.Read(path);
  }
  Result<std::unique_ptr<log::WritableFile>> Append(const std::string& path) override;
  Status Truncate(const std::string& path, std::uint64_t size) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& dir) override { return real_.SyncDir(dir); }
  bool Exists(const std::string& path) override { return real_.Exists(path); }

 private:
  friend class FaultyFile;
  log::FileSystem& real_;
  std::atomic<std::int64_t> append_budget_{INT64_MAX};
  std::atomic<bool> fail_syncs_{false};
  std::atomic<bool> fail_reserves_{false};
  std::atomic<bool> dead_{false};
  std::atomic<std::uint64_t> syncs_{0};
  std::atomic<std::uint64_t> renames_{0};
  using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;  // [begin, end)
  struct FileState {
    std::uint64_t durable_size = 0;  // the file's size (reserved zeros too) at its last sync
    Ranges dirty;                    // written since the last sync
    Ranges lost;                     // written, then a sync failed: gone in a power failure
  };
  std::mutex mu_;
  std::map<std::string, FileState> files_;  // guarded by mu_
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_FAULTY_FILE_SYSTEM_H_
