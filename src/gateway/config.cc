#include "gateway/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <utility>
#include <variant>

#include "core/duration_text.h"
#include "core/machine.h"
#include "core/url_text.h"
#include "gateway/config_values.h"
#include "idem/key.h"
#include "idem/stores/log.h"
#include "idem/stores/postgres.h"
#include "idem/stores/redis.h"

namespace idem::gateway {
namespace config_detail {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::size_t kMaxThreads = 1024;
constexpr std::size_t kMaxStoreThreads = 4096;
// A stored response is the body plus at most the upstream's header block (64 KiB, the
// response parser's limit in server.cc) and a few bytes of framing. Every store must take it in one
// record, and the log store's limit is the smallest (64 MiB a frame, stores/log/codec.h): a body it
// refused would leave the key IN_PROGRESS after the upstream acted, and the retry after the
// lease would run it again. So the option stops well below that.
constexpr std::uint64_t kMaxStoredBodyBytes = std::uint64_t{32} << 20;

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// ---- value syntax shared by the file and the flags ----

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Decimal digits only (no sign, no spaces); nullopt on overflow or anything else.
std::optional<std::uint64_t> ParseUnsigned(std::string_view s) {
  if (!AllDigits(s)) return std::nullopt;
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

constexpr std::string_view kSizeSyntax =
    "write e.g. 4096, 16KiB, 1MiB or 1GiB; KB, MB, GB are powers of 1000";

// "4096", "16KiB", "1MiB", "1GiB", "1KB", "2MB", "1GB", "512B".
Result<std::uint64_t> ParseSize(std::string_view text) {
  const auto bad = [&] {
    return InvalidArgumentError(Quote(text) + " is not a size (" + std::string(kSizeSyntax) + ")");
  };
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const auto number = ParseUnsigned(text.substr(0, digits));
  const std::string_view unit = text.substr(digits);
  if (!number) return bad();
  std::uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KiB") scale = std::uint64_t{1} << 10;
  if (unit == "MiB") scale = std::uint64_t{1} << 20;
  if (unit == "GiB") scale = std::uint64_t{1} << 30;
  if (unit == "KB") scale = 1'000;
  if (unit == "MB") scale = 1'000'000;
  if (unit == "GB") scale = 1'000'000'000;
  if (scale == 0) return bad();
  if (*number > std::numeric_limits<std::uint64_t>::max() / scale) return bad();
  return *number * scale;
}

std::string FormatDuration(milliseconds d) {
  const auto ms = d.count();
  if (ms != 0 && ms % 86'400'000 == 0) return std::to_string(ms / 86'400'000) + "d";
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

std::string FormatSize(std::uint64_t n) {
  if (n != 0 && n % (std::uint64_t{1} << 30) == 0) return std::to_string(n >> 30) + "GiB";
  if (n != 0 && n % (std::uint64_t{1} << 20) == 0) return std::to_string(n >> 20) + "MiB";
  if (n != 0 && n % (std::uint64_t{1} << 10) == 0) return std::to_string(n >> 10) + "KiB";
  return std::to_string(n);
}

std::string FormatEndpoint(const Endpoint& e) {
  const bool v6 = e.host.find(':') != std::string::npos;
  return (v6 ? "[" + e.host + "]" : e.host) + ":" + std::to_string(e.port);
}

// RFC 9110 tchar: header names and methods are tokens.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}
bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar);
}

std::optional<std::string> CheckHeaderName(std::string_view name) {
  if (IsToken(name)) return std::nullopt;
  return Quote(name) + " is not a header name (letters, digits and !#$%&'*+-.^_`|~ only)";
}

namespace {
std::optional<std::string> CheckStoreUrlText(std::string_view url);
}  // namespace

// Whatever part of the URL a message quotes, no password the URL holds is shown.
std::optional<std::string> CheckStoreUrl(std::string_view url) {
  std::optional<std::string> wrong = CheckStoreUrlText(url);
  if (wrong) *wrong = core::RedactUrlPasswordIn(*wrong, url);
  return wrong;
}

namespace {

std::optional<std::string> CheckStoreUrlText(std::string_view url) {
  constexpr std::string_view kForms =
      "memory:, log:DIR[?sync=always|interval:MS|none], redis://HOST:PORT, "
      "redis+cluster://HOST:PORT,HOST:PORT, postgres://...";
  if (const std::size_t at = core::FirstControlByte(url); at != std::string_view::npos) {
    return core::ControlByteMessage(url, at);
  }
  const auto colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    std::string hint;
    if (!url.empty() && (url[0] == '/' || url[0] == '.')) {
      hint = " (for a log store directory write log:" + std::string(url) + ")";
    }
    return Quote(url) + " has no scheme" + hint + "; forms: " + std::string(kForms);
  }
  const std::string_view scheme = url.substr(0, colon);
  const std::string_view rest = url.substr(colon + 1);
  if (scheme == "memory") {
    if (!rest.empty()) return Quote(url) + ": memory: takes no path or options";
    return std::nullopt;
  }
  if (scheme == "log") {
    auto parsed = ParseLogStoreUrl(url);
    if (!parsed) return parsed.error().message();
    return std::nullopt;
  }
  // The stores' own parsers: what they accept idemd accepts (user:password@, a default port,
  // /DB, ?options), and an option they refuse is refused here, with the file's line.
  if (scheme == "redis" || scheme == "redis+cluster") {
    if (auto parsed = ParseRedisStoreUrl(url); !parsed) return parsed.error().message();
    return std::nullopt;
  }
  if (scheme == "postgres" || scheme == "postgresql") {
    if (auto parsed = ParsePostgresStoreUrl(url); !parsed) return parsed.error().message();
    return std::nullopt;
  }
  if (scheme == "rediss") return Quote(url) + ": TLS to the store is not supported";
  return Quote(url) + ": unknown scheme " + Quote(std::string(scheme) + ":") +
         "; forms: " + std::string(kForms);
}

}  // namespace

// ---- the option table: one row per top-level option, shared by the file, flags and help ----

enum class Kind : std::uint8_t {
  kEndpoint,
  kUpstream,
  kStore,
  kHeaderName,
  kLogLevel,
  kSecretFile,
  kSecondarySecretFile,
  kCount,
  kSize,
  kDuration,
  kSeconds,
  kHeaderList,
};

using Field =
    std::variant<Endpoint Config::*, std::string Config::*, std::size_t Config::*,
                 milliseconds Config::*, seconds Config::*, std::vector<std::string> Config::*>;

struct Option {
  std::string_view name;
  Kind kind;
  Field field;
  std::string_view value_name;  // in help: --listen HOST:PORT
  std::string_view meaning;
  std::uint64_t min = 0;  // counts, sizes (bytes), durations (ms)
  std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
};

constexpr std::uint64_t kNoMax = std::numeric_limits<std::uint64_t>::max();

const std::vector<Option>& Options() {
  static const std::vector<Option> options{
      {"listen", Kind::kEndpoint, &Config::listen, "HOST:PORT",
       "where clients connect (port 0: any free port)"},
      {"admin", Kind::kEndpoint, &Config::admin, "HOST:PORT",
       "admin listener: /metrics, /healthz, /readyz (keep it on loopback)"},
      {"upstream", Kind::kUpstream, &Config::upstream, "URL",
       "the API behind idemd: http://HOST[:PORT][/BASE] (https is not supported)"},
      {"store", Kind::kStore, &Config::store, "URL",
       "where keys and stored responses are kept (see Store URLs)"},
      {"threads", Kind::kCount, &Config::threads, "N", "I/O threads; 0 = one per core", 0,
       kMaxThreads},
      {"store_threads", Kind::kCount, &Config::store_threads, "N",
       "batches of the waiting requests' store operations in flight at once, and the threads "
       "that call a store that blocks (Redis, PostgreSQL); 0 = call the store inline",
       0, kMaxStoreThreads},
      {"principal_header", Kind::kHeaderName, &Config::principal_header, "NAME",
       "request header whose value's hash scopes keys (a credential or tenant id)"},
      {"principal_secret_file", Kind::kSecretFile, &Config::principal_secret_file, "FILE",
       "a file holding a secret (16 to 4096 bytes) under which principals are hashed (HMAC), "
       "so that whoever reads the store cannot test guesses of a credential; changing it "
       "changes every principal's scope"},
      {"principal_secret_secondary_file", Kind::kSecondarySecretFile,
       &Config::principal_secret_secondary_file, "FILE",
       "for rotating the secret: another secret file (or \"plain\": no secret) whose scopes are "
       "looked up too when a key is acquired under principal_secret_file's, and answered from "
       "there "
       "(docs/gateway.md)"},
      {"key_header", Kind::kHeaderName, &Config::key_header, "NAME",
       "request header carrying the idempotency key"},
      // Not above the stores' fixed limit: a longer key would pass here and the store would
      // refuse it (idem/key.h).
      {"max_key_bytes", Kind::kCount, &Config::max_key_bytes, "N", "longer keys are answered 400",
       1, kDefaultMaxKeyBytes},
      {"max_body_bytes", Kind::kSize, &Config::max_body_bytes, "SIZE",
       "larger request bodies are answered 413"},
      {"max_header_bytes", Kind::kSize, &Config::max_header_bytes, "SIZE",
       "larger request header blocks are answered 431 (414 when the request line alone is)", 1,
       kNoMax},
      {"max_stored_body_bytes", Kind::kSize, &Config::max_stored_body_bytes, "SIZE",
       "larger upstream bodies are not stored: the key completes, a replay answers an error", 0,
       kMaxStoredBodyBytes},
      {"strip_headers", Kind::kHeaderList, &Config::strip_headers, "NAME,...",
       "upstream response headers never stored or replayed (e.g. Set-Cookie)"},
      {"upstream_timeout", Kind::kDuration, &Config::upstream_timeout, "DURATION",
       "the upstream must answer within it, else 504 and the key is released", 1, kNoMax},
      {"client_timeout", Kind::kDuration, &Config::client_timeout, "DURATION",
       "a whole request must arrive within it, else the connection is closed", 1, kNoMax},
      {"idle_timeout", Kind::kDuration, &Config::idle_timeout, "DURATION",
       "idle keep-alive client connections are closed after it", 1, kNoMax},
      {"shutdown_grace", Kind::kDuration, &Config::shutdown_grace, "DURATION",
       "on SIGTERM, in-flight requests get this long to finish"},
      {"upstream_connections", Kind::kCount, &Config::upstream_connections, "N",
       "most pooled keep-alive connections to the upstream", 1, kNoMax},
      {"retry_after", Kind::kSeconds, &Config::retry_after, "DURATION",
       "Retry-After sent with 503 when the store is unreachable (whole seconds)"},
      {"log_level", Kind::kLogLevel, &Config::log_level, "LEVEL", "debug, info, warn or error"},
  };
  return options;
}

const Option* FindOption(std::string_view name) {
  for (const Option& o : Options()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

constexpr std::string_view kRouteKeys[] = {
    "prefix", "methods",   "key",   "in_flight",       "wait",
    "lease",  "retention", "scope", "stored_statuses", "anonymous"};
bool IsRouteKey(std::string_view name) {
  return std::find(std::begin(kRouteKeys), std::end(kRouteKeys), name) != std::end(kRouteKeys);
}

std::string DefaultText(const Option& o) {
  static const Config defaults;
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = defaults.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Endpoint>) {
          return FormatEndpoint(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return v.empty() ? "none" : v;
        } else if constexpr (std::is_same_v<T, std::size_t>) {
          return o.kind == Kind::kSize ? FormatSize(v) : std::to_string(v);
        } else if constexpr (std::is_same_v<T, milliseconds>) {
          return FormatDuration(v);
        } else if constexpr (std::is_same_v<T, seconds>) {
          return FormatDuration(v);
        } else {
          std::string out;
          for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
          return out.empty() ? "none" : out;
        }
      },
      o.field);
}

// A value on its way into Config: already in the option's unit, not yet range-checked.
using Raw = std::variant<std::string, std::uint64_t, milliseconds, std::vector<std::string>>;

std::string_view TypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

Status WrongType(const toml::node& n, std::string_view expected) {
  return InvalidArgumentError("expected " + std::string(expected) + ", got " +
                              std::string(TypeName(n)));
}

Result<std::uint64_t> NonNegative(const toml::node& n) {
  const std::int64_t v = n.as_integer()->get();
  if (v < 0) return InvalidArgumentError(std::to_string(v) + " is negative");
  return static_cast<std::uint64_t>(v);
}

Result<milliseconds> DurationFromNode(const toml::node& n) {
  if (n.is_integer()) {
    auto v = NonNegative(n);
    if (!v) return v.error();
    return core::DurationOfMillis(*v);
  }
  if (n.is_string()) return ParseDuration(n.as_string()->get());
  return WrongType(n, "a duration string (\"30s\") or an integer of milliseconds");
}

Result<std::vector<std::string>> StringsFromNode(const toml::node& n) {
  const toml::array* a = n.as_array();
  if (a == nullptr) return WrongType(n, "an array of strings");
  std::vector<std::string> out;
  for (const toml::node& e : *a) {
    if (!e.is_string()) return WrongType(e, "an array of strings, but an element is");
    out.push_back(e.as_string()->get());
  }
  return out;
}

// The principal secret in the file at `path` ("" for none), without trailing whitespace (a
// newline an editor or `echo` added).
Result<std::string> ReadSecret(const std::string& path) {
  constexpr std::size_t kMinSecretBytes = 16;
  constexpr std::size_t kMaxSecretBytes = 4096;
  if (path.empty()) return std::string();
  auto text = ReadFile(path);
  if (!text) return text.error();
  const std::size_t end = text->find_last_not_of(" \t\r\n");
  text->resize(end == std::string::npos ? 0 : end + 1);
  if (text->size() < kMinSecretBytes) {
    return InvalidArgumentError(
        path + " holds " + std::to_string(text->size()) +
        " bytes; a principal secret needs at least " + std::to_string(kMinSecretBytes) +
        " (make one with: head -c 32 /dev/urandom | base64 > " + path + ")");
  }
  if (text->size() > kMaxSecretBytes) {
    return InvalidArgumentError(path + " holds " + std::to_string(text->size()) +
                                " bytes; a principal secret file holds at most " +
                                std::to_string(kMaxSecretBytes));
  }
  return std::move(*text);
}

Result<Raw> RawFromNode(Kind kind, const toml::node& n) {
  switch (kind) {
    case Kind::kEndpoint:
    case Kind::kUpstream:
    case Kind::kStore:
    case Kind::kHeaderName:
    case Kind::kLogLevel:
    case Kind::kSecretFile:
    case Kind::kSecondarySecretFile:
      if (!n.is_string()) return WrongType(n, "a string");
      return Raw(n.as_string()->get());
    case Kind::kCount: {
      if (!n.is_integer()) return WrongType(n, "an integer");
      auto v = NonNegative(n);
      if (!v) return v.error();
      return Raw(*v);
    }
    case Kind::kSize: {
      if (n.is_integer()) {
        auto v = NonNegative(n);
        if (!v) return v.error();
        return Raw(*v);
      }
      if (!n.is_string()) return WrongType(n, "a size (an integer or a string like \"1MiB\")");
      auto v = ParseSize(n.as_string()->get());
      if (!v) return v.error();
      return Raw(*v);
    }
    case Kind::kDuration:
    case Kind::kSeconds: {
      auto v = DurationFromNode(n);
      if (!v) return v.error();
      return Raw(*v);
    }
    case Kind::kHeaderList: {
      auto v = StringsFromNode(n);
      if (!v) return v.error();
      return Raw(std::move(*v));
    }
  }
  return InternalError("unknown option kind");
}

Result<Raw> RawFromFlag(Kind kind, std::string_view text) {
  switch (kind) {
    case Kind::kCount: {
      auto v = ParseUnsigned(text);
      if (!v) return InvalidArgumentError(Quote(text) + " is not a non-negative integer");
      return Raw(*v);
    }
    case Kind::kSize: {
      auto v = ParseSize(text);
      if (!v) return v.error();
      return Raw(*v);
    }
    case Kind::kDuration:
    case Kind::kSeconds: {
      auto v = ParseDuration(text);
      if (!v) return v.error();
      return Raw(*v);
    }
    case Kind::kHeaderList: {
      std::vector<std::string> out;
      while (!text.empty()) {
        const std::string_view one = text.substr(0, text.find(','));
        out.emplace_back(one);
        text.remove_prefix(std::min(text.size(), one.size() + 1));
      }
      return Raw(std::move(out));
    }
    default:
      return Raw(std::string(text));
  }
}

// Checks a value against the option's rules and stores it; the error names what is wrong.
std::optional<std::string> Store(const Option& o, Raw raw, Config& config) {
  if (auto* n = std::get_if<std::uint64_t>(&raw)) {
    const std::string shown = o.kind == Kind::kSize ? FormatSize(*n) : std::to_string(*n);
    auto limit = [&](std::uint64_t v) {
      return o.kind == Kind::kSize ? FormatSize(v) : std::to_string(v);
    };
    if (*n < o.min) return shown + " is below the minimum, " + limit(o.min);
    if (*n > o.max) return shown + " is above the maximum, " + limit(o.max);
    if (*n > std::numeric_limits<std::size_t>::max()) return shown + " is too large";
    config.*std::get<std::size_t Config::*>(o.field) = static_cast<std::size_t>(*n);
    return std::nullopt;
  }
  if (auto* d = std::get_if<milliseconds>(&raw)) {
    if (static_cast<std::uint64_t>(d->count()) < o.min) {
      return "must be above " + FormatDuration(milliseconds(o.min - 1));
    }
    if (o.kind == Kind::kSeconds) {
      if (d->count() % 1000 != 0) {
        return FormatDuration(*d) +
               " is not a whole number of seconds (Retry-After counts seconds; write e.g. 2s)";
      }
      config.*std::get<seconds Config::*>(o.field) = std::chrono::duration_cast<seconds>(*d);
      return std::nullopt;
    }
    config.*std::get<milliseconds Config::*>(o.field) = *d;
    return std::nullopt;
  }
  if (auto* list = std::get_if<std::vector<std::string>>(&raw)) {
    for (const std::string& name : *list) {
      if (auto e = CheckHeaderName(name)) return e;
    }
    config.*std::get<std::vector<std::string> Config::*>(o.field) = std::move(*list);
    return std::nullopt;
  }
  std::string& text = std::get<std::string>(raw);
  switch (o.kind) {
    case Kind::kEndpoint: {
      auto e = ParseEndpoint(text);
      if (!e) return e.error().message();
      config.*std::get<Endpoint Config::*>(o.field) = std::move(*e);
      return std::nullopt;
    }
    case Kind::kUpstream:
      if (auto u = ParseUpstreamUrl(text); !u) return u.error().message();
      break;
    case Kind::kStore:
      if (auto e = CheckStoreUrl(text)) return e;
      break;
    case Kind::kHeaderName:
      if (auto e = CheckHeaderName(text)) return e;
      break;
    case Kind::kLogLevel:
      if (text != "debug" && text != "info" && text != "warn" && text != "error") {
        return Quote(text) + " is not a log level (debug, info, warn or error)";
      }
      break;
    case Kind::kSecretFile: {
      auto secret = ReadSecret(text);
      if (!secret) return secret.error().message();
      config.principal_secret = std::move(*secret);
      break;
    }
    case Kind::kSecondarySecretFile: {
      if (text.empty()) {
        config.principal_secret_secondary.reset();
        break;
      }
      if (text == "plain") {
        config.principal_secret_secondary.emplace();
        break;
      }
      auto secret = ReadSecret(text);
      if (!secret) return secret.error().message();
      config.principal_secret_secondary = std::move(*secret);
      break;
    }
    default:
      return "internal: bad option kind";
  }
  config.*std::get<std::string Config::*>(o.field) = std::move(text);
  return std::nullopt;
}

// ---- the file ----

// Where each value came from, for messages about options that depend on each other.
struct Origins {
  std::map<std::string, std::string, std::less<>> option;  // "upstream_timeout" -> "f.toml:4"
  struct RouteOrigin {
    std::string lease;  // "f.toml:9": the lease key, or the [[route]] header without one
    bool lease_set = false;
  };
  std::vector<RouteOrigin> routes;
};

struct Draft {
  Config config;
  Origins origins;
};

std::string At(std::string_view file, const toml::source_region& where) {
  return std::string(file) + ":" + std::to_string(where.begin.line);
}

Status ErrorAt(std::string_view where, std::string_view option, std::string_view what) {
  return InvalidArgumentError(std::string(where) + ": " + std::string(option) + ": " +
                              std::string(what));
}

// A table's entries in file order (toml++ iterates keys sorted), so the first error reported
// is the first in the file.
std::vector<std::pair<const toml::key*, const toml::node*>> InFileOrder(const toml::table& t) {
  std::vector<std::pair<const toml::key*, const toml::node*>> out;
  for (auto&& [k, v] : t) out.emplace_back(&k, &v);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const auto& x = a.first->source().begin;
    const auto& y = b.first->source().begin;
    return x.line != y.line ? x.line < y.line : x.column < y.column;
  });
  return out;
}

