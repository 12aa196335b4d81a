// idem: the operator's command-line tool. main finds the command named on the command line,
// parses its flags and runs it; every command lives in its own file.
#include <array>
#include <iostream>
#include <span>
#include <string_view>
#include <vector>

#include "cli/command.h"

namespace idem::cli {
namespace {

std::span<const Command* const> Commands() {
  static const std::array<const Command*, 9> commands = {
      &FingerprintCommand(), &GetCommand(),         &ListCommand(),
      &EraseCommand(),       &PurgeCommand(),       &StatsCommand(),
      &StoreVerifyCommand(), &StoreRepairCommand(), &StoreInitCommand(),
  };
  return commands;
}

void PrintCommands(std::ostream& out, std::string_view group) {
  for (const Command* c : Commands()) {
    if (!group.empty() && c->name.substr(0, group.size() + 1) != std::string(group) + " ") {
      continue;
    }
    out << "  " << c->name << std::string(c->name.size() < 14 ? 14 - c->name.size() : 1, ' ')
        << c->summary << "\n";
  }
}

void PrintUsage(std::ostream& out) {
  out << "usage: idem COMMAND [ARGS...]\n\n"
         "Inspects idem's stores and fingerprints payloads.\n\n"
         "Commands:\n";
  PrintCommands(out, "");
  out << "\nRun 'idem COMMAND --help' for a command's arguments and exit status.\n"
         "Exit status: 0 success, 1 the operation failed or found damage, 2 usage error.\n";
}

int Main(std::span<const std::string_view> words) {
  if (words.empty()) {
    PrintUsage(std::cerr);
    return kExitUsage;
  }
  if (words[0] == "-h" || words[0] == "--help" || words[0] == "help") {
    PrintUsage(std::cout);
    return kExitOk;
  }
  if (words[0] == "--version") {
    std::cout << "idem " << IDEM_VERSION << "\n";
    return kExitOk;
  }
  for (const Command* c : Commands()) {
    // A command's name is one or two words ("get", "store verify").
    const std::size_t space = c->name.find(' ');
    const bool two_words = space != std::string_view::npos;
    if (words[0] != c->name.substr(0, space)) continue;
    if (two_words && (words.size() < 2 || words[1] != c->name.substr(space + 1))) continue;
    auto args = ParseArgs(*c, words.subspan(two_words ? 2 : 1));
    if (!args) return UsageError(*c, args.error().message());
    if (args->help()) {
      std::cout << "usage: " << c->synopsis << "\n\n" << c->help;
      return kExitOk;
    }
    return c->run(*c, *args);
  }
  if (words[0] == "store") {
    const bool help = words.size() > 1 && (words[1] == "-h" || words[1] == "--help");
    std::ostream& out = help ? std::cout : std::cerr;
    if (!help) {
      std::cerr << "idem store: "
                << (words.size() < 2 ? "missing subcommand"
                                     : "unknown subcommand \"" + std::string(words[1]) + "\"")
                << "\n";
    }
    out << "usage: idem store SUBCOMMAND DIR|URL\n\nSubcommands:\n";
    PrintCommands(out, "store");
    return help ? kExitOk : kExitUsage;
  }
  std::cerr << "idem: unknown command \"" << words[0] << "\"\n\n";
  PrintUsage(std::cerr);
  return kExitUsage;
}

}  // namespace
}  // namespace idem::cli

int main(int argc, char** argv) {
  std::vector<std::string_view> words(argv + 1, argv + argc);
  const int code = idem::cli::Main(words);
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "idem: could not write the output\n";
    return idem::cli::kExitFailed;
  }
  return code;
}
