// Command-line parsing shared by every command: flags, usage errors, durations and counts.
#include <charconv>
#include <iostream>
#include <limits>
#include <string>
#include <system_error>

#include "cli/command.h"

namespace idem::cli {

std::optional<std::string_view> Args::Value(std::string_view flag) const {
  auto it = flags_.find(flag);
  if (it == flags_.end()) return std::nullopt;
  return it->second;
}

Result<Args> ParseArgs(const Command& command, std::span<const std::string_view> words) {
  Args args;
  for (std::string_view w : words) {
    if (w == "--") break;
    if (w == "-h" || w == "--help") {
      args.help_ = true;
      return args;
    }
  }
  bool flags_done = false;
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string_view w = words[i];
    if (flags_done || w == "-" || w.empty() || w[0] != '-') {
      args.positional_.emplace_back(w);
      continue;
    }
    if (w == "--") {
      flags_done = true;
      continue;
    }
    if (w.substr(0, 2) != "--") {
      return InvalidArgumentError("unknown flag " + std::string(w));
    }
    std::string_view name = w.substr(2);
    std::optional<std::string_view> value;
    if (auto eq = name.find('='); eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Flag* flag = nullptr;
    for (const Flag& f : command.flags) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) return InvalidArgumentError("unknown flag --" + std::string(name));
    if (args.Has(name)) return InvalidArgumentError("--" + std::string(name) + " given twice");
    if (flag->takes_value && !value) {
      if (i + 1 == words.size()) {
        return InvalidArgumentError("--" + std::string(name) + " needs a value");
      }
      value = words[++i];
    }
    if (!flag->takes_value && value) {
      return InvalidArgumentError("--" + std::string(name) + " takes no value");
    }
    args.flags_.emplace(std::string(name), std::string(value.value_or("")));
  }
  const std::size_t n = args.positional_.size();
  const std::size_t want = command.arg_names.size();
  if (n < want) {
    std::string missing;
    for (std::size_t i = n; i < want; ++i) {
      missing += (i == n ? "" : i + 1 == want ? " and " : ", ");
      missing += command.arg_names[i];
    }
    return InvalidArgumentError("missing " + missing);
  }
  if (n > want) {
    return InvalidArgumentError("unexpected argument \"" + args.positional_[want] + "\"");
  }
  return args;
}

int UsageError(const Command& command, std::string_view message) {
  std::cerr << "idem " << command.name << ": " << message << "\n"
            << "usage: " << command.synopsis << "\n"
            << "Run 'idem " << command.name << " --help' for details.\n";
  return kExitUsage;
}

int Failure(const Command& command, std::string_view message) {
  std::cerr << "idem " << command.name << ": " << message << "\n";
  return kExitFailed;
}

Result<std::uint64_t> ParseCount(std::string_view text) {
  std::uint64_t n = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, n);
  if (ec != std::errc() || p != end || n == 0) {
    return InvalidArgumentError("bad count \"" + std::string(text) +
                                "\": expected a whole number, at least 1");
  }
  return n;
}

}  // namespace idem::cli
