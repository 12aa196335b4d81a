#include "cli/store_url.h"

#include <string>

#include "core/url_text.h"

namespace idem {

std::string_view SupportedStoreUrls() {
  return "log:PATH[?sync=always|none|interval:MS], memory:, redis://HOST:PORT[?OPTIONS], "
         "redis+cluster://HOST:PORT,HOST:PORT[?OPTIONS], "
         "postgres://USER@HOST:PORT/DB[?schema=NAME]";
}

namespace {

Result<StoreConfig> ParseUrl(std::string_view url);

}  // namespace

// Whatever part of the URL a message quotes (a log store's bad sync value, libpq's token), no
// password the URL holds is shown.
Result<StoreConfig> ParseStoreUrl(std::string_view url) {
  Result<StoreConfig> config = ParseUrl(url);
  if (config.has_value()) return config;
  return Status(config.error().code(), core::RedactUrlPasswordIn(config.error().message(), url));
}

namespace {

Result<StoreConfig> ParseUrl(std::string_view url) {
  if (const std::size_t at = core::FirstControlByte(url); at != std::string_view::npos) {
    return InvalidArgumentError("store URL: " + core::ControlByteMessage(url, at));
  }
  const std::string quoted = "store URL \"" + std::string(url) + "\"";
  const auto colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    std::string hint;
    if (!url.empty() && (url[0] == '/' || url[0] == '.')) {
      hint = " (for a log store directory write log:" + std::string(url) + ")";
    }
    return InvalidArgumentError(quoted + " has no scheme" + hint +
                                "; supported: " + std::string(SupportedStoreUrls()));
  }
  const std::string_view scheme = url.substr(0, colon);
  if (scheme == "log") {
    auto options = ParseLogStoreUrl(url);
    if (!options) return options.error();
    return StoreConfig(std::move(*options));
  }
  if (scheme == "memory") {
    if (url.size() > colon + 1) {
      return InvalidArgumentError(quoted + ": memory: takes no path or options");
    }
    return StoreConfig(MemoryStoreOptions{});
  }
  if (scheme == "redis" || scheme == "redis+cluster" || scheme == "rediss") {
    auto options = ParseRedisStoreUrl(url);
    if (!options) return options.error();
    return StoreConfig(std::move(*options));
  }
  if (scheme == "postgres" || scheme == "postgresql") {
    auto options = ParsePostgresStoreUrl(url);
    if (!options) return options.error();
    return StoreConfig(std::move(*options));
  }
  return InvalidArgumentError(quoted + ": unknown scheme \"" + std::string(scheme) +
                              ":\"; supported: " + std::string(SupportedStoreUrls()));
}

}  // namespace

Result<std::unique_ptr<Store>> OpenStore(const StoreConfig& config) {
  if (const auto* log = std::get_if<LogStoreOptions>(&config)) return OpenLogStore(*log);
  if (const auto* redis = std::get_if<RedisStoreOptions>(&config)) return OpenRedisStore(*redis);
  if (const auto* pg = std::get_if<PostgresStoreOptions>(&config)) return OpenPostgresStore(*pg);
  return NewMemoryStore(std::get<MemoryStoreOptions>(config));
}

}  // namespace idem
