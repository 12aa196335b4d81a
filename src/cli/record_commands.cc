// idem get|list|erase|purge|stats: operator calls on a store named by its URL.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>
#include <variant>

#include "cli/command.h"
#include "cli/format.h"
#include "cli/store_url.h"
#include "core/url_text.h"
#include "idem/clock.h"
#include "idem/record.h"
#include "idem/store.h"

namespace idem::cli {
namespace {

// Operator calls read stores written with any configured key limit.
constexpr std::size_t kOperatorMaxKeyBytes = 64 * 1024;
constexpr std::size_t kHexBytesShown = 64;

// True when DIR holds a log store's files, so that a mistyped path is refused rather than
// turned into a new, empty store.
bool HoldsLogFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".log" || ext == ".snap") return true;
  }
  return false;
}

// The store behind `url`, opened for one short operator call (no background reaper or
// compaction), or the exit code of a failure already reported.
struct OpenedStore {
  std::unique_ptr<Store> store;
  int exit_code = kExitOk;
};

OpenedStore Open(const Command& self, std::string_view url) {
  auto config = ParseStoreUrl(url);
  if (!config) return {nullptr, UsageError(self, config.error().message())};
  if (auto* log = std::get_if<LogStoreOptions>(&*config)) {
    log->reclaim_interval = std::chrono::milliseconds(0);
    log->compact_ratio = 0;
    log->max_key_bytes = kOperatorMaxKeyBytes;
    std::error_code ec;
    if (!std::filesystem::is_directory(log->dir, ec)) {
      const bool exists = std::filesystem::exists(log->dir, ec);
      return {nullptr, Failure(self, "no log store at " + log->dir +
                                         (exists ? ": not a directory (a log store is the "
                                                   "directory holding its .log and .snap files)"
                                                 : ": no such directory"))};
    }
    if (!HoldsLogFiles(log->dir)) {
      return {nullptr, Failure(self, "no log store at " + log->dir + ": no .log or .snap files")};
    }
  } else if (auto* redis = std::get_if<RedisStoreOptions>(&*config)) {
    redis->max_key_bytes = kOperatorMaxKeyBytes;
  } else if (auto* pg = std::get_if<PostgresStoreOptions>(&*config)) {
    pg->reclaim_interval = std::chrono::milliseconds(0);
    pg->max_key_bytes = std::min<std::size_t>(kOperatorMaxKeyBytes, kMaxPostgresKeyBytes);
    pg->pool_size = 1;
  } else {
    auto& memory = std::get<MemoryStoreOptions>(*config);
    memory.reclaim_interval = std::chrono::milliseconds(0);
    memory.max_key_bytes = kOperatorMaxKeyBytes;
  }
  auto store = OpenStore(*config);
  if (!store) {
    const std::string why =
        "cannot open " + core::RedactUrlPassword(url) + ": " + store.error().ToString();
    // Options only the open could check are the command line's fault.
    if (store.error().code() == StatusCode::kInvalidArgument)
      return {nullptr, UsageError(self, why)};
    return {nullptr, Failure(self, why)};
  }
  return {std::move(*store), kExitOk};
}

// A store's refusal: malformed input is the command line's fault, anything else a failure.
int StoreError(const Command& self, const Status& status) {
  if (status.code() == StatusCode::kInvalidArgument) return UsageError(self, status.message());
  return Failure(self, status.ToString());
}

int RunGet(const Command& self, const Args& args) {
  OpenedStore opened = Open(self, args.positional()[0]);
  if (!opened.store) return opened.exit_code;
  const std::string& scope = args.positional()[1];
  const std::string& key = args.positional()[2];
  auto record = opened.store->Get(scope, key);
  if (!record) return StoreError(self, record.error());
  if (!record->has_value()) {
    return Failure(self,
                   "not found: no live record for scope " + Quote(scope) + " key " + Quote(key));
  }
  const Record& r = **record;
  std::cout << "scope        " << Quote(r.scope) << "\n"
            << "key          " << Quote(r.key) << "\n"
            << "state        " << RecordStateName(r.state) << "\n"
            << "token        " << r.token << "\n"
            << "attempt      " << r.attempt << "\n"
            << "created      " << FormatTime(r.created) << "\n";
  if (r.state == RecordState::kInProgress) {
    std::cout << "lease        " << FormatTime(r.lease_deadline) << "\n";
  }
  std::cout << "expires      " << FormatTime(r.expires) << "\n"
            << "fingerprint  " << (r.fingerprint ? r.fingerprint->Hex() : "none") << "\n";
  if (r.state == RecordState::kCompleted) {
    std::cout << "outcome      " << OutcomeName(r.outcome) << "\n"
              << "response     " << r.response.size() << " bytes\n";
    if (IsPrintable(r.response)) {
      if (!r.response.empty()) std::cout << r.response << "\n";
    } else {
      std::cout << "response hex " << HexPrefix(r.response, kHexBytesShown)
                << (r.response.size() > kHexBytesShown ? " ..." : "") << "\n";
    }
  }
  return kExitOk;
}

