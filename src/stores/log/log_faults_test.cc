// The log store under the faults a disk really has: a failed fdatasync that leaves the bytes it
// did not write in the page cache, and power failures that persist a batch's pages out of order
// or part of a sync=none segment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/log_store_internal.h"
#include "tests/support/fake_clock.h"
#include "tests/support/faulty_file_system.h"

namespace idem {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::FakeClock;
using testing::FaultyFileSystem;
using ::testing::HasSubstr;

constexpr milliseconds kLease{60'000};
constexpr milliseconds kRetention{3'600'000};

class LogFaultsTest : public ::testing::Test {
 protected:
  LogFaultsTest() {
    dir_ = ::testing::TempDir() + "idem-log-faults-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  ~LogFaultsTest() override { fs::remove_all(dir_); }

  LogStoreOptions Options(SyncMode sync = SyncMode::kAlways) {
    LogStoreOptions o;
    o.dir = dir_;
    o.sync = sync;
    o.clock = &clock_;
    o.reclaim_interval = milliseconds(0);
    o.warn = [this](std::string_view w) { warnings_.emplace_back(w); };
    return o;
  }
  std::unique_ptr<Store> Open(const LogStoreOptions& o, log::FileSystem& files) {
    auto s = log::OpenLogStoreWith(o, files);
    EXPECT_TRUE(s) << s.error().ToString();
    return s ? std::move(*s) : nullptr;
  }
  std::unique_ptr<Store> Open(const LogStoreOptions& o) {
    return Open(o, log::FileSystem::Posix());
  }
  Token Acquire(Store& s, const std::string& key) {
    auto a = s.Begin({"t", key, std::nullopt, kLease});
    EXPECT_TRUE(a && std::holds_alternative<Acquired>(*a)) << key;
    return a && std::holds_alternative<Acquired>(*a) ? std::get<Acquired>(*a).token : Token{};
  }
  // Begins and completes `key` with a response naming it.
  void Cycle(Store& s, const std::string& key) {
    const Token token = Acquire(s, key);
    auto c = s.Complete({"t", key, token, Outcome::kSuccess, "response-" + key, kRetention});
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_EQ(*c, WriteAnswer::kApplied);
  }
  bool Replays(Store& s, const std::string& key) {
    auto r = s.Begin({"t", key, std::nullopt, kLease});
    EXPECT_TRUE(r) << r.error().ToString();
    return r && std::holds_alternative<Replay>(*r);
  }
  std::vector<std::string> Segments() {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().extension() == ".log") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  FakeClock clock_;
  std::string dir_;
  std::vector<std::string> warnings_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A failed fdatasync leaves the batch it did not write readable in the page cache. A reopen in
// the same boot must not replay it (its caller was told kDataLoss), and must not append after
// it either: after a power failure it reads as zeros, and the later batches behind it would
// make the log look damaged.
TEST_F(LogFaultsTest, ACompletionWhoseSyncFailedIsNeverReplayedAndThePowerFailureAfterIsSurvived) {
  FaultyFileSystem faulty;
  {
    auto s = Open(Options(), faulty);
    ASSERT_NE(s, nullptr);
    Cycle(*s, "before");
    const Token token = Acquire(*s, "k");
    faulty.FailSyncs(true);
    auto c = s->Complete({"t", "k", token, Outcome::kSuccess, "response-k", kRetention});
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code(), StatusCode::kDataLoss);
  }
  faulty.FailSyncs(false);
  {
    // Same boot, same page cache.
    auto s = Open(Options(), faulty);
    ASSERT_NE(s, nullptr);
    auto r = s->Begin({"t", "k", std::nullopt, kLease});
    ASSERT_TRUE(r) << r.error().ToString();
    EXPECT_TRUE(std::holds_alternative<Busy>(*r))
        << "the failed completion came back as " << BeginAnswerName(*r);
    Cycle(*s, "after");
  }
  faulty.PowerFail();
  auto s = Open(Options());
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(Replays(*s, "before"));
  EXPECT_TRUE(Replays(*s, "after"));
  EXPECT_FALSE(Replays(*s, "k"));
}

// Offsets of the batches in a segment, and the end of the last one.
std::vector<std::size_t> BatchOffsets(std::string_view data, std::size_t* end) {
  std::vector<std::size_t> out;
  std::size_t pos = log::kFileHeaderSize;
  while (pos + log::kBatchHeaderSize <= data.size()) {
    std::uint32_t bytes;
    std::memcpy(&bytes, data.data() + pos + 20, 4);
    out.push_back(pos);
    pos += log::kBatchHeaderSize + bytes;
  }
  *end = pos;
  return out;
}

// Under sync=always the last batch is written into zeros reserved (and synced) ahead of it. A
// power failure before its fdatasync can persist its first and third pages but not its second:
// never acknowledged, so a torn tail to cut off, not damage.
TEST_F(LogFaultsTest, ALastBatchWithAPageLostInItsMiddleIsATornTail) {
  std::vector<std::string> keys = {"b0", "b1", "b2", "b3"};
  {
    auto s = Open(Options());
    ASSERT_NE(s, nullptr);
    Cycle(*s, "k0");
    Cycle(*s, "k1");
    std::vector<BeginRequest> begins;
    for (const auto& k : keys) begins.push_back({"t", k, std::nullopt, kLease});
    auto acquired = s->BeginBatch(begins);
    const std::string response(4000, 'r');
    std::vector<CompleteRequest> completes;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(acquired[i] && std::holds_alternative<Acquired>(*acquired[i]));
      completes.push_back({"t", keys[i], std::get<Acquired>(*acquired[i]).token, Outcome::kSuccess,
                           response, kRetention});
    }
    for (const auto& c : s->CompleteBatch(completes)) ASSERT_TRUE(c && *c == WriteAnswer::kApplied);
  }
  const std::string seg = Segments().back();
  std::string data = ReadAll(seg);
  std::size_t end = 0;
  const std::vector<std::size_t> batches = BatchOffsets(data, &end);
  ASSERT_EQ(end, data.size());
  const std::size_t last = batches.back();
  ASSERT_GT(end - last, 3u * 4096) << "the four completions are one batch of four pages or more";
  // The zeros reserved ahead of the log, and a page of the batch that never got there.
  data.append(std::size_t{1} << 20, '\0');
  const std::size_t page = (last + log::kBatchHeaderSize + 4096) / 4096 * 4096;
  ASSERT_LT(page + 4096, end);
  std::fill_n(data.begin() + static_cast<std::ptrdiff_t>(page), 4096, '\0');
  std::ofstream(seg, std::ios::binary | std::ios::trunc) << data;

  auto s = Open(Options());
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(Replays(*s, "k0"));
  EXPECT_TRUE(Replays(*s, "k1"));
  for (const auto& k : keys) EXPECT_FALSE(Replays(*s, k)) << k;
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_THAT(warnings_[0], HasSubstr("torn batch at the tail"));
  EXPECT_THAT(warnings_[0], HasSubstr(seg + " offset " + std::to_string(last)));
}

// Under sync=none nothing is synced but a rotation: a power failure may leave any segment with
// only part of what was written to it. Only the last one may be torn (recovery refuses a torn
// segment that is not the last), so a rotation syncs the segment it closes.
TEST_F(LogFaultsTest, SyncNoneSurvivesAPowerFailureAfterRotations) {
  FaultyFileSystem faulty;
  constexpr int kKeys = 60;
  {
    LogStoreOptions o = Options(SyncMode::kNone);
    o.segment_bytes = 4096;
    auto s = Open(o, faulty);
    ASSERT_NE(s, nullptr);
    // Large enough that the flusher writes many batches (it lets one fill to 256 KiB), and
    // nearly every batch closes a segment.
    const std::string response(40'000, 'r');
    for (int i = 0; i < kKeys; ++i) {
      const std::string key = "k" + std::to_string(i);
      auto c = s->Complete({"t", key, Acquire(*s, key), Outcome::kSuccess, response, kRetention});
      ASSERT_TRUE(c && *c == WriteAnswer::kApplied);
    }
  }
  ASSERT_GE(Segments().size(), 3u);
  // Half of what each file grew by since its last sync reached the disk.
  faulty.PowerFail(0.5);
  auto s = Open(Options(SyncMode::kNone));
  ASSERT_NE(s, nullptr);
  // What survives is a prefix of what was written: the closed segments, and part of the last.
  int kept = 0;
  while (kept < kKeys && Replays(*s, "k" + std::to_string(kept))) ++kept;
  EXPECT_GE(kept, kKeys / 2);
  for (int i = kept + 1; i < kKeys; ++i) EXPECT_FALSE(Replays(*s, "k" + std::to_string(i))) << i;
}

}  // namespace
}  // namespace idem
