#include "tests/support/faulty_file_system.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

namespace idem::testing {
namespace {

using Ranges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

// Removes [begin, end) from `ranges`.
void Subtract(Ranges& ranges, std::uint64_t begin, std::uint64_t end) {
  Ranges out;
  for (const auto& [b, e] : ranges) {
    if (e <= begin || b >= end) {
      out.emplace_back(b, e);
      continue;
    }
    if (b < begin) out.emplace_back(b, begin);
    if (e > end) out.emplace_back(end, e);
  }
  ranges = std::move(out);
}

void Clip(Ranges& ranges, std::uint64_t size) { Subtract(ranges, size, UINT64_MAX); }

std::uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<std::uint64_t>(size);
}

void WriteZeros(const std::string& path, std::uint64_t begin, std::uint64_t end) {
  if (end <= begin) return;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(begin));
  const std::string zeros(static_cast<std::size_t>(end - begin), '\0');
  f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
}

}  // namespace

class FaultyFile final : public log::WritableFile {
 public:
  FaultyFile(FaultyFileSystem& fs, std::string path, std::unique_ptr<log::WritableFile> real)
      : fs_(fs), path_(std::move(path)), real_(std::move(real)) {}

  Status Append(std::string_view data) override {
    if (fs_.dead_.load()) return DataLossError("write " + path_ + ": power failed");
    const std::uint64_t at = real_->Size();
    std::int64_t left = fs_.append_budget_.fetch_sub(static_cast<std::int64_t>(data.size()));
    if (left < static_cast<std::int64_t>(data.size())) {
      // A full disk takes what fits, then fails: the tail is torn.
      if (left > 0 && real_->Append(data.substr(0, static_cast<std::size_t>(left))).ok()) {
        Written(at, at + static_cast<std::uint64_t>(left));
      }
      return ResourceExhaustedError("write " + path_ + ": No space left on device");
    }
    IDEM_RETURN_IF_ERROR(real_->Append(data));
    Written(at, at + data.size());
    return OkStatus();
  }
  Status Sync() override {
    if (fs_.dead_.load()) return DataLossError("fdatasync " + path_ + ": power failed");
    if (fs_.fail_syncs_.load()) {
      // Linux marks the pages it could not write clean and keeps them: readable until the
      // power fails.
      std::lock_guard g(fs_.mu_);
      FaultyFileSystem::FileState& st = fs_.files_[path_];
      st.lost.insert(st.lost.end(), st.dirty.begin(), st.dirty.end());
      st.dirty.clear();
      return DataLossError("fdatasync " + path_ + ": Input/output error");
    }
    IDEM_RETURN_IF_ERROR(real_->Sync());
    fs_.syncs_.fetch_add(1);
    Synced();
    return OkStatus();
  }
  std::uint64_t Size() const override { return real_->Size(); }
  Status Reserve(std::uint64_t ahead) override {
    if (fs_.dead_.load()) return DataLossError("write " + path_ + ": power failed");
    if (fs_.fail_syncs_.load()) return DataLossError("fdatasync " + path_ + ": Input/output error");
    if (fs_.fail_reserves_.load()) {
      return ResourceExhaustedError("write " + path_ + ": No space left on device");
    }
    const std::uint64_t before = FileSize(path_);
    IDEM_RETURN_IF_ERROR(real_->Reserve(ahead));
    const std::uint64_t after = FileSize(path_);
    if (after != before) {  // it wrote zeros and synced them
      std::lock_guard g(fs_.mu_);
      Subtract(fs_.files_[path_].lost, before, after);
    }
    if (after != before) Synced();
    return OkStatus();
  }
  Status Trim() override {
    if (fs_.dead_.load()) return DataLossError("truncate " + path_ + ": power failed");
    if (fs_.fail_syncs_.load()) return DataLossError("fdatasync " + path_ + ": Input/output error");
    const std::uint64_t before = FileSize(path_);
    IDEM_RETURN_IF_ERROR(real_->Trim());
    if (FileSize(path_) != before) Synced();  // it cut reserved zeros and synced
    return OkStatus();
  }
  Status Truncate(std::uint64_t size) override {
    if (fs_.dead_.load()) return DataLossError("truncate " + path_ + ": power failed");
    IDEM_RETURN_IF_ERROR(real_->Truncate(size));
    // The cut pages leave the cache; the file's size on disk changes only with a sync.
    std::lock_guard g(fs_.mu_);
    FaultyFileSystem::FileState& st = fs_.files_[path_];
    Clip(st.dirty, size);
    Clip(st.lost, size);
    return OkStatus();
  }

