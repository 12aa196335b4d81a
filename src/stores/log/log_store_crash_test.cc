// Crash safety of the log store under kill -9 (a process crash) at random moments.
//
// A child process drives the store with concurrent callers (begins, completions, releases) and
// writes every answer it was given to a pipe, after the store gave it. The parent kills the
// child with SIGKILL at a random moment, reopens the store, and checks that
// - every acknowledged completion replays with its response;
// - no key acknowledged as Acquired (and not since completed or released) can be acquired
//   again while its lease runs;
// - tokens handed out after the restart are above every acknowledged token.
// Runs IDEM_CRASH_RUNS times (default 50) with different seeds.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/stores/log.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kLease{3'600'000};  // no lease runs out during a test
constexpr int kThreads = 8;
constexpr int kKeysPerThread = 400;

std::string KeyName(int thread, int i) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x%08x%016x", thread, i, thread * 7919 + i);
  return buf;
}

// One line per acknowledged answer: "A key token intent", "C key token -", "R key token -".
// An Acquired line says what the worker will do next (C complete, R release, K keep it), so
// the parent knows whether the key may be free after the crash.
void Ack(int fd, char kind, const std::string& key, Token token, char intent = '-') {
  char line[128];
  int n = std::snprintf(line, sizeof line, "%c %s %llu %c\n", kind, key.c_str(),
                        static_cast<unsigned long long>(token), intent);
  // Shorter than PIPE_BUF: each line is written whole.
  if (::write(fd, line, static_cast<std::size_t>(n)) != n) _exit(3);
}

[[noreturn]] void Child(const std::string& dir, int fd, std::uint64_t seed) {
  LogStoreOptions o;
  o.dir = dir;
  o.sync = SyncMode::kAlways;
  o.segment_bytes = 64 << 10;  // many segments, so rotation is crashed into too
  o.compact_min_bytes = 256 << 10;
  o.warn = [](std::string_view) {};
  auto store = OpenLogStore(o);
  if (!store) {
    std::fprintf(stderr, "child: %s\n", store.error().ToString().c_str());
    _exit(2);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 131 + static_cast<std::uint64_t>(t));
      for (int round = 0;; ++round) {
        std::string key = KeyName(t, static_cast<int>(rng() % kKeysPerThread));
        auto a = (*store)->Begin({"crash", key, std::nullopt, kLease});
        if (!a) _exit(4);
        auto* acq = std::get_if<Acquired>(&*a);
        if (acq == nullptr) continue;
        const char intent = "CCRK"[rng() % 4];
        Ack(fd, 'A', key, acq->token, intent);
        switch (intent) {
          case 'C': {
            std::string response = "resp-" + key + "-" + std::to_string(acq->token);
            auto c = (*store)->Complete(
                {"crash", key, acq->token, Outcome::kSuccess, response, milliseconds(3'600'000)});
            if (!c || *c != WriteAnswer::kApplied) _exit(5);
            Ack(fd, 'C', key, acq->token);
            break;
          }
          case 'R': {
            auto r = (*store)->Release("crash", key, acq->token);
            if (!r || *r != WriteAnswer::kApplied) _exit(6);
            Ack(fd, 'R', key, acq->token);
            break;
          }
          default:
            break;  // left in progress
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  _exit(0);
}

struct KeyState {
  char last = 0;    // the kind of the newest acknowledged answer
  char intent = 0;  // for 'A': what the worker was about to do
  Token token = 0;
  Token max_token = 0;
};

int Runs() {
  const char* env = std::getenv("IDEM_CRASH_RUNS");
  return env != nullptr ? std::atoi(env) : 50;
}

TEST(LogStoreCrash, AcknowledgedAnswersSurviveKill9) {
  const std::string base = ::testing::TempDir() + "idem-crash-" + std::to_string(::getpid());
  std::filesystem::remove_all(base);
  std::filesystem::create_directories(base);
  std::uint64_t total_acks = 0;
  for (int run = 1; run <= Runs(); ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::string dir = base + "/run-" + std::to_string(run);
    std::mt19937_64 rng(static_cast<std::uint64_t>(run));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      Child(dir, fds[1], static_cast<std::uint64_t>(run));
    }
    ::close(fds[1]);
    // Read acknowledgements until the kill moment, then the rest of the pipe.
    std::string acks;
    auto kill_at = std::chrono::steady_clock::now() + milliseconds(30 + rng() % 300);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    char buf[1 << 16];
    bool killed = false;
    for (;;) {
      ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n > 0) {
        acks.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0) {
        break;
      } else if (!killed) {
        std::this_thread::sleep_for(milliseconds(1));
      }
      if (!killed && std::chrono::steady_clock::now() >= kill_at) {
        ::kill(pid, SIGKILL);
        killed = true;
      }
    }
    ::close(fds[0]);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the child ended on its own (status " << status << ") before the kill";

    std::map<std::string, KeyState> keys;
    std::istringstream in(acks);
    std::string line;
    while (std::getline(in, line)) {
      char kind, intent;
      char key[64];
      unsigned long long token;
      if (std::sscanf(line.c_str(), "%c %63s %llu %c", &kind, key, &token, &intent) != 4) {
        continue;  // the child died mid-line: never acknowledged
      }
      KeyState& k = keys[key];
      // Answers for one key come from one thread, in order.
      k.last = kind;
      k.intent = intent;
      k.token = token;
      k.max_token = std::max<Token>(k.max_token, token);
      ++total_acks;
    }

    LogStoreOptions o;
    o.dir = dir;
    o.warn = [](std::string_view) {};
    auto store = OpenLogStore(o);
    ASSERT_TRUE(store) << store.error().ToString();
    for (const auto& [key, k] : keys) {
      auto got = (*store)->Get("crash", key);
      ASSERT_TRUE(got) << got.error().ToString();
      if (k.last == 'C') {
        ASSERT_TRUE(got->has_value()) << key << " acknowledged completed, lost after the crash";
        EXPECT_EQ((*got)->state, RecordState::kCompleted) << key;
        EXPECT_EQ((*got)->token, k.token) << key;
        EXPECT_EQ((*got)->response, "resp-" + key + "-" + std::to_string(k.token)) << key;
      } else if (k.last == 'A' && k.intent != 'R') {
        // Acquired, to be completed or kept: still held, or completed just before the kill.
        // (One about to be released may be free again: its release may have been durable.)
        auto b = (*store)->Begin({"crash", key, std::nullopt, kLease});
        ASSERT_TRUE(b);
        EXPECT_FALSE(std::holds_alternative<Acquired>(*b))
            << key << " acknowledged Acquired (token " << k.token << ") was acquired again";
        ASSERT_TRUE(got->has_value()) << key << " acknowledged Acquired, lost after the crash";
        EXPECT_GE((*got)->token, k.token) << key;
      }
      // Whatever happens to the key now, its next token is above every acknowledged one.
      auto e = (*store)->Erase("crash", key);
      ASSERT_TRUE(e);
      auto again = (*store)->Begin({"crash", key, std::nullopt, kLease});
      ASSERT_TRUE(again);
      ASSERT_TRUE(std::holds_alternative<Acquired>(*again));
      EXPECT_GT(std::get<Acquired>(*again).token, k.max_token) << key;
    }
    store->reset();
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(base);
  EXPECT_GT(total_acks, 0u);
  std::printf("%d kill -9 runs, %llu acknowledged answers checked\n", Runs(),
              static_cast<unsigned long long>(total_acks));
}

}  // namespace
}  // namespace idem
