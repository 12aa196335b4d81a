#include "tests/support/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

extern char** environ;

namespace idem::testing {
namespace {

std::string ErrnoText(std::string_view what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

int DecodeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

std::string Tail(const std::string& s, std::size_t n) {
  return s.size() <= n ? s : "..." + s.substr(s.size() - n);
}

}  // namespace

Result<ChildProcess> ChildProcess::Spawn(
    const std::string& path, const std::vector<std::string>& args,
    const std::vector<std::pair<std::string, std::string>>& env) {
  ChildProcess child;
  std::string temp_template =
      (std::filesystem::temp_directory_path() / "idem-child-XXXXXX").string();
  if (::mkdtemp(temp_template.data()) == nullptr) {
    return InternalError(ErrnoText("mkdtemp", errno));
  }
  child.temp_dir_ = temp_template;
  child.stderr_path_ = child.temp_dir_ / "stderr";

  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> words = {path};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_words;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    const bool replaced =
        std::any_of(env.begin(), env.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env_words.emplace_back(entry);
  }
  for (const auto& [name, value] : env) env_words.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (std::string& w : env_words) envp.push_back(w.data());
  envp.push_back(nullptr);

  const int stderr_fd =
      ::open(child.stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (stderr_fd < 0) return InternalError(ErrnoText("open stderr file", errno));
  int out_pipe[2];
  int exec_pipe[2];  // Carries errno from a failed exec; closes (EOF) on success.
  int wake_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(stderr_fd);
    return InternalError(ErrnoText("pipe2", err));
  }
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    for (int fd : {stderr_fd, out_pipe[0], out_pipe[1]}) ::close(fd);
    return InternalError(ErrnoText("pipe2", err));
  }
  if (::pipe2(wake_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    for (int fd : {stderr_fd, out_pipe[0], out_pipe[1], exec_pipe[0], exec_pipe[1]}) ::close(fd);
    return InternalError(ErrnoText("pipe2", err));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    for (int fd : {stderr_fd, out_pipe[0], out_pipe[1], exec_pipe[0], exec_pipe[1], wake_pipe[0],
                   wake_pipe[1]}) {
      ::close(fd);
    }
    return InternalError(ErrnoText("fork", err));
  }
  if (pid == 0) {
    // Die with the test (it may crash or be killed) so no server outlives it holding a port.
    // PDEATHSIG follows the forking *thread*: spawn from a thread that outlives the child.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd < 0 || ::dup2(null_fd, 0) < 0 || ::dup2(out_pipe[1], 1) < 0 ||
        ::dup2(stderr_fd, 2) < 0) {
      const int err = errno;
      (void)!::write(exec_pipe[1], &err, sizeof err);
      ::_exit(127);
    }
    // The test may have blocked or ignored signals; the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::execve(path.c_str(), argv.data(), envp.data());
    const int err = errno;
    (void)!::write(exec_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(stderr_fd);
  ::close(out_pipe[1]);
  ::close(exec_pipe[1]);
  child.pid_ = pid;
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (n > 0) {
    ::close(out_pipe[0]);
    ::close(wake_pipe[0]);
    ::close(wake_pipe[1]);
    int wait_status = 0;
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    child.pid_ = -1;
    return FailedPreconditionError(ErrnoText("cannot run " + path, exec_errno));
  }

  child.out_ = std::make_unique<Output>();
  child.wake_fd_ = wake_pipe[1];
  child.wake_read_fd_ = wake_pipe[0];
  child.reader_ = std::thread([out = child.out_.get(), fd = out_pipe[0], wake = wake_pipe[0]] {
    char buf[4096];
    while (true) {
      pollfd fds[2] = {{fd, POLLIN, 0}, {wake, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[1].revents != 0) break;
      const ssize_t got = ::read(fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      std::lock_guard lock(out->mu);
      out->data.append(buf, static_cast<std::size_t>(got));
      out->cv.notify_all();
    }
    ::close(fd);  // `wake` stays open until the reader is joined: writing to it never fails.
    std::lock_guard lock(out->mu);
    out->closed = true;
    out->cv.notify_all();
  });
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      exit_status_(std::exchange(other.exit_status_, std::nullopt)),
      out_(std::move(other.out_)),
      reader_(std::move(other.reader_)),
      wake_fd_(std::exchange(other.wake_fd_, -1)),
      wake_read_fd_(std::exchange(other.wake_read_fd_, -1)),
      temp_dir_(std::exchange(other.temp_dir_, {})),
      stderr_path_(std::exchange(other.stderr_path_, {})) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Destroy();
    pid_ = std::exchange(other.pid_, -1);
    exit_status_ = std::exchange(other.exit_status_, std::nullopt);
    out_ = std::move(other.out_);
    reader_ = std::move(other.reader_);
    wake_fd_ = std::exchange(other.wake_fd_, -1);
    wake_read_fd_ = std::exchange(other.wake_read_fd_, -1);
    temp_dir_ = std::exchange(other.temp_dir_, {});
    stderr_path_ = std::exchange(other.stderr_path_, {});
  }
  return *this;
}

ChildProcess::~ChildProcess() { Destroy(); }

void ChildProcess::Destroy() {
  if (pid_ > 0 && !exit_status_) {
    ::kill(pid_, SIGKILL);
    int wait_status = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &wait_status, 0);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) Reap(wait_status);
  }
  if (wake_fd_ >= 0) {
    const char byte = 1;
    (void)!::write(wake_fd_, &byte, 1);
  }
  if (reader_.joinable()) reader_.join();
  CloseFd(wake_fd_);
  CloseFd(wake_read_fd_);
  if (!temp_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(temp_dir_, ignored);
    temp_dir_.clear();
  }
  out_.reset();
  pid_ = -1;
}

void ChildProcess::Reap(int wait_status) { exit_status_ = DecodeWaitStatus(wait_status); }

Result<std::string> ChildProcess::WaitForLine(std::string_view prefix,
                                              std::chrono::milliseconds timeout) {
  if (!out_) return FailedPreconditionError("no child process");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(out_->mu);
  std::size_t scanned = out_->consumed;
  while (true) {
    // Complete lines first; once stdout is closed, a last line without '\n' counts too.
    while (scanned < out_->data.size()) {
      std::size_t end = out_->data.find('\n', scanned);
      if (end == std::string::npos) {
        if (!out_->closed) break;
        end = out_->data.size();
      }
      std::string_view line(out_->data.data() + scanned, end - scanned);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const std::size_t next = std::min(end + 1, out_->data.size());
      if (line.starts_with(prefix)) {
        out_->consumed = next;
        return std::string(line);
      }
      scanned = next;
    }
    if (out_->closed) {
      lock.unlock();
      return FailedPreconditionError("stdout closed (the child exited?) before a line starting '" +
                                     std::string(prefix) + "'; stderr:\n" + Tail(Stderr(), 4000));
    }
    if (out_->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline) {
      lock.unlock();
      return UnavailableError("no line starting '" + std::string(prefix) + "' within " +
                              std::to_string(timeout.count()) + " ms; stderr:\n" +
                              Tail(Stderr(), 4000));
    }
  }
}

std::string ChildProcess::Stdout() const {
  if (!out_) return "";
  std::lock_guard lock(out_->mu);
  return out_->data;
}

std::string ChildProcess::Stderr() const {
  if (stderr_path_.empty()) return "";
  std::ifstream in(stderr_path_, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Status ChildProcess::Kill(int signal) {
  if (pid_ <= 0 || exit_status_) return OkStatus();
  if (::kill(pid_, signal) != 0) return InternalError(ErrnoText("kill", errno));
  return OkStatus();
}

Status ChildProcess::Stop(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || exit_status_) return FailedPreconditionError("no running child to stop");
  IDEM_RETURN_IF_ERROR(Kill(SIGSTOP));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int wait_status = 0;
    // WUNTRACED: report the child once the whole group stop is done.
    const pid_t r = ::waitpid(pid_, &wait_status, WNOHANG | WUNTRACED);
    if (r == pid_ && WIFSTOPPED(wait_status)) return OkStatus();
    if (r == pid_) {
      Reap(wait_status);
      return FailedPreconditionError("pid " + std::to_string(pid_) + " exited instead of stopping");
    }
    if (r < 0) return InternalError(ErrnoText("waitpid", errno));
    if (std::chrono::steady_clock::now() >= deadline) {
      return UnavailableError("pid " + std::to_string(pid_) + " did not stop within " +
                              std::to_string(timeout.count()) + " ms");
    }
    ::usleep(1000);
  }
}

bool ChildProcess::Running() {
  if (pid_ <= 0 || exit_status_) return false;
  int wait_status = 0;
  const pid_t r = ::waitpid(pid_, &wait_status, WNOHANG);
  if (r == pid_) {
    Reap(wait_status);
    return false;
  }
  return r == 0;
}

Result<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (exit_status_) return *exit_status_;
  if (pid_ <= 0) return FailedPreconditionError("no child process");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A pidfd becomes readable when the child exits: no polling loop where the kernel has it.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  while (Running()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      CloseFd(pidfd);
      return UnavailableError("pid " + std::to_string(pid_) + " still running after " +
                              std::to_string(timeout.count()) + " ms");
    }
    if (pidfd >= 0) {
      pollfd p = {pidfd, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
    } else {
      ::usleep(1000);
    }
  }
  CloseFd(pidfd);
  if (!exit_status_) return InternalError("lost track of pid " + std::to_string(pid_));
  // The child is gone, but the reader thread may not have drained its last output yet: wait
  // for end of file, so that Stdout() is complete once Wait returns. Bounded, since a
  // grandchild may still hold the pipe open.
  if (out_) {
    std::unique_lock lock(out_->mu);
    out_->cv.wait_for(lock, std::chrono::seconds(5), [this] { return out_->closed; });
  }
  return *exit_status_;
}

Result<std::uint16_t> ParsePortAfter(std::string_view line, std::string_view marker) {
  const std::size_t at = line.find(marker);
  if (at == std::string_view::npos) {
    return InvalidArgumentError("no '" + std::string(marker) + "' in '" + std::string(line) + "'");
  }
  std::string_view rest = line.substr(at + marker.size());
  const std::size_t start = rest.find_first_not_of(' ');
  if (start == std::string_view::npos) {
    return InvalidArgumentError("no address after '" + std::string(marker) + "'");
  }
  rest = rest.substr(start);
  const std::string_view address = rest.substr(0, rest.find(' '));
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return InvalidArgumentError("no HOST:PORT in '" + std::string(line) + "'");
  }
  const std::string_view digits = address.substr(colon + 1);
  unsigned port = 0;
  const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size() || port == 0 ||
      port > 65535) {
    return InvalidArgumentError("bad port in '" + std::string(line) + "'");
  }
  return static_cast<std::uint16_t>(port);
}

}  // namespace idem::testing
