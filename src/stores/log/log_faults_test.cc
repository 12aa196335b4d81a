// The log store under the faults a disk really has: a failed fdatasync that leaves the bytes it
// did not write in the page cache, and power failures that persist a batch's pages out of order
// or part of a sync=none segment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/log_store_internal.h"
#include "stores/log/log_test_fixture.h"
#include "tests/support/fake_clock.h"
#include "tests/support/faulty_file_system.h"

namespace idem {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using testing::FakeClock;
using testing::FaultyFileSystem;
using ::testing::HasSubstr;

using log_testing::kLease;
using log_testing::kRetention;

class LogFaultsTest : public log_testing::LogTest {
 protected:
  void ExpectALostPageOfTheLastBatchCut(const std::function<std::size_t(std::size_t)>& lost_page);
};

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

// Under sync=always the last batch is written into zeros reserved (and synced) ahead of it. A
// power failure before its fdatasync can persist some of its pages and not others: never
// acknowledged, so a torn tail to cut off, not damage. The batch here is one completion of
// 16 000 bytes (four pages or more; one frame, so no other batch can take part of it: four
// completions of 4 000 bytes were split between two group commits once, on a loaded machine,
// when the flusher, awake after the begins' sync, took the first before the rest came);
// `lost_page(last)` says which page of the batch starting at `last` never got to the disk.
void LogFaultsTest::ExpectALostPageOfTheLastBatchCut(
    const std::function<std::size_t(std::size_t)>& lost_page) {
  std::vector<std::string> keys = {"b0"};
  {
    auto s = Open(Options());
    ASSERT_NE(s, nullptr);
    Cycle(*s, "k0");
    Cycle(*s, "k1");
    std::vector<BeginRequest> begins;
    for (const auto& k : keys) begins.push_back({"t", k, std::nullopt, kLease});
    auto acquired = s->BeginBatch(begins);
    const std::string response(16'000, 'r');
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
  ASSERT_GT(end - last, 3u * 4096) << "the completion is one batch of four pages or more";
  // The zeros reserved ahead of the log, and a page of the batch that never got there: its
  // share of the page, as what the page held before (an earlier batch's end) was synced.
  data.append(std::size_t{1} << 20, '\0');
  const std::size_t page = lost_page(last);
  ASSERT_LT(page + 4096, end);
  const std::size_t from = std::max(page, last);
  std::fill_n(data.begin() + static_cast<std::ptrdiff_t>(from), page + 4096 - from, '\0');
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

TEST_F(LogFaultsTest, ALastBatchWithAPageLostInItsMiddleIsATornTail) {
  ExpectALostPageOfTheLastBatchCut(
      [](std::size_t last) { return (last + log::kBatchHeaderSize + 4096) / 4096 * 4096; });
}

// The page that holds the batch's header is the lost one: its length went with it.
TEST_F(LogFaultsTest, ALastBatchWhoseHeaderPageWasLostIsATornTail) {
  ExpectALostPageOfTheLastBatchCut([](std::size_t last) { return last / 4096 * 4096; });
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

// Under sync=interval and none the kernel writes back what was not synced in any order: a
// power failure can keep a later batch and lose an earlier one. The batches' sync marks tell
// that loss from damage, so the store opens (it used to refuse, as if damaged), keeps every
// change a sync covered, and keeps a prefix of the rest.
TEST_F(LogFaultsTest, PagesLostOutOfOrderBeforeASyncAreCutOnOpen) {
  constexpr int kSynced = 10;
  constexpr int kKeys = 40;
  int cut_with_later_batches = 0;
  for (const SyncMode mode : {SyncMode::kInterval, SyncMode::kNone}) {
    for (std::uint64_t seed = 1; seed <= 12; ++seed) {
      SCOPED_TRACE(std::string(mode == SyncMode::kNone ? "none" : "interval") + ", seed " +
                   std::to_string(seed));
      fs::remove_all(dir_);
      warnings_.clear();
      FaultyFileSystem faulty;
      LogStoreOptions o = Options(mode);
      o.sync_interval = std::chrono::hours(1);  // no sync but the ones below
      // Each response spans pages, so a lost page takes part of a batch.
      auto cycle = [&](Store& s, int i) {
        const std::string key = "k" + std::to_string(i);
        auto c = s.Complete({"t", key, Acquire(s, key), Outcome::kSuccess,
                             std::string(3000, static_cast<char>('a' + i % 26)), kRetention});
        ASSERT_TRUE(c && *c == WriteAnswer::kApplied) << key;
      };
      {
        auto s = Open(o, faulty);
        ASSERT_NE(s, nullptr);
        for (int i = 0; i < kSynced; ++i) cycle(*s, i);
      }
      {
        // Opening syncs the active segment: the first kSynced keys are on disk now.
        auto s = Open(o, faulty);
        ASSERT_NE(s, nullptr);
        for (int i = kSynced; i < kKeys; ++i) {
          cycle(*s, i);
          // Under none, let the flusher write batches apart.
          if (mode == SyncMode::kNone && i % 4 == 0) std::this_thread::sleep_for(milliseconds(2));
        }
        faulty.PowerFailLosingPages(seed, 0.7);
      }
      // verify agrees with the open: a tail to cut, no damage.
      auto verify = VerifyLogStore(dir_);
      ASSERT_TRUE(verify) << verify.error().ToString();
      EXPECT_TRUE(verify->ok()) << (verify->damage.empty() ? "" : verify->damage[0]);
      auto s = Open(Options(mode));
      ASSERT_NE(s, nullptr);
      const bool cut_unsynced =
          std::any_of(warnings_.begin(), warnings_.end(), [](const std::string& w) {
            return w.find("before any sync covered it") != std::string::npos;
          });
      EXPECT_EQ(verify->lost_unsynced, cut_unsynced);
      if (cut_unsynced) {
        EXPECT_TRUE(verify->torn_tail);
      }
      for (int i = 0; i < kSynced; ++i) EXPECT_TRUE(Replays(*s, "k" + std::to_string(i))) << i;
      int kept = kSynced;
      while (kept < kKeys && Replays(*s, "k" + std::to_string(kept))) ++kept;
      for (int i = kept + 1; i < kKeys; ++i) {
        EXPECT_FALSE(Replays(*s, "k" + std::to_string(i))) << i << " after a lost " << kept;
      }
      if (cut_unsynced) ++cut_with_later_batches;
    }
  }
  // The case this is about happened: a lost batch with intact ones after it.
  EXPECT_GT(cut_with_later_batches, 0);
}

}  // namespace
}  // namespace idem
