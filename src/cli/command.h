// What every `idem` subcommand is: a name, its help, its flags and one function to run.
// main.cc dispatches to them; each lives in its own .cc file.
#ifndef IDEM_CLI_COMMAND_H_
#define IDEM_CLI_COMMAND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/duration_text.h"
#include "idem/status.h"

namespace idem::cli {

// Exit codes, the same for every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the operation failed, or verification found damage
inline constexpr int kExitUsage = 2;   // the command line is wrong

struct Flag {
  std::string_view name;  // without the leading "--"
  bool takes_value = false;
};

struct Command;

// A parsed command line: the flags given and the positional arguments, in order.
class Args {
 public:
  bool help() const { return help_; }
  bool Has(std::string_view flag) const { return flags_.find(flag) != flags_.end(); }
  // The value of a flag that takes one; nullopt when it was not given.
  std::optional<std::string_view> Value(std::string_view flag) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend Result<Args> ParseArgs(const Command& command, std::span<const std::string_view> words);
  bool help_ = false;
  std::map<std::string, std::string, std::less<>> flags_;
  std::vector<std::string> positional_;
};

struct Command {
  std::string_view name;      // "get", "store verify"
  std::string_view synopsis;  // "idem get STORE_URL SCOPE KEY"
  std::string_view summary;   // one line, for `idem --help`
  std::string_view help;      // what it does, its flags and its exit codes
  std::vector<Flag> flags;
  std::vector<std::string_view> arg_names;  // the positional arguments, all required
  int (*run)(const Command& self, const Args& args) = nullptr;
};

// Parses the words after the command's name. -h/--help anywhere sets help() and skips every
// other check. "--" ends the flags; "-" is a positional argument (standard input).
// kInvalidArgument names the problem: an unknown flag, a flag given twice, a missing value, a
// missing or extra argument.
Result<Args> ParseArgs(const Command& command, std::span<const std::string_view> words);

// Prints "idem NAME: message", the synopsis and a pointer to --help on stderr; returns
// kExitUsage.
int UsageError(const Command& command, std::string_view message);
// Prints "idem NAME: message" on stderr; returns kExitFailed.
int Failure(const Command& command, std::string_view message);

// "500ms", "30s", "5m", "2h", "1h30m", "7d" -> milliseconds: the one syntax of every duration.
using core::ParseDuration;
// A decimal count, at least 1.
Result<std::uint64_t> ParseCount(std::string_view text);

// The commands, in the order `idem --help` lists them.
const Command& FingerprintCommand();
const Command& GetCommand();
const Command& ListCommand();
const Command& EraseCommand();
const Command& PurgeCommand();
const Command& StatsCommand();
const Command& StoreVerifyCommand();
const Command& StoreRepairCommand();
const Command& StoreInitCommand();

}  // namespace idem::cli

#endif  // IDEM_CLI_COMMAND_H_
