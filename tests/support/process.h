// ChildProcess: a program run by an end-to-end test (the ledger, idemd), with its stdout read
// line by line and its stderr kept in a file for failure messages.
//
// The child's stdout is drained by a background thread as it is written, so a chatty child never
// blocks on a full pipe. The child is our own child: we reap it (no zombies), and the destructor
// kills it with SIGKILL if it is still running.
//
// Not thread-safe, except that the stdout buffer may be read while the reader thread fills it.
#ifndef IDEM_TESTS_SUPPORT_PROCESS_H_
#define IDEM_TESTS_SUPPORT_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "idem/status.h"

namespace idem::testing {

class ChildProcess {
 public:
  // Starts `path args...` with the test's environment plus `env` (NAME, VALUE; an entry replaces
  // a variable of the same name). stdin is /dev/null. Fails if the program cannot be started.
  static Result<ChildProcess> Spawn(
      const std::string& path, const std::vector<std::string>& args,
      const std::vector<std::pair<std::string, std::string>>& env = {});

  ChildProcess(ChildProcess&&) noexcept;
  ChildProcess& operator=(ChildProcess&&) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // SIGKILL if still running, then reap.
  ~ChildProcess();

  pid_t pid() const { return pid_; }

  // The first stdout line (without its newline) that starts with `prefix` and was not returned
  // by an earlier call. kUnavailable if none arrives within `timeout`; kFailedPrecondition if
  // stdout closes (the child exited) first. Error messages include the child's stderr.
  Result<std::string> WaitForLine(std::string_view prefix, std::chrono::milliseconds timeout);
  // Everything the child wrote to stdout so far.
  std::string Stdout() const;
  // Everything the child wrote to stderr so far.
  std::string Stderr() const;
  const std::filesystem::path& stderr_path() const { return stderr_path_; }

  // Sends `signal` (no-op success once the child has been reaped).
  Status Kill(int signal);
  // SIGSTOP, then waits until the child has stopped: kill() returns before every thread of the
  // child is stopped, and meanwhile it may still answer. kUnavailable if it has not stopped
  // within `timeout`, kFailedPrecondition if it exited. SIGCONT (Kill) resumes it.
  Status Stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Waits for the child to exit and reaps it. Returns its exit code, or 128 + the signal number
  // if a signal ended it (as a shell reports it). kUnavailable if still running after `timeout`.
  Result<int> Wait(std::chrono::milliseconds timeout);
  // Whether the child is still running; reaps it if it has exited (waitpid WNOHANG).
  bool Running();
  // The exit status (as Wait reports it) once the child has been reaped.
  std::optional<int> exit_status() const { return exit_status_; }

 private:
  // Shared with the reader thread, which outlives no ChildProcess but may outlive a move.
  struct Output {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::string data;
    std::size_t consumed = 0;  // Bytes of `data` already searched by WaitForLine.
    bool closed = false;
  };

  ChildProcess() = default;
  void Reap(int wait_status);
  void Destroy();

  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  std::unique_ptr<Output> out_;
  std::thread reader_;
  // A pipe whose write end tells the reader thread to stop. Both ends are closed after the
  // reader is joined.
  int wake_fd_ = -1;
  int wake_read_fd_ = -1;
  std::filesystem::path temp_dir_;
  std::filesystem::path stderr_path_;
};

// The port of the first HOST:PORT after `marker` in `line`, e.g. ParsePortAfter("idemd
// listening on 127.0.0.1:8080 admin 127.0.0.1:8081", "admin") == 8081. HOST may be [v6].
Result<std::uint16_t> ParsePortAfter(std::string_view line, std::string_view marker);
// The port in a ready line such as "ledger listening on 127.0.0.1:9000".
inline Result<std::uint16_t> ParseListeningPort(std::string_view line) {
  return ParsePortAfter(line, "listening on");
}

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_PROCESS_H_