 private:
  void Written(std::uint64_t begin, std::uint64_t end) {
    std::lock_guard g(fs_.mu_);
    FaultyFileSystem::FileState& st = fs_.files_[path_];
    Subtract(st.lost, begin, end);  // written again: its sync decides now
    st.dirty.emplace_back(begin, end);
  }
  void Synced() {
    const std::uint64_t size = FileSize(path_);
    std::lock_guard g(fs_.mu_);
    FaultyFileSystem::FileState& st = fs_.files_[path_];
    st.dirty.clear();
    Clip(st.lost, size);
    st.durable_size = size;
  }

  FaultyFileSystem& fs_;
  std::string path_;
  std::unique_ptr<log::WritableFile> real_;
};

Result<std::unique_ptr<log::WritableFile>> FaultyFileSystem::Append(const std::string& path) {
  if (dead_.load()) return DataLossError("open " + path + ": power failed");
  auto real = real_.Append(path);
  if (!real) return real.error();
  {
    std::lock_guard g(mu_);
    files_.try_emplace(path, FileState{FileSize(path), {}, {}});
  }
  return std::unique_ptr<log::WritableFile>(new FaultyFile(*this, path, std::move(*real)));
}

Status FaultyFileSystem::Truncate(const std::string& path, std::uint64_t size) {
  IDEM_RETURN_IF_ERROR(real_.Truncate(path, size));  // ftruncate, then fdatasync
  std::lock_guard g(mu_);
  if (auto it = files_.find(path); it != files_.end()) {
    it->second.dirty.clear();
    Clip(it->second.lost, size);
    it->second.durable_size = size;
  }
  return OkStatus();
}

Status FaultyFileSystem::Rename(const std::string& from, const std::string& to) {
  IDEM_RETURN_IF_ERROR(real_.Rename(from, to));
  renames_.fetch_add(1);
  std::lock_guard g(mu_);
  if (auto it = files_.find(from); it != files_.end()) {
    files_[to] = std::move(it->second);
    files_.erase(from);
  }
  return OkStatus();
}

Status FaultyFileSystem::Remove(const std::string& path) {
  IDEM_RETURN_IF_ERROR(real_.Remove(path));
  std::lock_guard g(mu_);
  files_.erase(path);
  return OkStatus();
}

void FaultyFileSystem::PowerFail(double written_back) {
  dead_.store(true);
  std::lock_guard g(mu_);
  for (const auto& [path, st] : files_) {
    if (!real_.Exists(path)) continue;
    const std::uint64_t size = FileSize(path);
    std::uint64_t end = st.durable_size;
    if (size > end) {
      end += static_cast<std::uint64_t>(static_cast<double>(size - end) * written_back);
    }
    for (const auto& [b, e] : st.lost) WriteZeros(path, b, std::min(e, size));
    // Dirty bytes within the size on disk are overwrites (of reserved zeros, or of bytes a
    // truncate cut) that never got there; dirty bytes past it were kept up to `end`.
    for (const auto& [b, e] : st.dirty) {
      WriteZeros(path, b, std::min({e, size, st.durable_size}));
    }
    if (size != end) (void)real_.Truncate(path, end);  // extends with zeros if it was cut
  }
}

void FaultyFileSystem::PowerFailLosingPages(std::uint64_t seed, double kept) {
  dead_.store(true);
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution reached(kept);
  constexpr std::uint64_t kPage = 4096;
  std::lock_guard g(mu_);
  for (const auto& [path, st] : files_) {
    if (!real_.Exists(path)) continue;
    const std::uint64_t size = FileSize(path);
    for (const auto& [b, e] : st.lost) WriteZeros(path, b, std::min(e, size));
    // The writes into each page, in the order they were made. A page reaches the disk whole,
    // as it was at one moment: the writes into it up to then are there, the later ones not.
    std::map<std::uint64_t, Ranges> pages;
    for (const auto& [b, e] : st.dirty) {
      for (std::uint64_t page = b / kPage * kPage; page < std::min(e, size); page += kPage) {
        pages[page].emplace_back(std::max(b, page), std::min({e, size, page + kPage}));
      }
    }
    for (const auto& [page, writes] : pages) {
      std::size_t there = writes.size();
      if (!reached(rng)) there = std::uniform_int_distribution<std::size_t>(0, there - 1)(rng);
      for (std::size_t i = there; i < writes.size(); ++i) {
        WriteZeros(path, writes[i].first, writes[i].second);
      }
    }
  }
}

}  // namespace idem::testing