int RunList(const Command& self, const Args& args) {
  ListFilter filter;
  if (auto scope = args.Value("scope")) filter.scope = std::string(*scope);
  if (auto state = args.Value("state")) {
    if (*state == RecordStateName(RecordState::kInProgress)) {
      filter.state = RecordState::kInProgress;
    } else if (*state == RecordStateName(RecordState::kCompleted)) {
      filter.state = RecordState::kCompleted;
    } else {
      return UsageError(
          self, "bad --state \"" + std::string(*state) + "\": expected in_progress or completed");
    }
  }
  if (auto older = args.Value("older-than")) {
    auto d = ParseDuration(*older);
    if (!d) return UsageError(self, "--older-than: " + d.error().message());
    filter.created_before = Clock::System().Now() - *d;
  }
  if (auto limit = args.Value("limit")) {
    auto n = ParseCount(*limit);
    if (!n) return UsageError(self, "--limit: " + n.error().message());
    filter.limit = static_cast<std::size_t>(*n);
  }
  OpenedStore opened = Open(self, args.positional()[0]);
  if (!opened.store) return opened.exit_code;
  auto records = opened.store->List(filter);
  if (!records) return StoreError(self, records.error());
  std::sort(records->begin(), records->end(), [](const Record& a, const Record& b) {
    return std::tie(a.created, a.scope, a.key) < std::tie(b.created, b.scope, b.key);
  });
  for (const Record& r : *records) {
    std::cout << RecordStateName(r.state) << " scope=" << Quote(r.scope) << " key=" << Quote(r.key)
              << " token=" << r.token << " attempt=" << r.attempt
              << " created=" << FormatTime(r.created);
    if (r.state == RecordState::kInProgress) {
      std::cout << " lease=" << FormatTime(r.lease_deadline);
    } else {
      std::cout << " outcome=" << OutcomeName(r.outcome) << " response_bytes=" << r.response.size();
    }
    std::cout << " expires=" << FormatTime(r.expires) << "\n";
  }
  if (records->size() >= filter.limit) {
    // The store picks which records fill the limit, so these need not be the oldest.
    std::cerr << "idem list: stopped at --limit " << filter.limit
              << " records; there may be more (raise --limit)\n";
  }
  return kExitOk;
}

int RunErase(const Command& self, const Args& args) {
  OpenedStore opened = Open(self, args.positional()[0]);
  if (!opened.store) return opened.exit_code;
  const std::string& scope = args.positional()[1];
  const std::string& key = args.positional()[2];
  auto erased = opened.store->Erase(scope, key);
  if (!erased) return StoreError(self, erased.error());
  if (!*erased) {
    return Failure(self,
                   "not found: no live record for scope " + Quote(scope) + " key " + Quote(key));
  }
  std::cout << "erased scope " << Quote(scope) << " key " << Quote(key) << "\n";
  return kExitOk;
}

int RunPurge(const Command& self, const Args& args) {
  OpenedStore opened = Open(self, args.positional()[0]);
  if (!opened.store) return opened.exit_code;
  auto reclaimed = opened.store->Purge();
  if (!reclaimed) return StoreError(self, reclaimed.error());
  std::cout << "reclaimed " << *reclaimed << " expired record(s)\n";
  return kExitOk;
}

int RunStats(const Command& self, const Args& args) {
  OpenedStore opened = Open(self, args.positional()[0]);
  if (!opened.store) return opened.exit_code;
  auto stats = opened.store->Stats();
  if (!stats) return StoreError(self, stats.error());
  std::cout << "store        " << opened.store->Name() << "\n"
            << "in_progress  " << stats->in_progress << "\n"
            << "completed    " << stats->completed << "\n"
            << "sessions     " << stats->sessions << "\n"
            << "entities     " << stats->entities << "\n"
            << "bytes        " << stats->bytes << " (" << FormatSize(stats->bytes) << ")\n";
  return kExitOk;
}

