// End-to-end tests of the `idem` command-line tool: each test runs the built binary as a
// separate process and checks what it prints and its exit status.
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idem/fingerprint.h"
#include "idem/record.h"
#include "idem/store.h"
#include "idem/stores/log.h"
#include "stores/log/batch.h"
#include "stores/log/files.h"
#include "tests/support/fake_clock.h"

extern char** environ;

namespace idem {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using namespace std::chrono_literals;

// Records the CLI reads later in the test: kept far longer than any test runs (the stores take
// at most 10 years).
constexpr std::chrono::milliseconds kFiveYears{5LL * 365 * 24 * 3600 * 1000};

struct ProcessRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `idem args...` with standard input from `stdin_path` and returns what it printed.
// With `stderr_tty`, its stderr is a pseudo-terminal and `err` holds what the terminal got.
// `runner`: a command that runs idem (setpriv as another user), or none.
ProcessRun RunIdem(const std::vector<std::string>& args,
                   const std::string& stdin_path = "/dev/null", bool stderr_tty = false,
                   const std::vector<std::string>& runner = {}) {
  ProcessRun run;
  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(::pipe2(out_pipe, O_CLOEXEC), 0);
  int err_read = -1, err_write = -1;
  if (stderr_tty) {
    EXPECT_EQ(::openpty(&err_read, &err_write, nullptr, nullptr, nullptr), 0);
    ::fcntl(err_read, F_SETFD, FD_CLOEXEC);
    ::fcntl(err_write, F_SETFD, FD_CLOEXEC);
  } else {
    EXPECT_EQ(::pipe2(err_pipe, O_CLOEXEC), 0);
    err_read = err_pipe[0];
    err_write = err_pipe[1];
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_write, 2);
  std::vector<std::string> words = runner;
  words.push_back(IDEM_CLI_PATH);
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned =
      ::posix_spawn(&pid, words[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_write);
  EXPECT_EQ(spawned, 0) << "cannot run " << IDEM_CLI_PATH;
  // Read both until end of file (a pty reports EIO once the child has closed it).
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_read, POLLIN, 0}};
  std::string* sinks[2] = {&run.out, &run.err};
  int open_fds = 2;
  while (spawned == 0 && open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  ::close(out_pipe[0]);
  ::close(err_read);
  int status = 0;
  if (spawned == 0 && ::waitpid(pid, &status, 0) == pid) {
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return run;
}

std::ostream& operator<<(std::ostream& os, const ProcessRun& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

std::string Hex(const Fingerprint& f) { return f.Hex(); }

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("idem_cli_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }

  fs::path dir_;
};

// ---- usage ----------------------------------------------------------------------------------

TEST_F(CliTest, NoArgumentsIsUsageError) {
  ProcessRun r = RunIdem({});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("usage: idem COMMAND"));
  EXPECT_THAT(r.out, IsEmpty());
}

TEST_F(CliTest, UnknownCommandIsUsageError) {
  ProcessRun r = RunIdem({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("unknown command \"frobnicate\""), HasSubstr("usage:")));
  r = RunIdem({"store", "polish", "/tmp"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("unknown subcommand \"polish\""), HasSubstr("store verify")));
  r = RunIdem({"store"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("missing subcommand"));
}

TEST_F(CliTest, MissingOrExtraArgumentsAreUsageErrors) {
  ProcessRun r = RunIdem({"get", "memory:"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("idem get: missing SCOPE and KEY"),
                           HasSubstr("usage: idem get STORE_URL SCOPE KEY")));
  r = RunIdem({"store", "verify"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("missing DIR"));
  for (const char* url : {"postgres://h/db", "redis://h:1", "memory:"}) {
    r = RunIdem({"store", "repair", url});
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_THAT(r.err, HasSubstr("is not a log store: verify and repair take a log store's"));
  }
  r = RunIdem({"stats", "memory:", "extra"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("unexpected argument \"extra\""));
}

TEST_F(CliTest, BadFlagsAreUsageErrors) {
  ProcessRun r = RunIdem({"list", "memory:", "--colour"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("unknown flag --colour"));
  r = RunIdem({"list", "memory:", "--limit"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--limit needs a value"));
  r = RunIdem({"list", "memory:", "--limit", "0"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("bad count \"0\""));
  r = RunIdem({"list", "memory:", "--older-than", "5 minutes"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("\"5 minutes\" is not a duration"));
  r = RunIdem({"list", "memory:", "--state", "done"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("bad --state \"done\""));
}

TEST_F(CliTest, HelpOnEveryCommandExitsZero) {
  const std::vector<std::vector<std::string>> commands = {
      {},
      {"fingerprint"},
      {"get"},
      {"list"},
      {"erase"},
      {"purge"},
      {"stats"},
      {"store"},
      {"store", "verify"},
      {"store", "repair"},
  };
  for (std::vector<std::string> c : commands) {
    c.push_back("--help");
    ProcessRun r = RunIdem(c);
    EXPECT_EQ(r.exit_code, 0) << ::testing::PrintToString(c) << "\n" << r;
    EXPECT_THAT(r.out, HasSubstr("usage: idem")) << ::testing::PrintToString(c);
    EXPECT_THAT(r.err, IsEmpty()) << ::testing::PrintToString(c);
  }
  ProcessRun r = RunIdem({"get", "-h"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("redis+cluster://"));
  EXPECT_THAT(r.out, HasSubstr("postgres://"));
  r = RunIdem({"get", "--help"});
  EXPECT_THAT(r.out, HasSubstr("memory: (a new, empty memory store; only useful for"));
}

// ---- fingerprint ----------------------------------------------------------------------------

TEST_F(CliTest, FingerprintPrintsCanonicalJsonAndItsSha256) {
  const std::string json =
      "{ \"b\": [1.50, 2e1, \"\\u00e9\"], \"a\": {\"z\": null, \"y\": true} }\n";
  const std::string path = Write("in.json", json);
  auto canonical = CanonicalizeJson(json);
  auto fingerprint = FingerprintJson(json);
  ASSERT_TRUE(canonical.has_value());
  ASSERT_TRUE(fingerprint.has_value());
  ASSERT_EQ(*canonical, "{\"a\":{\"y\":true,\"z\":null},\"b\":[1.5,20,\"\xC3\xA9\"]}");
  const std::string expected = *canonical + "\nsha256 " + Hex(*fingerprint) + "\n";

  ProcessRun r = RunIdem({"fingerprint", path});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, expected);
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_EQ(Hex(*fingerprint), Hex(FingerprintBytes(*canonical)));

  r = RunIdem({"fingerprint", "--json", path});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, expected);

  r = RunIdem({"fingerprint", "-"}, path);  // standard input
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, expected);
}

TEST_F(CliTest, FingerprintOfInvalidJsonFailsNamingTheOffset) {
  const std::string json = "{\"a\":1,}";
  const std::string path = Write("bad.json", json);
  auto parsed = CanonicalizeJson(json);
  ASSERT_FALSE(parsed.has_value());
  ProcessRun r = RunIdem({"fingerprint", path});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.out, IsEmpty());
  // The parser's own message, which says where: "... at byte 7".
  EXPECT_THAT(r.err, AllOf(HasSubstr("idem fingerprint: " + path), HasSubstr("7"),
                           HasSubstr(parsed.error().message())));
}

TEST_F(CliTest, FingerprintRawHashesTheBytes) {
  const std::string bytes = std::string("not json\0\xff", 10);
  const std::string path = Write("in.bin", bytes);
  ProcessRun r = RunIdem({"fingerprint", "--raw", path});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "sha256 " + Hex(FingerprintBytes(bytes)) + "\n");
  // The well-known SHA-256 of "abc", through standard input.
  r = RunIdem({"fingerprint", "--raw", "-"}, Write("abc", "abc"));
  EXPECT_EQ(r.out, "sha256 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n");
}

TEST_F(CliTest, FingerprintErrors) {
  ProcessRun r = RunIdem({"fingerprint", "--json", "--raw", "-"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--json and --raw cannot be used together"));
  r = RunIdem({"fingerprint", (dir_ / "missing.json").string()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("missing.json"), HasSubstr("No such file")));
}

// ---- record commands on a log store ----------------------------------------------------------

// A log store written by the library with a fake clock set in 2023, so that every record is
// older than the real now, and leases and retention long enough to keep them live.
class LogStoreCliTest : public CliTest {
 protected:
  static constexpr const char* kCreated = "2023-11-14T22:13:20.000Z";

  void SetUp() override {
    CliTest::SetUp();
    store_dir_ = (dir_ / "store").string();
    url_ = "log:" + store_dir_;
    auto store = Open();
    ASSERT_TRUE(store.has_value()) << store.error().ToString();
    Store& s = **store;
    fingerprint_ = FingerprintBytes("request one");
    const Token t1 = Acquire(s, "orders", "k1", fingerprint_);
    ASSERT_EQ(Complete(s, "orders", "k1", t1, Outcome::kSuccess, "{\"ok\":true}", kFiveYears),
              WriteAnswer::kApplied);
    const Token t2 = Acquire(s, "orders", "k2", std::nullopt);
    binary_.assign(100, '\0');
    for (std::size_t i = 0; i < binary_.size(); ++i) binary_[i] = static_cast<char>(i * 7);
    ASSERT_EQ(Complete(s, "orders", "k2", t2, Outcome::kFailure, binary_, kFiveYears),
              WriteAnswer::kApplied);
    Acquire(s, "orders", "k3", std::nullopt);
    clock_.Advance(1s);
    Acquire(s, "users", "u1", std::nullopt);
    // Expired long before the real now: what purge reclaims.
    const Token t5 = Acquire(s, "orders", "old", std::nullopt);
    ASSERT_EQ(Complete(s, "orders", "old", t5, Outcome::kSuccess, "x", 1ms), WriteAnswer::kApplied);
  }

  Result<std::unique_ptr<Store>> Open() {
    LogStoreOptions o;
    o.dir = store_dir_;
    o.clock = &clock_;
    o.reclaim_interval = 0ms;
    return OpenLogStore(o);
  }

  Token Acquire(Store& s, std::string_view scope, std::string_view key,
                std::optional<Fingerprint> f) {
    auto a = s.Begin({.scope = scope, .key = key, .fingerprint = f, .lease = kFiveYears});
    EXPECT_TRUE(a.has_value());
    if (!a.has_value()) return 0;
    const auto* acquired = std::get_if<Acquired>(&*a);
    EXPECT_NE(acquired, nullptr);
    return acquired != nullptr ? acquired->token : 0;
  }

  WriteAnswer Complete(Store& s, std::string_view scope, std::string_view key, Token token,
                       Outcome outcome, std::string_view response,
                       std::chrono::milliseconds retention) {
    auto w = s.Complete({.scope = scope,
                         .key = key,
                         .token = token,
                         .outcome = outcome,
                         .response = response,
                         .retention = retention});
    EXPECT_TRUE(w.has_value());
    return w.value_or(WriteAnswer::kLeaseLost);
  }

  // The oldest log segment of the store.
  std::string FirstSegment() const {
    std::vector<std::string> logs;
    for (const auto& e : fs::directory_iterator(store_dir_)) {
      if (e.path().extension() == ".log") logs.push_back(e.path().string());
    }
    std::sort(logs.begin(), logs.end());
    return logs.empty() ? "" : logs.front();
  }

  testing::FakeClock clock_;
  std::string store_dir_;
  std::string url_;
  Fingerprint fingerprint_;
  std::string binary_;
};

TEST_F(LogStoreCliTest, GetPrintsACompletedRecord) {
  ProcessRun r = RunIdem({"get", url_, "orders", "k1"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("scope        orders\n"), HasSubstr("key          k1\n"),
                           HasSubstr("state        completed\n"), HasSubstr("attempt      1\n"),
                           HasSubstr(std::string("created      ") + kCreated + "\n"),
                           HasSubstr("fingerprint  " + fingerprint_.Hex() + "\n"),
                           HasSubstr("outcome      success\n"),
                           HasSubstr("response     11 bytes\n{\"ok\":true}\n")));
  EXPECT_THAT(r.out, Not(HasSubstr("lease")));
  EXPECT_THAT(r.err, IsEmpty());
}

TEST_F(LogStoreCliTest, GetShowsABinaryResponseAsHex) {
  ProcessRun r = RunIdem({"get", url_, "orders", "k2"});
  EXPECT_EQ(r.exit_code, 0) << r;
  std::string hex;
  static constexpr char kDigits[] = "0123456789abcdef";
  for (std::size_t i = 0; i < 64; ++i) {
    const auto c = static_cast<unsigned char>(binary_[i]);
    hex += kDigits[c >> 4];
    hex += kDigits[c & 0xF];
  }
  EXPECT_THAT(r.out, AllOf(HasSubstr("outcome      failure\n"), HasSubstr("fingerprint  none\n"),
                           HasSubstr("response     100 bytes\n"),
                           HasSubstr("response hex " + hex + " ...\n")));
}

TEST_F(LogStoreCliTest, GetShowsTheLeaseOfWorkInProgress) {
  ProcessRun r = RunIdem({"get", url_, "orders", "k3"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("state        in_progress\n"), HasSubstr("lease        20"),
                           Not(HasSubstr("outcome"))));
}

TEST_F(LogStoreCliTest, GetOfAnAbsentOrExpiredKeyIsNotFound) {
  for (const char* key : {"nope", "old"}) {
    ProcessRun r = RunIdem({"get", url_, "orders", key});
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_THAT(r.err, HasSubstr("not found"));
    EXPECT_THAT(r.out, IsEmpty());
  }
  ProcessRun r = RunIdem({"get", url_, "orders", ""});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("key is empty"));
}

// Keys are bytes: what is not UTF-8 is printed as \xHH and control characters escaped, never
// raw (a raw ESC could drive the operator's terminal).
TEST_F(LogStoreCliTest, KeysThatAreNotTextArePrintedEscaped) {
  {
    auto s = Open();
    ASSERT_TRUE(s.has_value()) << s.error().ToString();
    Acquire(**s, "bytes", std::string("k\xff\x1b[2J\xc3\xa9\xe2\x82", 10), std::nullopt);
  }
  ProcessRun r = RunIdem({"list", url_, "--scope", "bytes"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("key=\"k\\xff\\u001b[2J\xc3\xa9\\xe2\\x82\" ")) << r;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r;
}

TEST_F(LogStoreCliTest, ListFiltersByStateScopeAgeAndLimit) {
  ProcessRun r = RunIdem({"list", url_, "--state", "completed"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("completed scope=orders key=k1 token="),
                           HasSubstr("outcome=success response_bytes=11"),
                           HasSubstr("completed scope=orders key=k2 "),
                           HasSubstr(std::string("created=") + kCreated)));

  r = RunIdem({"list", url_, "--state", "in_progress", "--older-than", "1s"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("in_progress scope=orders key=k3 "),
                           HasSubstr("in_progress scope=users key=u1 "), HasSubstr(" lease=")));
  // Oldest first: k3 was created a second before u1.
  EXPECT_LT(r.out.find("key=k3"), r.out.find("key=u1"));

  // Nothing was created more than 10 years ago; sums are durations too.
  r = RunIdem({"list", url_, "--older-than", "3659d23h30m"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, IsEmpty());

  r = RunIdem({"list", url_, "--scope=users"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out.find("in_progress scope=users key=u1 "), 0u) << r;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r;

  r = RunIdem({"list", url_, "--limit", "2"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r;
  EXPECT_THAT(r.err, HasSubstr("stopped at --limit 2"));
}

TEST_F(LogStoreCliTest, StatsPurgeAndErase) {
  ProcessRun r = RunIdem({"stats", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("store        log\n"), HasSubstr("in_progress  2\n"),
                           HasSubstr("bytes        ")));

  r = RunIdem({"purge", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("reclaimed "));
  r = RunIdem({"purge", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "reclaimed 0 expired record(s)\n");

  r = RunIdem({"erase", url_, "orders", "k3"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "erased scope orders key k3\n");
  r = RunIdem({"erase", url_, "orders", "k3"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("not found"));
  r = RunIdem({"stats", url_});
  EXPECT_THAT(r.out, AllOf(HasSubstr("in_progress  1\n"), HasSubstr("completed    2\n")));

  // What the tool changed, the library sees.
  auto store = Open();
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  auto k3 = (*store)->Get("orders", "k3");
  ASSERT_TRUE(k3.has_value());
  EXPECT_FALSE(k3->has_value());
}

TEST_F(LogStoreCliTest, BadStoreUrlsAreRefusedClearly) {
  ProcessRun r = RunIdem({"stats", "redis://localhost:0"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("port \"0\" is not a number from 1 to 65535"));
  r = RunIdem({"stats", "ftp://x"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("unknown scheme \"ftp:\""), HasSubstr("supported:")));
  r = RunIdem({"stats", store_dir_});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("write log:" + store_dir_));
  r = RunIdem({"stats", url_ + "?sync=sometimes"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("sometimes"));
  // A mistyped directory is not turned into a new store.
  const std::string missing = (dir_ / "no-such-store").string();
  r = RunIdem({"stats", "log:" + missing});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("no log store at " + missing));
  EXPECT_FALSE(fs::exists(missing));
  r = RunIdem({"stats", "log:" + dir_.string()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("no .log or .snap files"));
  // A file, such as one of the store's own segments, is not a store.
  const std::string file = (dir_ / "a-file").string();
  std::ofstream(file) << "x";
  r = RunIdem({"stats", "log:" + file});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("no log store at " + file + ": not a directory"));
}

// What only the server can refuse in a URL (a database it does not have, a password it does not
// take) is still the command line's fault: exit 2, and the password is not printed, even one
// with a '#' in it.
TEST_F(CliTest, RedisUrlPartsTheServerRefusesAreUsageErrors) {
  const char* at = std::getenv("IDEM_TEST_REDIS");
  ASSERT_NE(at, nullptr) << "IDEM_TEST_REDIS is not set: run under scripts/test.sh";
  ProcessRun r = RunIdem({"stats", std::string("redis://") + at + "/99"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("DB index"));
  r = RunIdem({"stats", std::string("redis://:wr#ong@") + at});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("AUTH"), HasSubstr(":***@"), Not(HasSubstr("wr#ong"))));
}

TEST_F(LogStoreCliTest, AStoreOpenInAnotherProcessIsRefused) {
  auto store = Open();
  ASSERT_TRUE(store.has_value()) << store.error().ToString();
  ProcessRun r = RunIdem({"get", url_, "orders", "k1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("cannot open " + url_));
  r = RunIdem({"store", "verify", store_dir_});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, Not(IsEmpty()));
}

TEST_F(LogStoreCliTest, MemoryStoreIsEmpty) {
  ProcessRun r = RunIdem({"stats", "memory:"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("store        memory\n"), HasSubstr("completed    0\n")));
  r = RunIdem({"get", "memory:", "", "k1"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("not found: no live record for scope \"\" key k1"));
}

// ---- store verify / repair -------------------------------------------------------------------

TEST_F(LogStoreCliTest, VerifyAHealthyStore) {
  ProcessRun r = RunIdem({"store", "verify", store_dir_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("files      "), HasSubstr("batches    "),
                           HasSubstr("entries    "), HasSubstr("torn tail  no\n"),
                           HasSubstr("result     ok\n"), Not(HasSubstr("damage"))));
  // Not a terminal: no progress output at all.
  EXPECT_THAT(r.err, IsEmpty());
  r = RunIdem({"store", "verify", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
}

TEST_F(LogStoreCliTest, VerifyAcceptsATornTail) {
  std::ofstream(FirstSegment(), std::ios::binary | std::ios::app) << std::string("\x7C\xB4", 2);
  ProcessRun r = RunIdem({"store", "verify", store_dir_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("torn tail  yes"),
                           HasSubstr("result     ok (a torn tail alone is ok)")));
}

// Under sync=none nothing after the open is synced, so a power failure that lost a page in the
// middle of the segment while later batches reached the disk is that mode's loss, not damage:
// verify says so, and the open cuts there.
TEST_F(LogStoreCliTest, VerifyNamesBatchesLostBeforeASync) {
  const std::string dir = (dir_ / "unsynced").string();
  {
    LogStoreOptions o;
    o.dir = dir;
    o.sync = SyncMode::kNone;
    o.clock = &clock_;
    auto store = OpenLogStore(o);
    ASSERT_TRUE(store.has_value()) << store.error().ToString();
    for (int i = 0; i < 12; ++i) {
      const std::string key = "k" + std::to_string(i);
      const Token t = Acquire(**store, "s", key, std::nullopt);
      ASSERT_EQ(
          Complete(**store, "s", key, t, Outcome::kSuccess, std::string(3000, 'r'), kFiveYears),
          WriteAnswer::kApplied);
      std::this_thread::sleep_for(5ms);  // its own batch: the flusher writes within 200 us
    }
  }
  std::string segment;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".log") segment = e.path().string();
  }
  ASSERT_GT(fs::file_size(segment), 24'000u);
  {
    std::fstream f(segment, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192);
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  ProcessRun r = RunIdem({"store", "verify", dir});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("torn tail  yes: batches written after the last sync were "
                                     "lost in a power failure"),
                           HasSubstr("result     ok (a torn tail alone is ok)")));
  LogStoreOptions o;
  o.dir = dir;
  o.clock = &clock_;
  o.warn = [](std::string_view) {};
  auto reopened = OpenLogStore(o);
  ASSERT_TRUE(reopened.has_value()) << reopened.error().ToString();
  auto first = (*reopened)->Begin({.scope = "s", .key = "k0", .lease = kFiveYears});
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(std::holds_alternative<Replay>(*first));
}

TEST_F(LogStoreCliTest, VerifyShowsProgressOnATerminal) {
  ProcessRun r = RunIdem({"store", "verify", store_dir_}, "/dev/null", /*stderr_tty=*/true);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("verifying: 100% ("), HasSubstr("\r")));
  EXPECT_THAT(r.out, HasSubstr("result     ok\n"));
}

TEST_F(LogStoreCliTest, VerifyFindsDamageAndRepairDropsIt) {
  const std::string segment = FirstSegment();
  ASSERT_FALSE(segment.empty());
  // A byte inside the first frame's payload of the first batch; later batches stay intact.
  const std::size_t batch = log::kFileHeaderSize;
  const std::size_t at = batch + log::kBatchHeaderSize + log::kFrameHeaderSize + 2;
  ASSERT_GT(fs::file_size(segment), at + 200);
  {
    std::fstream f(segment, std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x40));
  }

  ProcessRun r = RunIdem({"store", "verify", store_dir_});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("damage     " + segment + " offset " + std::to_string(batch)),
                           HasSubstr("result     damaged\n")));
  EXPECT_THAT(r.err, AllOf(HasSubstr("is damaged"), HasSubstr("idem store repair")));
  // The store refuses to open, and the tool says why.
  r = RunIdem({"get", url_, "orders", "k2"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("DATA_LOSS"));

  r = RunIdem({"store", "repair", store_dir_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("entries kept   "), HasSubstr("dropped        " + segment),
                           HasSubstr("backup         " + store_dir_ + "/repair-backup-")));
  EXPECT_THAT(r.out, Not(HasSubstr("bytes dropped  0\n")));
  std::size_t backups = 0;
  for (const auto& e : fs::directory_iterator(store_dir_)) {
    if (e.path().filename().string().rfind("repair-backup-", 0) == 0) {
      ++backups;
      EXPECT_THAT(r.out, HasSubstr(e.path().string()));
      EXPECT_TRUE(fs::exists(e.path() / fs::path(segment).filename()));
    }
  }
  EXPECT_EQ(backups, 1u);

  r = RunIdem({"store", "verify", store_dir_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("result     ok\n"));
  r = RunIdem({"get", url_, "orders", "k2"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("response     100 bytes\n"));
}

// Verify goes on past each damaged place, as repair does (the same scan finds them), so it lists
// every place repair drops, not only the first one (where the open stops).
TEST_F(LogStoreCliTest, VerifyListsEveryDamagedPlaceRepairDrops) {
  const std::string dir = (dir_ / "three").string();
  {
    LogStoreOptions o;
    o.dir = dir;
    o.clock = &clock_;
    auto store = OpenLogStore(o);
    ASSERT_TRUE(store.has_value()) << store.error().ToString();
    for (int i = 0; i < 30; ++i) {
      const std::string key = "k" + std::to_string(i);
      const Token t = Acquire(**store, "s", key, std::nullopt);
      ASSERT_EQ(Complete(**store, "s", key, t, Outcome::kSuccess, "r", kFiveYears),
                WriteAnswer::kApplied);
    }
  }
  const std::string segment = dir + "/" + log::LogFileName(1, /*snapshot=*/false);
  std::string data;
  {
    std::ifstream in(segment, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::vector<std::size_t> batches;
  for (std::size_t pos = log::kFileHeaderSize; pos + log::kBatchHeaderSize <= data.size();) {
    batches.push_back(pos);
    std::uint32_t bytes;
    std::memcpy(&bytes, data.data() + pos + 20, 4);
    pos += log::kBatchHeaderSize + bytes;
  }
  ASSERT_GE(batches.size(), 50u);
  data[batches[5] + 10] ^= 0x01;                                                  // a header
  data[batches[20] + log::kBatchHeaderSize + log::kFrameHeaderSize + 3] ^= 0x01;  // a payload
  data[batches[40] + 17] ^= 0x01;                                                 // a header
  std::ofstream(segment, std::ios::binary | std::ios::trunc) << data;

  ProcessRun r = RunIdem({"store", "verify", dir});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("damaged in 3 place(s)"));
  std::vector<std::string> ranges;  // "[a, b)" of each place, as verify says repair drops them
  for (std::size_t at = 0; (at = r.out.find("repair drops bytes ", at)) != std::string::npos;) {
    at += std::string("repair drops bytes ").size();
    ranges.push_back(r.out.substr(at, r.out.find(')', at) + 1 - at));
  }
  ASSERT_EQ(ranges.size(), 3u) << r;
  for (const std::size_t b : {5, 20, 40}) {
    EXPECT_THAT(r.out,
                HasSubstr("damage     " + segment + " offset " + std::to_string(batches[b])));
  }

  r = RunIdem({"store", "repair", dir});
  EXPECT_EQ(r.exit_code, 0) << r;
  std::size_t dropped = 0;
  for (std::size_t at = 0; (at = r.out.find("dropped        ", at)) != std::string::npos; ++at) {
    ++dropped;
  }
  EXPECT_EQ(dropped, 3u) << r;
  for (const std::string& range : ranges)
    EXPECT_THAT(r.out, HasSubstr(segment + " bytes " + range));
  r = RunIdem({"store", "verify", dir});
  EXPECT_EQ(r.exit_code, 0) << r;
}

// Verify only reads: a store this user may not write (another user's, a read-only mount) is
// verified too. It failed on creating LOCK. As root (CI), idem runs as nobody via setpriv.
TEST_F(LogStoreCliTest, VerifyNeedsNoWriteAccess) {
  {
    auto s = Open();  // leaves LOCK behind, as every store does
    ASSERT_TRUE(s.has_value()) << s.error().ToString();
  }
  std::vector<std::string> runner;
  if (::geteuid() == 0) {
    runner = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  }
  const auto no_write = fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write;
  fs::permissions(store_dir_, no_write, fs::perm_options::remove);
  for (const auto& f : fs::directory_iterator(store_dir_)) {
    fs::permissions(f.path(), no_write, fs::perm_options::remove);
  }
  ProcessRun r = RunIdem({"store", "verify", store_dir_}, "/dev/null", false, runner);
  fs::permissions(store_dir_, fs::perms::owner_write, fs::perm_options::add);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("result     ok"));
  // Without LOCK nobody holds the store, but verify cannot lock it either: a clear error.
  fs::remove(fs::path(store_dir_) / "LOCK");
  fs::permissions(store_dir_, fs::perms::owner_write, fs::perm_options::remove);
  r = RunIdem({"store", "verify", store_dir_}, "/dev/null", false, runner);
  fs::permissions(store_dir_, fs::perms::owner_write, fs::perm_options::add);
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("LOCK"), HasSubstr("ermission denied")));
}

// A directory with no log files is no store (say, a mistyped path): verify and repair fail
// rather than report it ok, and create nothing in it.
TEST_F(CliTest, VerifyAndRepairOfADirectoryWithoutAStoreFailAndCreateNothing) {
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  ProcessRun r = RunIdem({"store", "verify", empty.string()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr(empty.string()), HasSubstr("no log store")));
  EXPECT_THAT(r.out, Not(HasSubstr("result     ok")));
  r = RunIdem({"store", "repair", empty.string()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("no log store"));
  EXPECT_TRUE(fs::is_empty(empty)) << "no LOCK, no backup directory";
}

TEST_F(CliTest, VerifyOfAMissingDirectoryFails) {
  ProcessRun r = RunIdem({"store", "verify", (dir_ / "nope").string()});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("nope"));
  r = RunIdem({"store", "repair", "log:"});
  EXPECT_EQ(r.exit_code, 2) << r;
  // A file is named as one, not as a missing directory.
  const std::string file = (dir_ / "000000000001.log").string();
  std::ofstream(file) << "x";
  r = RunIdem({"store", "verify", file});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("is a file, not a directory"));
}

}  // namespace
}  // namespace idem
