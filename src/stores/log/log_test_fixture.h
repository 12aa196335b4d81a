// What the log store's test suites share: a store directory of the test's own, options with a
// fake clock and a warning collector, and the few things every test does to a store or its
// files.
#ifndef IDEM_STORES_LOG_LOG_TEST_FIXTURE_H_
#define IDEM_STORES_LOG_LOG_TEST_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/log_store_internal.h"
#include "tests/support/fake_clock.h"

namespace idem::log_testing {

inline constexpr std::chrono::milliseconds kLease{60'000};
inline constexpr std::chrono::milliseconds kRetention{3'600'000};

class LogTest : public ::testing::Test {
 protected:
  LogTest() {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "idem-" + test->test_suite_name() + "-" +
           std::to_string(::getpid()) + "-" + test->name();
    std::filesystem::remove_all(dir_);
  }
  ~LogTest() override { std::filesystem::remove_all(dir_); }

  LogStoreOptions Options(SyncMode sync = SyncMode::kAlways) {
    LogStoreOptions o;
    o.dir = dir_;
    o.sync = sync;
    o.clock = &clock_;
    o.reclaim_interval = std::chrono::milliseconds(0);
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
    ASSERT_NE(token, Token{});
    auto c = s.Complete({"t", key, token, Outcome::kSuccess, "response-" + key, kRetention});
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_EQ(*c, WriteAnswer::kApplied);
  }
  // Whether `key` replays (whatever its response).
  bool Replays(Store& s, const std::string& key) {
    auto r = s.Begin({"t", key, std::nullopt, kLease});
    EXPECT_TRUE(r) << r.error().ToString();
    return r && std::holds_alternative<Replay>(*r);
  }
  // `key` replays the response Cycle stored.
  void ExpectReplay(Store& s, const std::string& key) {
    auto r = s.Begin({"t", key, std::nullopt, kLease});
    ASSERT_TRUE(r) << r.error().ToString();
    ASSERT_TRUE(std::holds_alternative<Replay>(*r)) << key << ": " << BeginAnswerName(*r);
    EXPECT_EQ(std::get<Replay>(*r).response, "response-" + key);
  }

  std::vector<std::string> Segments() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().extension() == ".log") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Offsets of the batches in a segment's bytes; `end` (if not null): the end of the last one.
  static std::vector<std::size_t> BatchOffsets(std::string_view data, std::size_t* end = nullptr) {
    std::vector<std::size_t> out;
    std::size_t pos = log::kFileHeaderSize;
    while (pos + log::kBatchHeaderSize <= data.size()) {
      std::uint32_t bytes;
      std::memcpy(&bytes, data.data() + pos + 20, 4);
      out.push_back(pos);
      pos += log::kBatchHeaderSize + bytes;
    }
    if (end != nullptr) *end = pos;
    return out;
  }
  // The offset of batch `n` (0: the first).
  static std::size_t BatchOffset(std::string_view data, std::size_t n) {
    return BatchOffsets(data).at(n);
  }

  testing::FakeClock clock_;
  std::string dir_;
  std::vector<std::string> warnings_;
};

}  // namespace idem::log_testing

#endif  // IDEM_STORES_LOG_LOG_TEST_FIXTURE_H_