#define IDEM_CLI_STORE_URL_HELP                                                             \
  "STORE_URL is log:DIR[?sync=always|none|interval:MS] (the log store in DIR, which must\n" \
  "already exist and must not be open in another process: stop its server first),\n"        \
  "redis://HOST:PORT[?OPTIONS] or redis+cluster://HOST:PORT,HOST:PORT[?OPTIONS] (a Redis\n" \
  "store; docs/redis.md lists the options),\n"                                              \
  "postgres://USER@HOST:PORT/DB[?schema=NAME] (a PostgreSQL store whose schema\n"           \
  "'idem store init URL' created), or\n"                                                    \
  "memory: (a new, empty memory store; only useful for trying the tool out).\n"

}  // namespace

const Command& GetCommand() {
  static const Command command{
      .name = "get",
      .synopsis = "idem get STORE_URL SCOPE KEY",
      .summary = "print the live record of a key",
      .help =
          "Prints the live record for (SCOPE, KEY): its state, token, attempt, created,\n"
          "lease and expiry times (ISO-8601 UTC), fingerprint, and for a completed record\n"
          "its outcome and response (as text when printable, else the hex of its first 64\n"
          "bytes). SCOPE may be \"\" (the default scope).\n\n" IDEM_CLI_STORE_URL_HELP
          "\nExit status: 0 printed, 1 not found (absent or expired) or the store failed,\n"
          "2 usage error.\n",
      .flags = {},
      .arg_names = {"STORE_URL", "SCOPE", "KEY"},
      .run = &RunGet,
  };
  return command;
}

const Command& ListCommand() {
  static const Command command{
      .name = "list",
      .synopsis =
          "idem list STORE_URL [--scope S] [--state in_progress|completed] "
          "[--older-than DURATION] [--limit N]",
      .summary = "list live records, one line each",
      .help =
          "Lists live records, oldest first, one line each.\n\n"
          "  --scope S             only records in scope S\n"
          "  --state STATE         only in_progress or only completed records\n"
          "  --older-than DURATION only records created more than DURATION ago, e.g.\n"
          "                        500ms, 30s, 5m, 2h, 7d (stuck work: --state in_progress\n"
          "                        --older-than 1h)\n"
          "  --limit N             at most N records (default 1000); past the limit, which\n"
          "                        records are shown is up to the store\n\n" IDEM_CLI_STORE_URL_HELP
          "\nExit status: 0 listed (even none), 1 the store failed, 2 usage error.\n",
      .flags = {{"scope", true}, {"state", true}, {"older-than", true}, {"limit", true}},
      .arg_names = {"STORE_URL"},
      .run = &RunList,
  };
  return command;
}

const Command& EraseCommand() {
  static const Command command{
      .name = "erase",
      .synopsis = "idem erase STORE_URL SCOPE KEY",
      .summary = "remove the record of a key, whatever its state",
      .help =
          "Removes the record for (SCOPE, KEY) whatever its state, so the next delivery of\n"
          "that key runs the handler again. A worker still holding the key will get\n"
          "lease_lost when it completes.\n\n" IDEM_CLI_STORE_URL_HELP
          "\nExit status: 0 erased, 1 not found or the store failed, 2 usage error.\n",
      .flags = {},
      .arg_names = {"STORE_URL", "SCOPE", "KEY"},
      .run = &RunErase,
  };
  return command;
}

const Command& PurgeCommand() {
  static const Command command{
      .name = "purge",
      .synopsis = "idem purge STORE_URL",
      .summary = "reclaim every record whose retention is over",
      .help =
          "Reclaims now every record whose retention is over (a running store does the\n"
          "same in the background) and prints how many. Opening a log: store already\n"
          "leaves out what expired while it was closed: those are not "
          "counted.\n\n" IDEM_CLI_STORE_URL_HELP
          "\nExit status: 0 done, 1 the store failed, 2 usage error.\n",
      .flags = {},
      .arg_names = {"STORE_URL"},
      .run = &RunPurge,
  };
  return command;
}

const Command& StatsCommand() {
  static const Command command{
      .name = "stats",
      .synopsis = "idem stats STORE_URL",
      .summary = "print record counts and the store's size",
      .help =
          "Prints how many records are in progress and completed, how many client sessions\n"
          "and versioned entities the store keeps, and the bytes it uses.\n\n"
          "" IDEM_CLI_STORE_URL_HELP
          "\nExit status: 0 printed, 1 the store failed, 2 usage error.\n",
      .flags = {},
      .arg_names = {"STORE_URL"},
      .run = &RunStats,
  };
  return command;
}

}  // namespace idem::cli