std::optional<std::string> CheckMethod(std::string_view m) {
  const bool upper_token =
      IsToken(m) && std::none_of(m.begin(), m.end(), [](char c) { return c >= 'a' && c <= 'z'; });
  if (upper_token) return std::nullopt;
  std::string upper(m);
  for (char& c : upper) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  if (IsToken(m)) {
    return Quote(m) + " is not an uppercase method name (methods are case-sensitive: write " +
           Quote(upper) + ")";
  }
  return Quote(m) + " is not a method name (an uppercase token such as \"POST\")";
}

// "200-299", "404", "4xx" or an integer.
Result<StatusRange> ParseStatusRange(const toml::node& n) {
  const auto check = [](StatusRange r, std::string shown) -> Result<StatusRange> {
    if (r.first < 100 || r.last > 599 || r.first > r.last) {
      return InvalidArgumentError(shown + " is not a status range within 100-599");
    }
    return r;
  };
  if (n.is_integer()) {
    const std::int64_t v = n.as_integer()->get();
    if (v < 100 || v > 599) {
      return InvalidArgumentError(std::to_string(v) + " is not an HTTP status (100-599)");
    }
    return StatusRange{static_cast<unsigned>(v), static_cast<unsigned>(v)};
  }
  if (!n.is_string()) return WrongType(n, "status strings (\"2xx\", \"200-299\") or integers, got");
  const std::string& s = n.as_string()->get();
  const auto bad = [&] {
    return InvalidArgumentError(Quote(s) +
                                " is not a status, range or class (write \"404\", \"200-299\" or "
                                "\"4xx\")");
  };
  if (s.size() == 3 && s[0] >= '1' && s[0] <= '5' && s.substr(1) == "xx") {
    const auto hundred = static_cast<unsigned>(s[0] - '0') * 100;
    return StatusRange{hundred, hundred + 99};
  }
  const auto dash = s.find('-');
  const auto first = ParseUnsigned(std::string_view(s).substr(0, dash));
  if (!first || *first > 999) return bad();
  if (dash == std::string::npos) {
    return check({static_cast<unsigned>(*first), static_cast<unsigned>(*first)}, Quote(s));
  }
  const auto last = ParseUnsigned(std::string_view(s).substr(dash + 1));
  if (!last || *last > 999) return bad();
  return check({static_cast<unsigned>(*first), static_cast<unsigned>(*last)}, Quote(s));
}

