#include "tests/support/faulty_file_system.h"

namespace idem::testing {

class FaultyFile final : public log::WritableFile {
 public:
  FaultyFile(FaultyFileSystem& fs, std::string path, std::unique_ptr<log::WritableFile> real)
      : fs_(fs), path_(std::move(path)), real_(std::move(real)) {}

  Status Append(std::string_view data) override {
    if (fs_.dead_.load()) return DataLossError("write " + path_ + ": power failed");
    std::int64_t left = fs_.append_budget_.fetch_sub(static_cast<std::int64_t>(data.size()));
    if (left < static_cast<std::int64_t>(data.size())) {
      // A full disk takes what fits, then fails: the tail is torn.
      if (left > 0) (void)real_->Append(data.substr(0, static_cast<std::size_t>(left)));
      return ResourceExhaustedError("write " + path_ + ": No space left on device");
    }
    return real_->Append(data);
  }
  Status Sync() override {
    if (fs_.dead_.load()) return DataLossError("fdatasync " + path_ + ": power failed");
    if (fs_.fail_syncs_.load()) return DataLossError("fdatasync " + path_ + ": Input/output error");
    IDEM_RETURN_IF_ERROR(real_->Sync());
    fs_.syncs_.fetch_add(1);
    std::lock_guard g(fs_.mu_);
    fs_.synced_[path_] = real_->Size();
    return OkStatus();
  }
  std::uint64_t Size() const override { return real_->Size(); }

 private:
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
    synced_.try_emplace(path, (*real)->Size());
  }
  return std::unique_ptr<log::WritableFile>(new FaultyFile(*this, path, std::move(*real)));
}

Status FaultyFileSystem::Rename(const std::string& from, const std::string& to) {
  IDEM_RETURN_IF_ERROR(real_.Rename(from, to));
  renames_.fetch_add(1);
  std::lock_guard g(mu_);
  if (auto it = synced_.find(from); it != synced_.end()) {
    synced_[to] = it->second;
    synced_.erase(it);
  }
  return OkStatus();
}

void FaultyFileSystem::PowerFail() {
  dead_.store(true);
  std::lock_guard g(mu_);
  for (const auto& [path, size] : synced_) {
    if (real_.Exists(path)) (void)real_.Truncate(path, size);
  }
}

}  // namespace idem::testing
