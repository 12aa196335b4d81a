// idem fingerprint: what the receiver would compare for a payload.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "idem/fingerprint.h"

namespace idem::cli {
namespace {

// The whole of FILE, or of standard input for "-".
Result<std::string> ReadInput(const std::string& path) {
  const bool stdin_input = path == "-";
  std::FILE* f = stdin_input ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) return NotFoundError("cannot open " + path + ": " + std::strerror(errno));
  std::string data;
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const int read_errno = std::ferror(f) ? errno : 0;
  if (!stdin_input) std::fclose(f);
  if (read_errno != 0) {
    return UnavailableError("cannot read " + (stdin_input ? std::string("standard input") : path) +
                            ": " + std::strerror(read_errno));
  }
  return data;
}

int Run(const Command& self, const Args& args) {
  if (args.Has("json") && args.Has("raw")) {
    return UsageError(self, "--json and --raw cannot be used together");
  }
  const std::string& path = args.positional()[0];
  auto input = ReadInput(path);
  if (!input) return Failure(self, input.error().message());
  if (args.Has("raw")) {
    std::cout << "sha256 " << FingerprintBytes(*input).Hex() << "\n";
    return kExitOk;
  }
  auto canonical = CanonicalizeJson(*input);
  if (!canonical) {
    return Failure(self, (path == "-" ? "standard input" : path) + ": " +
                             canonical.error().message() +
                             " (use --raw to hash the bytes as they are)");
  }
  auto fingerprint = FingerprintJson(*input);
  if (!fingerprint) return Failure(self, fingerprint.error().message());
  std::cout << *canonical << "\n"
            << "sha256 " << fingerprint->Hex() << "\n";
  return kExitOk;
}

}  // namespace

const Command& FingerprintCommand() {
  static const Command command{
      .name = "fingerprint",
      .synopsis = "idem fingerprint [--json|--raw] FILE|-",
      .summary = "print the canonical JSON and SHA-256 fingerprint of a payload",
      .help = R"help(Prints the fingerprint idem compares to tell a retry from a different request
that reuses a key: the one the library's receiver and the consumers store for a payload. The
gateway's differs: it hashes the method, the target and the body together (docs/gateway.md),
so an idemd record's fingerprint is not this one. FILE "-" reads standard input.

  --json  (default) canonicalise FILE as JSON by RFC 8785 (JCS), print the canonical
          form on one line, then "sha256 <hex>" of it. Invalid JSON fails with the
          parser's message, which says what is wrong and at which offset.
  --raw   hash the bytes as they are; prints only "sha256 <hex>".

Exit status: 0 printed, 1 unreadable input or invalid JSON, 2 usage error.
)help",
      .flags = {{"json", false}, {"raw", false}},
      .arg_names = {"FILE"},
      .run = &Run,
  };
  return command;
}

}  // namespace idem::cli