std::optional<std::string> CheckPrefix(std::string_view p) {
  if (p.empty() || p[0] != '/') return Quote(p) + " does not start with '/'";
  for (char c : p) {
    if (c <= ' ' || c >= 0x7f || c == '?' || c == '#') {
      return Quote(p) + " is not a path prefix (no spaces, '?', '#' or non-ASCII bytes)";
    }
  }
  return std::nullopt;
}

Status ParseRoute(std::string_view file, const toml::table& t, Draft& draft,
                  std::map<std::string, std::string>& prefixes) {
  Route route;
  Origins::RouteOrigin origin{At(file, t.source()), false};
  bool has_prefix = false;
  bool has_scope = false;
  std::string wait_at = origin.lease;
  for (auto [k, v] : InFileOrder(t)) {
    const std::string key(k->str());
    const std::string where = At(file, k->source());
    const std::string option = "route." + key;
    const auto fail = [&](std::string_view what) { return ErrorAt(where, option, what); };
    const auto string_value = [&, &v = v]() -> Result<std::string> {
      if (!v->is_string()) return WrongType(*v, "a string");
      return v->as_string()->get();
    };
    if (key == "prefix" || key == "scope" || key == "key" || key == "in_flight" ||
        key == "anonymous") {
      auto s = string_value();
      if (!s) return fail(s.error().message());
      if (key == "prefix") {
        if (auto e = CheckPrefix(*s)) return fail(*e);
        if (auto [it, fresh] = prefixes.emplace(*s, where); !fresh) {
          return fail(Quote(*s) + " is the prefix of another route too (at " + it->second +
                      "); each prefix may appear once");
        }
        route.prefix = *s;
        has_prefix = true;
      } else if (key == "scope") {
        if (s->empty()) return fail("is empty (leave it out to use the prefix)");
        for (char c : *s) {
          if (c <= ' ' || c >= 0x7f) return fail(Quote(*s) + " is not printable ASCII");
        }
        route.scope = *s;
        has_scope = true;
      } else if (key == "key") {
        if (*s == "required") {
          route.key = KeyMode::kRequired;
        } else if (*s == "optional") {
          route.key = KeyMode::kOptional;
        } else if (*s == "off") {
          route.key = KeyMode::kOff;
        } else {
          return fail(Quote(*s) + " is not one of \"required\", \"optional\", \"off\"");
        }
      } else if (key == "anonymous") {
        if (*s == "shared") {
          route.anonymous = AnonymousPolicy::kShared;
        } else if (*s == "refuse") {
          route.anonymous = AnonymousPolicy::kRefuse;
        } else {
          return fail(Quote(*s) + " is not one of \"shared\", \"refuse\"");
        }
      } else if (*s == "reject") {
        route.in_flight = InFlightPolicy::kReject;
      } else if (*s == "wait") {
        route.in_flight = InFlightPolicy::kWait;
      } else {
        return fail(Quote(*s) + " is not one of \"reject\", \"wait\"");
      }
    } else if (key == "methods") {
      auto m = StringsFromNode(*v);
      if (!m) return fail(m.error().message());
      if (m->empty()) {
        return fail(
            "is empty: list at least one method (a route with key = \"off\" passes "
            "everything through)");
      }
      for (const std::string& method : *m) {
        if (auto e = CheckMethod(method)) return fail(*e);
      }
      route.methods = std::move(*m);
    } else if (key == "wait" || key == "lease" || key == "retention") {
      auto d = DurationFromNode(*v);
      if (!d) return fail(d.error().message());
      if (key == "wait") {
        route.wait = *d;
        wait_at = where;
      } else if (d->count() == 0) {
        return fail("must be above 0");
      } else if (key == "lease") {
        route.lease = *d;
        origin = {where, true};
      } else {
        route.retention = *d;
      }
    } else if (key == "stored_statuses") {
      const toml::array* a = v->as_array();
      if (a == nullptr) return fail(WrongType(*v, "an array").message());
      if (a->empty()) {
        return fail("is empty: no response would ever be stored, so every retry would run again");
      }
      std::vector<StatusRange> ranges;
      for (const toml::node& e : *a) {
        auto r = ParseStatusRange(e);
        if (!r) return ErrorAt(At(file, e.source()), option, r.error().message());
        ranges.push_back(*r);
      }
      route.stored_statuses = std::move(ranges);
    } else {
      std::string hint;
      if (FindOption(key) != nullptr)
        hint = " (" + key +
               " is a top-level option: put it above "
               "the first [[route]])";
      return fail("unknown option" + hint);
    }
  }
  if (!has_prefix) {
    return ErrorAt(At(file, t.source()), "route.prefix",
                   "missing: every [[route]] needs a prefix (\"/\" for all paths)");
  }
  if (route.in_flight == InFlightPolicy::kWait && route.wait.count() == 0) {
    return ErrorAt(wait_at, "route.wait",
                   "must be above 0 with in_flight = \"wait\" (or use in_flight = \"reject\")");
  }
  if (!has_scope) route.scope = route.prefix;
  draft.config.routes.push_back(std::move(route));
  draft.origins.routes.push_back(std::move(origin));
  return OkStatus();
}

