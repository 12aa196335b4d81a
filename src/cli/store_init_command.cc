// idem store init: creates (or brings up to date) a PostgreSQL store's schema.
#include <iostream>
#include <string>
#include <variant>

#include "cli/command.h"
#include "cli/store_url.h"
#include "idem/stores/postgres.h"

namespace idem::cli {
namespace {

int RunInit(const Command& self, const Args& args) {
  const std::string& url = args.positional()[0];
  auto config = ParseStoreUrl(url);
  if (!config) return UsageError(self, config.error().message());
  auto* pg = std::get_if<PostgresStoreOptions>(&*config);
  if (pg == nullptr) {
    return UsageError(self,
                      "store init is for postgres:// stores; redis://, log: and memory: stores "
                      "need no init (Redis keys and a log store's directory are made as they "
                      "are used)");
  }
  auto before = PostgresSchemaVersion(*pg);
  if (!before) return Failure(self, before.error().ToString());
  if (Status s = InitPostgresSchema(*pg); !s.ok()) return Failure(self, s.ToString());
  const std::string schema = "schema \"" + pg->schema + "\"";
  const std::string version = "version " + std::to_string(kPostgresSchemaVersion);
  if (!*before) {
    std::cout << "created " << schema << " at " << version
              << ": tables records, sessions, seq_records, entities and meta, the token "
                 "sequence and idem's functions\n";
  } else {
    std::cout << schema << " was already at " << version
              << "; its tables were kept and idem's functions replaced with this build's\n";
  }
  return kExitOk;
}

}  // namespace

const Command& StoreInitCommand() {
  static const Command command{
      .name = "store init",
      .synopsis = "idem store init URL",
      .summary = "create or update a PostgreSQL store's schema",
      .help = R"help(Creates the schema a PostgreSQL store lives in: the schema itself (the URL's
schema=NAME, default idem), its tables (records, sessions, seq_records, entities,
meta), the token sequence, idem's functions and the schema version row, all in
one transaction. Run it once before the first idemd or library user opens the
store. Running it again is safe: tables and their rows are kept, functions are
replaced with this build's. Concurrent runs take turns.

URL is postgres://USER[:PASSWORD]@HOST:PORT/DB[?schema=NAME] (or postgresql://).
The user needs CREATE on the database (or on the schema, if it exists).

Exit status: 0 created or already there, 1 failed (the server is unreachable, or
the schema holds another version), 2 usage error.
)help",
      .flags = {},
      .arg_names = {"URL"},
      .run = &RunInit,
  };
  return command;
}

}  // namespace idem::cli
