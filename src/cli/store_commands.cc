// idem store verify|repair: checking and salvaging a log store's directory.
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include "cli/command.h"
#include "cli/format.h"
#include "cli/progress.h"
#include "idem/stores/log.h"

namespace idem::cli {
namespace {

// DIR, or the directory of a log: store URL.
Result<std::string> StoreDir(std::string_view arg) {
  std::string dir;
  if (arg.substr(0, 4) == "log:") {
    auto options = ParseLogStoreUrl(arg);
    if (!options) return options.error();
    dir = options->dir;
  } else {
    dir = std::string(arg);
  }
  // A file (a segment, say) is not a store: "no such directory" said it was not there.
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    return InvalidArgumentError(dir +
                                " is a file, not a directory: verify and repair take the "
                                "directory holding a log store's .log and .snap files");
  }
  if (arg.substr(0, 4) == "log:") return dir;
  if (arg.empty()) return InvalidArgumentError("DIR is empty");
  // Only the log store has files to check: another store's URL is a usage error, not a
  // directory that is not there.
  if (arg.find("://") != std::string_view::npos || arg == "memory:") {
    return InvalidArgumentError("\"" + std::string(arg) +
                                "\" is not a log store: verify and repair take a log store's "
                                "directory (or log:DIR)");
  }
  return std::string(arg);
}

int RunVerify(const Command& self, const Args& args) {
  auto dir = StoreDir(args.positional()[0]);
  if (!dir) return UsageError(self, dir.error().message());
  ProgressLine progress("verifying");
  auto report = VerifyLogStore(*dir, progress.callback());
  progress.Clear();
  if (!report) return Failure(self, report.error().ToString());
  std::cout << "files      " << report->files << "\n"
            << "bytes      " << report->bytes << " (" << FormatSize(report->bytes) << ")\n"
            << "batches    " << report->batches << "\n"
            << "entries    " << report->entries << "\n";
  if (report->lost_unsynced) {
    std::cout << "torn tail  yes: batches written after the last sync were lost in a power "
                 "failure (sync=interval or none); opening the store cuts the newest segment at "
                 "the first lost one, with the "
              << report->unsynced_batches << " batches after it\n";
  } else if (report->torn_tail) {
    std::cout << "torn tail  yes: the last batch was cut short by a crash mid-write; opening "
                 "the store cuts it off\n";
  } else {
    std::cout << "torn tail  no\n";
  }
  for (const std::string& d : report->damage) std::cout << "damage     " << d << "\n";
  if (!report->ok()) {
    std::cout << "result     damaged\n";
    return Failure(self, *dir + " is damaged in " + std::to_string(report->damage.size()) +
                             " place(s); the store will not open. Stop its server, then run "
                             "'idem store repair " +
                             *dir + "'");
  }
  std::cout << (report->torn_tail ? "result     ok (a torn tail alone is ok)\n"
                                  : "result     ok\n");
  return kExitOk;
}

int RunRepair(const Command& self, const Args& args) {
  auto dir = StoreDir(args.positional()[0]);
  if (!dir) return UsageError(self, dir.error().message());
  ProgressLine progress("repairing");
  auto report = RepairLogStore(*dir, progress.callback());
  progress.Clear();
  if (!report) return Failure(self, report.error().ToString());
  std::cout << "entries kept   " << report->entries_kept << "\n"
            << "bytes dropped  " << report->bytes_dropped << "\n";
  for (const std::string& d : report->dropped) std::cout << "dropped        " << d << "\n";
  if (report->backup.empty()) {
    std::cout << "backup         none (there were no log files)\n";
  } else {
    std::cout << "backup         " << report->backup
              << " (the old files; delete it once the store is known to be good)\n";
  }
  return kExitOk;
}

}  // namespace

const Command& StoreVerifyCommand() {
  static const Command command{
      .name = "store verify",
      .synopsis = "idem store verify DIR",
      .summary = "check every checksum of a log store without changing it",
      .help = R"help(Reads every file of the log store in DIR and checks every checksum, changing
nothing. Prints the files, bytes, batches and entries read, whether the last file
ends in a torn batch (a crash mid-write; opening the store cuts it off, so a torn
tail alone is ok), and one line per damaged place: "FILE offset N: what", N being
where the damaged batch starts (where the open stops); it goes on past each one,
so it lists every place 'idem store repair' would drop, and the bytes it drops.
A file of another format version is a failure (exit status 1), not damage.
When stderr is a terminal, shows progress on one updating line.

DIR is the store's directory (a log:DIR store URL is accepted too). The store must
not be open: stop the server that uses it first. A directory holding no log files
(a mistyped path) is a failure, not an empty store.

Exit status: 0 intact (or only a torn tail), 1 damaged, unreadable or no store in
DIR, 2 usage error.
)help",
      .flags = {},
      .arg_names = {"DIR"},
      .run = &RunVerify,
  };
  return command;
}

const Command& StoreRepairCommand() {
  static const Command command{
      .name = "store repair",
      .synopsis = "idem store repair DIR",
      .summary = "rewrite a damaged log store, keeping the entries it can find intact",
      .help =
          R"help(Rewrites the log store in DIR into a new file holding the entries it can still
find intact, and drops the damaged bytes. What is kept: every batch that checks
out; in a damaged batch, the entries before the damage, and those after a damaged
entry when its length field still leads to the next one (or, when its length
field alone is damaged, the length at which its checksum holds does, and it is
kept too). When an entry's length cannot be found, the batch's later entries
cannot be found either (entries carry no marker to find them by), and are dropped
up to the next batch header that checks out; a snapshot is one batch, so that can
be much of it.
A file whose header is damaged is read with the salt of the store's other files
(or the one its header holds, if its batches check out under it); failing that it
is dropped whole, as is a file of another store. A file of another format version
stops the repair before anything changes.
Prints how many entries were kept, how many bytes were dropped and each damaged
place: "FILE bytes [a, b) (what)" for each dropped range, or "FILE offset N: what
(nothing dropped)". Nothing is deleted: the old files move to
DIR/repair-backup-<time>/, whose path is printed. Records whose entries were dropped
are lost (or fall back to an older state): run 'idem store verify DIR' first to see
what is damaged; it lists the same places.
When stderr is a terminal, shows progress on one updating line.

DIR is the store's directory (a log:DIR store URL is accepted too). The store must
not be open: stop the server that uses it first.

Exit status: 0 repaired, 1 failed, 2 usage error.
)help",
      .flags = {},
      .arg_names = {"DIR"},
      .run = &RunRepair,
  };
  return command;
}

}  // namespace idem::cli