Status ParseDraft(std::string_view text, std::string_view file, Draft& draft) {
  auto parsed = ParseToml(text, file);
  if (!parsed) return parsed.error();
  const toml::table& root = *parsed;
  std::map<std::string, std::string> prefixes;
  for (auto [k, v] : InFileOrder(root)) {
    const std::string key(k->str());
    const std::string where = At(file, k->source());
    if (key == "route") {
      const toml::array* a = v->as_array();
      if (a == nullptr || !a->is_array_of_tables()) {
        return ErrorAt(where, key,
                       "expected an array of tables ([[route]]), got " +
                           std::string(v->is_array() ? "an array of other values" : TypeName(*v)));
      }
      for (const toml::node& t : *a) {
        IDEM_RETURN_IF_ERROR(ParseRoute(file, *t.as_table(), draft, prefixes));
      }
      continue;
    }
    const Option* o = FindOption(key);
    if (o == nullptr) {
      std::string hint;
      if (IsRouteKey(key)) hint = " (route options go in a [[route]] table)";
      return ErrorAt(where, key, "unknown option" + hint);
    }
    auto raw = RawFromNode(o->kind, *v);
    if (!raw) return ErrorAt(where, key, raw.error().message());
    if (auto e = Store(*o, std::move(*raw), draft.config)) return ErrorAt(where, key, *e);
    draft.origins.option[key] = where;
  }
  return OkStatus();
}

