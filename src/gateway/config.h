// idemd's configuration: a TOML file (toml++), then command-line flags that override it.
//
//   listen = "0.0.0.0:8080"
//   upstream = "http://127.0.0.1:9000"
//   store = "log:/var/lib/idemd"
//   upstream_timeout = "30s"
//   [[route]]
//   prefix = "/v1/charges"
//   methods = ["POST"]
//   key = "required"
//
// Durations are "250ms", "30s", "5m", "1h", "1d" or sums ("1h30m"); in the file an integer is
// milliseconds. Sizes are bytes: 4096, "16KiB", "1MiB". Every option is documented in
// HelpText() and docs/configuration.md.
#ifndef IDEM_GATEWAY_CONFIG_H_
#define IDEM_GATEWAY_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"

namespace idem::gateway {

// host:port. Host is an IPv4/IPv6 literal or a name; port 0 means "any free port".
struct Endpoint {
  std::string host{};
  std::uint16_t port = 0;
};
Result<Endpoint> ParseEndpoint(std::string_view text);  // "127.0.0.1:8080", "[::1]:80"

// Config::upstream taken apart: "http://HOST[:PORT][/BASE]" (port 80 when omitted). base is ""
// or a path without a trailing '/' ("/api"), prepended to forwarded targets. https:// and
// anything else is kInvalidArgument (idemd speaks plain HTTP to its upstream).
struct UpstreamUrl {
  Endpoint endpoint{};
  std::string base{};
};
Result<UpstreamUrl> ParseUpstreamUrl(std::string_view url);

enum class KeyMode : std::uint8_t { kRequired, kOptional, kOff };  // "required"|"optional"|"off"
enum class InFlightPolicy : std::uint8_t { kReject, kWait };       // "reject" (409) | "wait"
// A request with a key but an empty or missing principal_header: "shared" puts it in the
// route's one anonymous scope (every such client shares it), "refuse" answers 400.
enum class AnonymousPolicy : std::uint8_t { kShared, kRefuse };

// Inclusive status ranges: "200-299", "404", "4xx".
struct StatusRange {
  unsigned first = 0;
  unsigned last = 0;
  bool Contains(unsigned status) const { return status >= first && status <= last; }
};

// A [[route]] table. Loading fills scope with the prefix when the file leaves it out.
struct Route {
  std::string prefix = "/";  // longest matching prefix wins, on whole path segments
  // Methods that get Idempotency-Key semantics on this route; other methods pass through.
  std::vector<std::string> methods{"POST", "PATCH"};
  KeyMode key = KeyMode::kRequired;  // kOptional: no key -> passed through untouched
  InFlightPolicy in_flight = InFlightPolicy::kReject;
  AnonymousPolicy anonymous = AnonymousPolicy::kShared;
  std::chrono::milliseconds wait{10'000};  // bound for kWait
  // Upstream statuses whose response is stored and replayed; others release the key. 1xx
  // answers are interim: idemd drops them and waits for the final one. 408, 409 (the
  // upstream's own in-progress conflict), 425 and 429 mean "retry later": stored, they would be
  // replayed for the whole retention and a client obeying Retry-After could never succeed.
  std::vector<StatusRange> stored_statuses{{200, 407}, {410, 424}, {426, 428}, {430, 499}};
  std::chrono::milliseconds lease{60'000};  // must exceed upstream_timeout
  std::chrono::milliseconds retention{24 * 3600 * 1000};
  std::string scope{};  // store scope (before the principal is added); loading sets = prefix

  bool Stores(unsigned status) const;           // some range of stored_statuses contains it
  bool Applies(std::string_view method) const;  // in methods; case-sensitive, as HTTP methods are
};

struct Config {
  Endpoint listen{"127.0.0.1", 8080};
  Endpoint admin{"127.0.0.1", 9090};               // /metrics, /healthz, /readyz
  std::string upstream = "http://127.0.0.1:9000";  // http://host:port[/base], no TLS
  std::string store = "log:./idemd-data";  // memory:, log:/dir[?sync=...], redis://, postgres://
  std::size_t threads = 0;                 // I/O threads; 0 = one per core
  // Threads that call a store that can block (log, network); each takes one batch of the
  // store operations waiting at the moment. 0 = call the store inline on the I/O threads.
  std::size_t store_threads = 4;
  std::string principal_header = "Authorization";  // its value's hash scopes keys
  // A file holding the secret under which principals are hashed (an HMAC); "" = none, a plain
  // hash. Loading reads it into principal_secret (trailing whitespace cut off).
  std::string principal_secret_file{};
  std::string principal_secret{};
  // Rotation (docs/gateway.md): a second secret, or "plain" for the plain hash. A key acquired
  // under the principal's scope is also looked up under the scope this one gives, and
  // answered from a record found there. Loading reads it into principal_secret_secondary ("" =
  // plain; nullopt = no secondary).
  std::string principal_secret_secondary_file{};
  std::optional<std::string> principal_secret_secondary{};
  std::string key_header = "Idempotency-Key";
  std::size_t max_key_bytes = 255;
  std::size_t max_body_bytes = 1 << 20;         // request body limit -> 413
  std::size_t max_header_bytes = 16 << 10;      // request header block limit -> 431
  std::size_t max_stored_body_bytes = 1 << 20;  // larger upstream bodies are not stored
  std::vector<std::string> strip_headers{};     // response headers never stored (e.g. Set-Cookie)
  std::chrono::milliseconds upstream_timeout{30'000};
  std::chrono::milliseconds client_timeout{10'000};  // whole request must arrive within it
  std::chrono::milliseconds idle_timeout{60'000};    // keep-alive idle connections closed
  std::chrono::milliseconds shutdown_grace{10'000};  // SIGTERM: finish in-flight within it
  std::size_t upstream_connections = 256;            // pooled keep-alive connections, max
  std::chrono::seconds retry_after{1};               // Retry-After on 503
  std::string log_level = "info";                    // "debug"|"info"|"warn"|"error"
  // In file order. Loading leaves it empty when the file has no [[route]]; RouteFor then
  // answers a static default Route (prefix "/", scope "/", the defaults above).
  std::vector<Route> routes{};

  // The route for a request path or target (longest prefix matching whole segments: "/a/b"
  // matches "/a/b", "/a/b/c" and "/a/b?q", not "/a/bc"), or nullptr when routes is not empty
  // and none matches: the request is passed through untouched. The pointer is into *this (or
  // static) and lives as long as the Config is not changed.
  const Route* RouteFor(std::string_view path) const;
};

// Reads and checks a TOML file. Errors are kInvalidArgument with a message of the form
// "FILE:LINE: OPTION: what is wrong" (route options are named "route.lease" and so on; unknown
// options are errors too, naming them), "FILE:LINE:COLUMN: TOML syntax error: ..." for TOML
// that does not parse, and "FILE: cannot open: <errno text>" for a file that cannot be read.
Result<Config> LoadConfigFile(const std::string& path);
Result<Config> ParseConfig(std::string_view toml, std::string_view file_name);

// idemd's command line: [--config FILE] [--OPTION VALUE | --OPTION=VALUE ...] [--help].
// Flags override the file's values whatever their order; every top-level option has a flag of
// the same name with '_' spelled '-' (--max-body-bytes 4096); routes are file-only. A repeated
// flag: the last wins. Without --config: the defaults plus the flags. --help or -h anywhere
// wins over everything else. Errors are kInvalidArgument: "--flag: what is wrong" for a flag,
// the file's errors as LoadConfigFile's; idemd exits 2 on any of them.
struct CommandLine {
  std::optional<Config> config{};  // empty when --help was given
};
Result<CommandLine> ParseCommandLine(int argc, const char* const* argv);
std::string HelpText();  // idemd --help: every option, its default, routes, store URLs, exit codes

}  // namespace idem::gateway

#endif  // IDEM_GATEWAY_CONFIG_H_
