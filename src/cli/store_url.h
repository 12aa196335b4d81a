// Store URLs: how idem and idemd name the store to open.
//
//   log:/var/lib/idem[?sync=always|none|interval:<ms>]   the embedded log store
//   memory:                                              an empty in-process memory store
//   redis://HOST:PORT[?opt=...], redis+cluster://HOST:PORT,HOST:PORT[?opt=...]   Redis
//                                                        (idem/stores/redis.h)
//   postgres://USER@HOST:PORT/DB[?schema=NAME&...]       PostgreSQL (also postgresql://)
//
// Parsing is
// separate from opening so that a caller can tell a wrong URL (the user's to fix) from a store
// that fails to open, and can adjust the options in between.
#ifndef IDEM_CLI_STORE_URL_H_
#define IDEM_CLI_STORE_URL_H_

#include <memory>
#include <string_view>
#include <variant>

#include "idem/status.h"
#include "idem/store.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"
#include "idem/stores/postgres.h"
#include "idem/stores/redis.h"

namespace idem {

using StoreConfig =
    std::variant<MemoryStoreOptions, LogStoreOptions, RedisStoreOptions, PostgresStoreOptions>;

// One line naming the supported URL forms, for help and error messages.
std::string_view SupportedStoreUrls();

// kInvalidArgument naming what is wrong (an unknown or unsupported scheme, a bad option).
Result<StoreConfig> ParseStoreUrl(std::string_view url);

// Opens the store; errors are the store factory's (kFailedPrecondition when another process
// holds a log directory, kDataLoss for damage, ...).
Result<std::unique_ptr<Store>> OpenStore(const StoreConfig& config);

}  // namespace idem

#endif  // IDEM_CLI_STORE_URL_H_