// Rules between options, checked once the file and the flags are both applied.
Status Validate(const Draft& draft) {
  const Config& c = draft.config;
  const auto origin = [&](std::string_view option) -> std::string {
    auto it = draft.origins.option.find(option);
    return it == draft.origins.option.end() ? "the default" : "set at " + it->second;
  };
  constexpr std::string_view kWhy =
      ": a lease shorter than the upstream timeout lets a retry run the request a second time "
      "while the first is still upstream";
  const std::string timeout = FormatDuration(c.upstream_timeout);
  if (c.routes.empty()) {
    const Route fallback;
    if (fallback.lease <= c.upstream_timeout) {
      auto it = draft.origins.option.find("upstream_timeout");
      const std::string where = it == draft.origins.option.end() ? "config" : it->second;
      const std::string what = timeout + " is not below the default route's lease (" +
                               FormatDuration(fallback.lease) + ")" + std::string(kWhy) +
                               "; add a [[route]] with a longer lease";
      if (where.rfind("--", 0) == 0) return InvalidArgumentError(where + ": " + what);
      return ErrorAt(where, "upstream_timeout", what);
    }
  }
  if (c.principal_secret_secondary && *c.principal_secret_secondary == c.principal_secret) {
    auto it = draft.origins.option.find("principal_secret_secondary_file");
    const std::string where = it == draft.origins.option.end() ? "config" : it->second;
    const std::string what =
        c.principal_secret.empty()
            ? "\"plain\" names the plain hash, which principal_secret_file unset already uses: "
              "nothing else to look up"
            : "holds the secret principal_secret_file holds: nothing else to look up";
    if (where.rfind("--", 0) == 0) return InvalidArgumentError(where + ": " + what);
    return ErrorAt(where, "principal_secret_secondary_file", what);
  }
  for (std::size_t i = 0; i < c.routes.size(); ++i) {
    const Route& r = c.routes[i];
    if (r.lease > c.upstream_timeout) continue;
    const auto& o = draft.origins.routes[i];
    return ErrorAt(o.lease, "route.lease",
                   (o.lease_set ? "" : "the default ") + FormatDuration(r.lease) +
                       " must be longer than upstream_timeout (" + timeout + ", " +
                       origin("upstream_timeout") + ")" + std::string(kWhy));
  }
  return OkStatus();
}

Result<toml::table> ParseToml(std::string_view text, std::string_view file) {
  try {
    return toml::parse(text, std::string(file));
  } catch (const toml::parse_error& e) {
    return InvalidArgumentError(std::string(file) + ":" + std::to_string(e.source().begin.line) +
                                ":" + std::to_string(e.source().begin.column) +
                                ": TOML syntax error: " + std::string(e.description()));
  }
}

Result<std::string> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return InvalidArgumentError(path + ": cannot open: " + std::strerror(errno));
  }
  std::string text;
  char buf[8192];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return InvalidArgumentError(path + ": cannot read");
  return text;
}

std::string FlagName(std::string_view option) {
  std::string flag = "--" + std::string(option);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

const Route& DefaultRoute() {
  static const Route route = [] {
    Route r;
    r.scope = r.prefix;
    return r;
  }();
  return route;
}

}  // namespace config_detail

using namespace config_detail;  // NOLINT: this file is config_detail's home

Result<Endpoint> ParseEndpoint(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return InvalidArgumentError(Quote(text) + " is not HOST:PORT (" + std::string(why) + ")");
  };
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return bad("no closing ']'");
    host = text.substr(1, close - 1);
    if (host.empty()) return bad("empty host");
    // Hex digits, ':' and '.', then an optional zone ("%eth0").
    const std::string_view address = host.substr(0, host.find('%'));
    for (char c : address) {
      const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                      c == ':' || c == '.';
      if (!ok) return bad("not an IPv6 address inside [ ]");
    }
    if (address.find(':') == std::string_view::npos) return bad("not an IPv6 address inside [ ]");
    if (text.size() == close + 1 || text[close + 1] != ':') return bad("missing :PORT");
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("missing :PORT");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.empty()) return bad("missing host; 0.0.0.0 listens on every interface");
    if (host.find(':') != std::string_view::npos) return bad("IPv6 addresses go in [ ]: [::1]:80");
    for (char c : host) {
      const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      c == '.' || c == '-' || c == '_';
      if (!ok) return bad("bad character in host");
    }
  }
  const auto number = ParseUnsigned(port);
  if (!number) return bad("port is not a number");
  if (*number > 65535) {
    return InvalidArgumentError(Quote(text) + ": port " + std::string(port) +
                                " out of range (0-65535)");
  }
  return Endpoint{std::string(host), static_cast<std::uint16_t>(*number)};
}

Result<UpstreamUrl> ParseUpstreamUrl(std::string_view url) {
  constexpr std::string_view kHttp = "http://";
  if (url.substr(0, 8) == "https://") {
    return InvalidArgumentError(Quote(url) +
                                ": https is not supported; idemd speaks plain HTTP to the upstream "
                                "(put it beside the upstream, or terminate TLS in a local proxy)");
  }
  if (url.substr(0, kHttp.size()) != kHttp) {
    return InvalidArgumentError(Quote(url) + " is not http://HOST[:PORT][/BASE]");
  }
  std::string_view rest = url.substr(kHttp.size());
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view base = slash == std::string_view::npos ? "" : rest.substr(slash);
  if (base.find_first_of("?#") != std::string_view::npos) {
    return InvalidArgumentError(Quote(url) + ": the base path may not have a query or fragment");
  }
  // It is copied into every forwarded request line: a space or control byte would break it.
  if (std::any_of(base.begin(), base.end(), [](char c) { return c <= ' ' || c >= 0x7f; })) {
    return InvalidArgumentError(Quote(url) +
                                ": the base path may not have spaces, control or non-ASCII bytes "
                                "(percent-encode them)");
  }
  while (!base.empty() && base.back() == '/') base.remove_suffix(1);
  if (authority.find('@') != std::string_view::npos) {
    return InvalidArgumentError(Quote(url) + ": user:password@ is not supported");
  }
  std::string with_port(authority);
  const bool v6 = !authority.empty() && authority[0] == '[';
  const auto last_colon = authority.rfind(':');
  const bool has_port =
      last_colon != std::string_view::npos && (!v6 || last_colon > authority.find(']'));
  if (!has_port) with_port += ":80";
  auto endpoint = ParseEndpoint(with_port);
  if (!endpoint) {
    return InvalidArgumentError(Quote(url) + ": bad HOST[:PORT]: " + endpoint.error().message());
  }
  if (endpoint->port == 0) return InvalidArgumentError(Quote(url) + ": port 0");
  return UpstreamUrl{std::move(*endpoint), std::string(base)};
}

bool Route::Stores(unsigned status) const {
  return std::any_of(stored_statuses.begin(), stored_statuses.end(),
                     [&](const StatusRange& r) { return r.Contains(status); });
}

bool Route::Applies(std::string_view method) const {
  return std::find(methods.begin(), methods.end(), method) != methods.end();
}

const Route* Config::RouteFor(std::string_view path) const {
  if (routes.empty()) return &DefaultRoute();
  const Route* best = nullptr;
  for (const Route& r : routes) {
    const std::string_view p = r.prefix;
    if (path.substr(0, p.size()) != p) continue;
    // A prefix matches whole segments: "/v1/charges" matches "/v1/charges/7" and
    // "/v1/charges?x", not "/v1/chargesheet".
    const bool boundary = path.size() == p.size() || p.back() == '/' || path[p.size()] == '/' ||
                          path[p.size()] == '?';
    if (!boundary) continue;
    if (best == nullptr || p.size() > best->prefix.size()) best = &r;
  }
  return best;
}

Result<Config> ParseConfig(std::string_view toml, std::string_view file_name) {
  Draft draft;
  IDEM_RETURN_IF_ERROR(ParseDraft(toml, file_name.empty() ? "config" : file_name, draft));
  IDEM_RETURN_IF_ERROR(Validate(draft));
  return std::move(draft.config);
}

Result<Config> LoadConfigFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text) return text.error();
  return ParseConfig(*text, path);
}

Result<CommandLine> ParseCommandLine(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return CommandLine{};
  }
  struct Flag {
    const Option* option;
    std::string name;
    std::string value;
  };
  std::vector<Flag> flags;
  std::optional<std::string> config_path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.substr(0, 2) != "--" || arg.size() == 2) {
      return InvalidArgumentError(std::string(arg) +
                                  ": unexpected argument (options are --name VALUE; see --help)");
    }
    const auto eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    std::string option_name = name.substr(2);
    std::replace(option_name.begin(), option_name.end(), '-', '_');
    // One spelling per flag: --max-body-bytes, not --max_body_bytes.
    const bool underscore = name.find('_') != std::string::npos;
    const Option* option = underscore ? nullptr : FindOption(option_name);
    if (option == nullptr && name != "--config") {
      std::string hint;
      if (option_name == "route" || IsRouteKey(option_name)) {
        hint = " (route options are set in the config file only)";
      } else if (underscore && FindOption(option_name) != nullptr) {
        hint = " (flags spell '_' as '-': " + FlagName(option_name) + ")";
      }
      return InvalidArgumentError(name + ": unknown flag" + hint + "; see --help");
    }
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--") {
      value = argv[++i];
    } else {
      return InvalidArgumentError(name + ": missing value");
    }
    if (option == nullptr) {
      if (config_path) return InvalidArgumentError(name + ": given twice");
      if (value.empty()) return InvalidArgumentError(name + ": empty file name");
      config_path = std::move(value);
    } else {
      flags.push_back({option, name, std::move(value)});
    }
  }

  Draft draft;
  if (config_path) {
    auto text = ReadFile(*config_path);
    if (!text) return text.error();
    IDEM_RETURN_IF_ERROR(ParseDraft(*text, *config_path, draft));
  }
  for (Flag& f : flags) {
    auto raw = RawFromFlag(f.option->kind, f.value);
    if (!raw) return InvalidArgumentError(f.name + ": " + raw.error().message());
    if (auto e = Store(*f.option, std::move(*raw), draft.config)) {
      return InvalidArgumentError(f.name + ": " + *e);
    }
    draft.origins.option[std::string(f.option->name)] = f.name;
  }
  IDEM_RETURN_IF_ERROR(Validate(draft));
  return CommandLine{std::move(draft.config)};
}

std::string HelpText() {
  // "  left          right": help's two-column rows.
  const auto row = [](std::string_view left, std::string_view right) {
    std::string line = "  " + std::string(left);
    line.resize(std::max<std::size_t>(line.size() + 1, 27), ' ');
    return line + std::string(right) + "\n";
  };
  std::string out =
      "Usage: idemd [--config FILE] [--OPTION VALUE | --OPTION=VALUE ...]\n"
      "       idemd --help\n"
      "       idemd consume --config FILE [...]   a deduplicating consumer of Kafka, NATS\n"
      "                                           JetStream or Redis Streams: idemd consume "
      "--help\n"
      "\n"
      "idemd is an HTTP reverse proxy that gives an upstream API Idempotency-Key semantics: the\n"
      "first request with a key is forwarded and its response stored; a retry with the same key\n"
      "gets the stored response (Idempotent-Replayed: true) without calling the upstream.\n"
      "\n"
      "The config file is TOML: each option below is a top-level key (max_body_bytes = \"2MiB\")\n"
      "and routes are [[route]] tables. Every option is also a flag, '_' spelled '-'\n"
      "(--max-body-bytes 2MiB or --max-body-bytes=2MiB). Flags override the file, whatever\n"
      "their order; a repeated flag: the last wins. Without --config: the defaults and the flags.\n"
      "\n"
      "Options:\n"
      "  --config FILE\n"
      "      the TOML file to read (default: none)\n";
  for (const Option& o : Options()) {
    out += "  " + FlagName(o.name) + " " + std::string(o.value_name) +
           "  (file: " + std::string(o.name) + ", default: " + DefaultText(o) + ")\n      " +
           std::string(o.meaning) + "\n";
  }
  out +=
      "  -h, --help\n"
      "      print this help and exit\n"
      "\n"
      "Values:\n";
  out += row("DURATION", "250ms, 30s, 5m, 1h, 1d or a sum such as 1h30m; in the file an");
  out += row("", "integer is milliseconds (\"30s\" and 30000 are the same)");
  out += row("SIZE", "bytes: 4096, 16KiB, 1MiB, 1GiB (KB, MB, GB are powers of 1000)");
  out += row("NAME,...", "header names: comma-separated on the command line, an array in");
  out += row("", "the file (strip_headers = [\"Set-Cookie\"])");

  const Route r;
  std::string methods;
  for (const auto& m : r.methods) methods += (methods.empty() ? "" : ", ") + Quote(m);
  std::string statuses;
  for (const StatusRange& s : r.stored_statuses) {
    statuses += (statuses.empty() ? "\"" : ", \"") + std::to_string(s.first) + "-" +
                std::to_string(s.last) + "\"";
  }
  out +=
      "\n"
      "Routes ([[route]] tables; config file only, no flags):\n"
      "  A request goes to the route with the longest matching prefix, on whole path segments\n"
      "  (\"/v1/charges\" matches /v1/charges and /v1/charges/7, not /v1/chargesheet). A path\n"
      "  that matches no route is passed through untouched. Without any [[route]], one route\n"
      "  with prefix \"/\" and the defaults below applies to every path.\n";
  out += row("prefix = \"/v1/charges\"", "required; starts with '/'; each prefix once");
  out += row("methods = [\"POST\"]", "methods that get key semantics, uppercase, not empty;");
  out += row("", "other methods pass through (default: [" + methods + "])");
  out += row("key = \"required\"", "required: no key -> 400; optional: no key -> passed");
  out += row("", "through; off: the route passes everything through");
  out += row("in_flight = \"reject\"", "a retry while the first request is still upstream:");
  out += row("", "\"reject\" answers 409, \"wait\" waits for the first one's answer");
  out += row("wait = \"" + FormatDuration(r.wait) + "\"", "the bound on that wait");
  out += row("anonymous = \"shared\"", "a request with a key but no principal_header value:");
  out += row("", "\"shared\": one scope for all such clients; \"refuse\": 400");
  out += row("stored_statuses = [...]", "upstream statuses stored and replayed; any other");
  out += row("", "status releases the key so a retry runs again: \"404\",");
  out += row("", "\"200-299\", \"4xx\" or 404; default, all but \"retry later\":");
  out += row("", "[" + statuses + "]");
  out += row("lease = \"" + FormatDuration(r.lease) + "\"",
             "how long a key is held for the first request; must be");
  out += row("", "longer than upstream_timeout");
  out += row("retention = \"" + FormatDuration(r.retention) + "\"",
             "how long a stored response is replayed");
  out += row("scope = \"charges\"", "store namespace of the route's keys (default: the prefix)");
  out +=
      "\n"
      "Store URLs (--store, store =):\n";
  out += row("memory:", "in-process, lost on exit (for trying things out)");
  out += row("log:DIR[?sync=MODE]", "the embedded log store in DIR; MODE: always (default,");
  out += row("", "fdatasync before each answer), interval:<ms>, none");
  out += row("redis://HOST:PORT", "Redis (when this build has the Redis store)");
  out += row("redis+cluster://H:P,H:P", "Redis Cluster (likewise)");
  out += row("postgres://USER@HOST/DB", "PostgreSQL (when this build has the PostgreSQL store)");
  out +=
      "\n"
      "Exit codes:\n"
      "  0  stopped cleanly (SIGTERM or SIGINT)\n"
      "  1  runtime failure (cannot listen, the store cannot be opened, ...)\n"
      "  2  bad config file or flags; the message names FILE:LINE or the flag, and the option\n";
  return out;
}

}  // namespace idem::gateway
