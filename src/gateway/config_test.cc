#include "gateway/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

namespace idem::gateway {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The message of a config that must not load.
std::string Error(std::string_view toml) {
  auto c = ParseConfig(toml, "idemd.toml");
  if (c) return "(loaded)";
  EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
  return c.error().message();
}

std::string FormatForTest(const Endpoint& e) { return e.host + ":" + std::to_string(e.port); }

// A file in the test's temp dir, removed when the test ends. The name holds the process id:
// ctest runs each test in a process of its own, in parallel, and two tests using one name
// (short-secret) would otherwise remove each other's file.
class TempFile {
 public:
  TempFile(std::string_view name, std::string_view text)
      : path_(::testing::TempDir() + "idem_config_test_" + std::to_string(::getpid()) + "_" +
              std::string(name)) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Result<CommandLine> Parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"idemd"};
  argv.insert(argv.end(), args);
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

std::string FlagError(std::initializer_list<const char*> args) {
  auto c = Parse(args);
  if (c) return "(parsed)";
  EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
  return c.error().message();
}

constexpr std::string_view kFull = R"(# every option
listen = "0.0.0.0:8081"
admin = "[::1]:9091"
upstream = "http://upstream.internal:9000/api/"
store = "log:/var/lib/idemd?sync=interval:50"
threads = 4
store_threads = 0
principal_header = "X-Api-Key"
key_header = "Idem-Key"
max_key_bytes = 100
max_body_bytes = "2MiB"
max_header_bytes = 8192
max_stored_body_bytes = "16KiB"
strip_headers = ["Set-Cookie", "X-Trace"]
upstream_timeout = "5s"
client_timeout = 2500
idle_timeout = "1m30s"
shutdown_grace = "0s"
upstream_connections = 32
retry_after = "2s"
log_level = "debug"

[[route]]
prefix = "/v1/charges"
methods = ["POST", "PURGE"]
key = "optional"
in_flight = "wait"
wait = "250ms"
stored_statuses = ["2xx", "404", "409-410", 422]
lease = "1m"
retention = "7d"
scope = "charges"
anonymous = "refuse"

[[route]]
prefix = "/v1"
key = "off"
)";

TEST(GatewayConfigFile, EveryOptionRoundTrips) {
  auto c = ParseConfig(kFull, "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->listen.host, "0.0.0.0");
  EXPECT_EQ(c->listen.port, 8081);
  EXPECT_EQ(c->admin.host, "::1");
  EXPECT_EQ(c->admin.port, 9091);
  EXPECT_EQ(c->upstream, "http://upstream.internal:9000/api/");
  EXPECT_EQ(c->store, "log:/var/lib/idemd?sync=interval:50");
  EXPECT_EQ(c->threads, 4u);
  EXPECT_EQ(c->store_threads, 0u);
  EXPECT_EQ(c->principal_header, "X-Api-Key");
  EXPECT_EQ(c->key_header, "Idem-Key");
  EXPECT_EQ(c->max_key_bytes, 100u);
  EXPECT_EQ(c->max_body_bytes, 2u << 20);
  EXPECT_EQ(c->max_header_bytes, 8192u);
  EXPECT_EQ(c->max_stored_body_bytes, 16u << 10);
  EXPECT_EQ(c->strip_headers, (std::vector<std::string>{"Set-Cookie", "X-Trace"}));
  EXPECT_EQ(c->upstream_timeout, milliseconds(5000));
  EXPECT_EQ(c->client_timeout, milliseconds(2500));
  EXPECT_EQ(c->idle_timeout, milliseconds(90'000));
  EXPECT_EQ(c->shutdown_grace, milliseconds(0));
  EXPECT_EQ(c->upstream_connections, 32u);
  EXPECT_EQ(c->retry_after, std::chrono::seconds(2));
  EXPECT_EQ(c->log_level, "debug");

  ASSERT_EQ(c->routes.size(), 2u);
  const Route& charges = c->routes[0];
  EXPECT_EQ(charges.prefix, "/v1/charges");
  EXPECT_EQ(charges.methods, (std::vector<std::string>{"POST", "PURGE"}));
  EXPECT_EQ(charges.key, KeyMode::kOptional);
  EXPECT_EQ(charges.in_flight, InFlightPolicy::kWait);
  EXPECT_EQ(charges.wait, milliseconds(250));
  EXPECT_EQ(charges.lease, milliseconds(60'000));
  EXPECT_EQ(charges.retention, milliseconds(7 * 24 * 3600 * 1000));
  EXPECT_EQ(charges.scope, "charges");
  EXPECT_EQ(charges.anonymous, AnonymousPolicy::kRefuse);
  EXPECT_EQ(c->routes[1].anonymous, AnonymousPolicy::kShared);  // the default
  EXPECT_TRUE(charges.Stores(200));
  EXPECT_TRUE(charges.Stores(299));
  EXPECT_TRUE(charges.Stores(404));
  EXPECT_TRUE(charges.Stores(409));
  EXPECT_TRUE(charges.Stores(410));
  EXPECT_TRUE(charges.Stores(422));
  EXPECT_FALSE(charges.Stores(400));
  EXPECT_FALSE(charges.Stores(500));
  EXPECT_TRUE(charges.Applies("PURGE"));
  EXPECT_FALSE(charges.Applies("post"));
  EXPECT_FALSE(charges.Applies("PATCH"));

  const Route& v1 = c->routes[1];  // everything not set is the default
  const Route defaults;
  EXPECT_EQ(v1.key, KeyMode::kOff);
  EXPECT_EQ(v1.methods, defaults.methods);
  EXPECT_EQ(v1.lease, defaults.lease);
  EXPECT_EQ(v1.retention, defaults.retention);
  EXPECT_EQ(v1.scope, "/v1");  // scope defaults to the prefix
  EXPECT_TRUE(v1.Stores(499));
  EXPECT_FALSE(v1.Stores(500));
}

TEST(GatewayConfigFile, EmptyFileIsTheDefaults) {
  auto c = ParseConfig("", "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  const Config defaults;
  EXPECT_EQ(c->listen.port, defaults.listen.port);
  EXPECT_EQ(c->store, defaults.store);
  EXPECT_EQ(c->upstream_timeout, defaults.upstream_timeout);
  EXPECT_TRUE(c->routes.empty());
  const Route* r = c->RouteFor("/anything");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->prefix, "/");
  EXPECT_EQ(r->scope, "/");
  EXPECT_TRUE(r->Applies("POST"));
  EXPECT_FALSE(r->Applies("GET"));
}

TEST(GatewayConfigFile, LoadsFromDiskAndNamesTheFile) {
  TempFile good("good.toml", "listen = \"127.0.0.1:0\"\n");
  auto c = LoadConfigFile(good.path());
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->listen.port, 0);

  TempFile bad("bad.toml", "\n\nthreads = \"four\"\n");
  auto e = LoadConfigFile(bad.path());
  ASSERT_FALSE(e);
  EXPECT_THAT(e.error().message(), StartsWith(bad.path() + ":3: threads: "));

  auto missing = LoadConfigFile(::testing::TempDir() + "idem_config_test_no_such.toml");
  ASSERT_FALSE(missing);
  EXPECT_THAT(missing.error().message(), HasSubstr("no_such.toml: cannot open: "));
}

TEST(GatewayConfigFile, SyntaxErrorHasLineAndColumn) {
  EXPECT_THAT(Error("listen = \"127.0.0.1:1\"\nthreads = \n"),
              StartsWith("idemd.toml:2:11: TOML syntax error: "));
  EXPECT_THAT(Error("a = 1\na = 2\n"), StartsWith("idemd.toml:2:"));
}

TEST(GatewayConfigFile, UnknownOptionsAreNamed) {
  EXPECT_EQ(Error("listen = \"127.0.0.1:1\"\nlisten_port = 80\n"),
            "idemd.toml:2: listen_port: unknown option");
  EXPECT_THAT(Error("\nprefix = \"/x\"\n"),
              StartsWith("idemd.toml:2: prefix: unknown option (route options go in a [[route]]"));
  EXPECT_THAT(Error("[server]\nlisten = \"x\"\n"), StartsWith("idemd.toml:1: server: unknown"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\ncolour = \"red\"\n"),
              StartsWith("idemd.toml:3: route.colour: unknown option"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nthreads = 2\n"),
              HasSubstr("threads is a top-level option"));
}

TEST(GatewayConfigFile, FirstErrorInFileOrderIsReported) {
  // toml++ iterates keys sorted; the report follows the file.
  EXPECT_THAT(Error("zzz = 1\naaa = 2\n"), StartsWith("idemd.toml:1: zzz: "));
}

TEST(GatewayConfigFile, WrongTypes) {
  EXPECT_EQ(Error("threads = \"4\"\n"), "idemd.toml:1: threads: expected an integer, got a string");
  EXPECT_EQ(Error("\nlisten = 8080\n"), "idemd.toml:2: listen: expected a string, got an integer");
  EXPECT_THAT(Error("strip_headers = \"Set-Cookie\"\n"),
              StartsWith("idemd.toml:1: strip_headers: expected an array of strings"));
  EXPECT_THAT(Error("strip_headers = [\"A\", 1]\n"), StartsWith("idemd.toml:1: strip_headers: "));
  EXPECT_THAT(Error("max_body_bytes = 1.5\n"),
              StartsWith("idemd.toml:1: max_body_bytes: expected a size"));
  EXPECT_THAT(Error("upstream_timeout = true\n"),
              StartsWith("idemd.toml:1: upstream_timeout: expected a duration"));
  EXPECT_EQ(Error("threads = -1\n"), "idemd.toml:1: threads: -1 is negative");
  EXPECT_THAT(Error("[route]\nprefix = \"/\"\n"),
              StartsWith("idemd.toml:1: route: expected an array of tables ([[route]])"));
  EXPECT_THAT(Error("[[route]]\nprefix = 1\n"),
              StartsWith("idemd.toml:2: route.prefix: expected a string"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nmethods = \"POST\"\n"),
              StartsWith("idemd.toml:3: route.methods: expected an array of strings"));
}

TEST(GatewayConfigFile, BadDurationsAndSizes) {
  EXPECT_THAT(Error("\n\nupstream_timeout = \"30 seconds\"\n"),
              StartsWith("idemd.toml:3: upstream_timeout: \"30 seconds\" is not a duration ("));
  EXPECT_THAT(Error("client_timeout = \"5x\"\n"), HasSubstr("is not a duration"));
  EXPECT_THAT(Error("client_timeout = \"\"\n"), HasSubstr("is not a duration"));
  EXPECT_THAT(Error("client_timeout = \"ms\"\n"), HasSubstr("is not a duration"));
  EXPECT_THAT(Error("client_timeout = \"0s\"\n"),
              StartsWith("idemd.toml:1: client_timeout: must be above 0s"));
  EXPECT_THAT(Error("retry_after = \"1500ms\"\n"),
              StartsWith("idemd.toml:1: retry_after: 1500ms is not a whole number of seconds"));
  EXPECT_THAT(Error("max_body_bytes = \"1 MiB\"\n"),
              StartsWith("idemd.toml:1: max_body_bytes: \"1 MiB\" is not a size ("));
  EXPECT_THAT(Error("max_body_bytes = \"1mb\"\n"), HasSubstr("is not a size"));
  EXPECT_THAT(Error("max_body_bytes = \"99999999999999999999\"\n"), HasSubstr("is not a size"));
  EXPECT_THAT(Error("max_header_bytes = 0\n"),
              StartsWith("idemd.toml:1: max_header_bytes: 0 is below the minimum"));
  // Above it, a store could refuse the stored response after the upstream acted.
  EXPECT_EQ(Error("max_stored_body_bytes = \"33MiB\"\n"),
            "idemd.toml:1: max_stored_body_bytes: 33MiB is above the maximum, 32MiB");
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nwait = \"soon\"\n"),
              StartsWith("idemd.toml:3: route.wait: \"soon\" is not a duration"));
}

// The secret is read at load, and every way the file can be wrong is an error naming it.
// Rotation: a secondary secret file, or "plain" for the plain hash; never the primary's own.
TEST(GatewayConfigFile, PrincipalSecretSecondaryFileIsReadAndChecked) {
  EXPECT_FALSE(Config().principal_secret_secondary.has_value());
  TempFile primary("primary-secret", "the new secret, long enough\n");
  TempFile previous("previous-secret", "the old secret, long enough\n");
  const std::string primary_option = "principal_secret_file = \"" + primary.path() + "\"\n";
  auto c = ParseConfig(
      primary_option + "principal_secret_secondary_file = \"" + previous.path() + "\"\n",
      "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->principal_secret_secondary, "the old secret, long enough");
  // From the plain hash to a first secret, and the way in: "plain" either side.
  c = ParseConfig(primary_option + "principal_secret_secondary_file = \"plain\"\n", "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->principal_secret_secondary, "");
  c = ParseConfig("principal_secret_secondary_file = \"" + primary.path() + "\"\n", "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->principal_secret.empty());
  EXPECT_EQ(c->principal_secret_secondary, "the new secret, long enough");
  // "" is none.
  c = ParseConfig(primary_option + "principal_secret_secondary_file = \"\"\n", "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_FALSE(c->principal_secret_secondary.has_value());

  EXPECT_EQ(
      Error(primary_option + "principal_secret_secondary_file = \"" + primary.path() + "\"\n"),
      "idemd.toml:2: principal_secret_secondary_file: holds the secret "
      "principal_secret_file holds: nothing else to look up");
  EXPECT_EQ(Error("principal_secret_secondary_file = \"plain\"\n"),
            "idemd.toml:1: principal_secret_secondary_file: \"plain\" names the plain hash, which "
            "principal_secret_file unset already uses: nothing else to look up");
  TempFile too_short("short-secret", "fifteen bytes!!\n");
  EXPECT_THAT(Error("principal_secret_secondary_file = \"" + too_short.path() + "\"\n"),
              HasSubstr(too_short.path() + " holds 15 bytes; a principal secret needs at least"));
  auto flag = Parse({"--principal-secret-secondary-file", "plain"});
  ASSERT_FALSE(flag);
  EXPECT_THAT(flag.error().message(),
              StartsWith("--principal-secret-secondary-file: \"plain\" names the plain hash"));
  auto ok = Parse({"--principal-secret-file", primary.path().c_str(),
                   "--principal-secret-secondary-file", "plain"});
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_EQ(ok->config->principal_secret_secondary, "");
}

TEST(GatewayConfigFile, PrincipalSecretFileIsReadAndChecked) {
  EXPECT_TRUE(Config().principal_secret.empty());
  TempFile secret("secret", "0123456789abcdef-secret \r\n");
  const std::string option = "principal_secret_file = \"" + secret.path() + "\"\n";
  auto c = ParseConfig(option, "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->principal_secret_file, secret.path());
  EXPECT_EQ(c->principal_secret, "0123456789abcdef-secret");  // trailing whitespace cut off

  EXPECT_THAT(Error("principal_secret_file = \"/nonexistent/idem-secret\"\n"),
              StartsWith("idemd.toml:1: principal_secret_file: /nonexistent/idem-secret: cannot "
                         "open: No such file or directory"));
  TempFile too_short("short-secret", "fifteen bytes!!\n");
  EXPECT_THAT(
      Error("principal_secret_file = \"" + too_short.path() + "\"\n"),
      HasSubstr(too_short.path() + " holds 15 bytes; a principal secret needs at least 16"));
  TempFile blank("blank-secret", " \n\n");
  EXPECT_THAT(Error("principal_secret_file = \"" + blank.path() + "\"\n"),
              HasSubstr("holds 0 bytes"));
  TempFile huge("huge-secret", std::string(4097, 'x'));
  EXPECT_THAT(Error("principal_secret_file = \"" + huge.path() + "\"\n"),
              HasSubstr("holds 4097 bytes; a principal secret file holds at most 4096"));
  EXPECT_THAT(Error("principal_secret_file = 7\n"), HasSubstr("principal_secret_file"));
  // "" is none.
  c = ParseConfig("principal_secret_file = \"\"\n", "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_TRUE(c->principal_secret.empty());

  // As a flag, overriding the file's.
  TempFile config("secret.toml", option);
  TempFile other("other-secret", "another secret, 32 bytes long!!!");
  auto cl =
      Parse({"--config", config.path().c_str(), "--principal-secret-file", other.path().c_str()});
  ASSERT_TRUE(cl) << cl.error().ToString();
  EXPECT_EQ(cl->config->principal_secret, "another secret, 32 bytes long!!!");
  auto bad = Parse({"--principal-secret-file", "/nonexistent/idem-secret"});
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message(),
              StartsWith("--principal-secret-file: /nonexistent/idem-secret: cannot open"));
}

TEST(GatewayConfigFile, DurationAndSizeForms) {
  auto c = ParseConfig(
      "client_timeout = \"1h30m\"\nidle_timeout = \"1d\"\nshutdown_grace = 1500\n"
      "max_body_bytes = \"1GiB\"\nmax_header_bytes = \"2KB\"\nmax_stored_body_bytes = \"512B\"\n",
      "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(c->client_timeout, milliseconds(90 * 60 * 1000));
  EXPECT_EQ(c->idle_timeout, milliseconds(24 * 3600 * 1000));
  EXPECT_EQ(c->shutdown_grace, milliseconds(1500));
  EXPECT_EQ(c->max_body_bytes, std::size_t{1} << 30);
  EXPECT_EQ(c->max_header_bytes, 2000u);
  EXPECT_EQ(c->max_stored_body_bytes, 512u);
}

TEST(GatewayConfigFile, Endpoints) {
  EXPECT_EQ(Error("listen = \"127.0.0.1:65536\"\n"),
            "idemd.toml:1: listen: \"127.0.0.1:65536\": port 65536 out of range (0-65535)");
  EXPECT_THAT(Error("\nadmin = \"localhost\"\n"),
              StartsWith("idemd.toml:2: admin: \"localhost\" is not HOST:PORT (missing :PORT)"));
  EXPECT_THAT(Error("listen = \":80\"\n"), HasSubstr("missing host"));
  EXPECT_THAT(Error("listen = \"::1:80\"\n"), HasSubstr("IPv6 addresses go in [ ]"));
  EXPECT_THAT(Error("listen = \"host:http\"\n"), HasSubstr("port is not a number"));
  EXPECT_THAT(Error("listen = \"[::1:80\"\n"), HasSubstr("no closing ']'"));
  EXPECT_THAT(Error("listen = \"[host]:80\"\n"), HasSubstr("not an IPv6 address"));

  auto e = ParseEndpoint("[fe80::1%eth0]:0");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->host, "fe80::1%eth0");
  EXPECT_EQ(e->port, 0);
}

TEST(GatewayConfigFile, UpstreamMustBePlainHttp) {
  EXPECT_THAT(Error("upstream = \"https://api.example.com\"\n"),
              StartsWith("idemd.toml:1: upstream: \"https://api.example.com\": https is not "
                         "supported"));
  EXPECT_THAT(Error("upstream = \"127.0.0.1:9000\"\n"),
              StartsWith("idemd.toml:1: upstream: \"127.0.0.1:9000\" is not http://"));
  EXPECT_THAT(Error("upstream = \"http://h:99999\"\n"), HasSubstr("out of range"));
  // The base path goes into every forwarded request line.
  EXPECT_THAT(Error("upstream = \"http://h:9000/base path\"\n"),
              HasSubstr("the base path may not have spaces"));
  EXPECT_THAT(FlagError({"--upstream", "http://h:9000/b\x01"}),
              HasSubstr("the base path may not have spaces"));

  auto u = ParseUpstreamUrl("http://api.internal/v1/");
  ASSERT_TRUE(u) << u.error().ToString();
  EXPECT_EQ(u->endpoint.host, "api.internal");
  EXPECT_EQ(u->endpoint.port, 80);
  EXPECT_EQ(u->base, "/v1");
  auto v6 = ParseUpstreamUrl("http://[::1]:9000");
  ASSERT_TRUE(v6) << v6.error().ToString();
  EXPECT_EQ(v6->endpoint.host, "::1");
  EXPECT_EQ(v6->endpoint.port, 9000);
  EXPECT_EQ(v6->base, "");
  auto no_port = ParseUpstreamUrl("http://[::1]");
  ASSERT_TRUE(no_port) << no_port.error().ToString();
  EXPECT_EQ(no_port->endpoint.port, 80);
}

TEST(GatewayConfigFile, StoreUrls) {
  for (const char* good : {"memory:", "log:./data", "log:/d?sync=none", "redis://r:6379",
                           "redis+cluster://a:1,b:2", "postgres://u@db:5432/idem"}) {
    auto c = ParseConfig("store = \"" + std::string(good) + "\"\n", "idemd.toml");
    EXPECT_TRUE(c) << good << ": " << c.error().ToString();
  }
  EXPECT_THAT(Error("store = \"/var/lib/idemd\"\n"),
              StartsWith("idemd.toml:1: store: \"/var/lib/idemd\" has no scheme (for a log store "
                         "directory write log:/var/lib/idemd)"));
  EXPECT_THAT(Error("store = \"log:/d?sync=sometimes\"\n"), StartsWith("idemd.toml:1: store: "));
  EXPECT_THAT(Error("store = \"memory:x\"\n"), HasSubstr("memory: takes no path"));
  EXPECT_THAT(Error("store = \"redis://a:1,b:2\"\n"), HasSubstr("redis+cluster://"));
  EXPECT_THAT(Error("store = \"mongo://x\"\n"), HasSubstr("unknown scheme \"mongo:\""));
}

// The Redis store's own URL forms (docs/redis.md): a password, a user, no port, a database.
TEST(GatewayConfigFile, StoreUrlsTheRedisStoreAccepts) {
  for (const char* good : {"redis://:secret@r:6379", "redis://user:pw@r:6379", "redis://r",
                           "redis://r/2?prefix=x", "redis+cluster://:pw@a,b:7001"}) {
    auto c = ParseConfig("store = \"" + std::string(good) + "\"\n", "idemd.toml");
    EXPECT_TRUE(c) << good << ": " << c.error().ToString();
  }
  auto flag = Parse({"--store", "redis://r"});
  ASSERT_TRUE(flag) << flag.error().ToString();
  ASSERT_TRUE(flag->config);
  EXPECT_EQ(flag->config->store, "redis://r");
  // Options the store refuses are refused here, with the file's line, not later in main.
  EXPECT_THAT(Error("store = \"redis://h:1?bogus=1\"\n"), StartsWith("idemd.toml:1: store: "));
  EXPECT_THAT(Error("store = \"redis://:s3cret@h:1?bogus=1\"\n"), Not(HasSubstr("s3cret")));
  EXPECT_THAT(Error("store = \"postgres://u@db:5432/idem?bogus=1\"\n"),
              StartsWith("idemd.toml:1: store: "));
}

TEST(GatewayConfigFile, HeadersAndLogLevel) {
  EXPECT_THAT(Error("key_header = \"Idempotency Key\"\n"),
              StartsWith("idemd.toml:1: key_header: \"Idempotency Key\" is not a header name"));
  EXPECT_THAT(Error("strip_headers = [\"Set-Cookie\", \"\"]\n"),
              StartsWith("idemd.toml:1: strip_headers: \"\" is not a header name"));
  EXPECT_THAT(Error("log_level = \"verbose\"\n"),
              StartsWith("idemd.toml:1: log_level: \"verbose\" is not a log level"));
}

TEST(GatewayConfigFile, Threads) {
  EXPECT_TRUE(ParseConfig("threads = 1024\n", "idemd.toml"));
  EXPECT_EQ(Error("threads = 1025\n"), "idemd.toml:1: threads: 1025 is above the maximum, 1024");
}

TEST(GatewayConfigFile, RouteMethods) {
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nmethods = []\n"),
              StartsWith("idemd.toml:3: route.methods: is empty"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nmethods = [\"POST\", \"post\"]\n"),
              StartsWith("idemd.toml:3: route.methods: \"post\" is not an uppercase method name "
                         "(methods are case-sensitive: write \"POST\")"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nmethods = [\"PO ST\"]\n"),
              HasSubstr("is not a method name"));
  EXPECT_TRUE(ParseConfig("[[route]]\nprefix = \"/\"\nmethods = [\"MKCOL\", \"X-CUSTOM\"]\n",
                          "idemd.toml"));  // unknown methods are fine
}

TEST(GatewayConfigFile, RoutePrefixes) {
  EXPECT_EQ(Error("[[route]]\nprefix = \"/a\"\n\n[[route]]\nprefix = \"/b\"\n[[route]]\n"
                  "prefix = \"/a\"\n"),
            "idemd.toml:7: route.prefix: \"/a\" is the prefix of another route too (at "
            "idemd.toml:2); each prefix may appear once");
  EXPECT_EQ(Error("[[route]]\nprefix = \"charges\"\n"),
            "idemd.toml:2: route.prefix: \"charges\" does not start with '/'");
  EXPECT_THAT(Error("[[route]]\nprefix = \"/a?b\"\n"), HasSubstr("is not a path prefix"));
  EXPECT_EQ(Error("\n[[route]]\nmethods = [\"POST\"]\n"),
            "idemd.toml:2: route.prefix: missing: every [[route]] needs a prefix (\"/\" for all "
            "paths)");
}

TEST(GatewayConfigFile, RouteEnumsAndStatuses) {
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nkey = \"yes\"\n"),
              StartsWith("idemd.toml:3: route.key: \"yes\" is not one of"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nanonymous = \"deny\"\n"),
              StartsWith("idemd.toml:3: route.anonymous: \"deny\" is not one of \"shared\", "
                         "\"refuse\""));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nin_flight = \"queue\"\n"),
              StartsWith("idemd.toml:3: route.in_flight: \"queue\" is not one of"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nin_flight = \"wait\"\nwait = 0\n"),
              StartsWith("idemd.toml:4: route.wait: must be above 0 with in_flight = \"wait\""));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nstored_statuses = [\"2xx\",\n  \"6xx\"]\n"),
              StartsWith("idemd.toml:4: route.stored_statuses: \"6xx\" is not a status"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nstored_statuses = [\"299-200\"]\n"),
              HasSubstr("is not a status range within 100-599"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nstored_statuses = [700]\n"),
              HasSubstr("700 is not an HTTP status"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nstored_statuses = [\"4294967696\"]\n"),
              HasSubstr("is not a status"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nstored_statuses = []\n"),
              StartsWith("idemd.toml:3: route.stored_statuses: is empty"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nscope = \"\"\n"),
              StartsWith("idemd.toml:3: route.scope: is empty"));
}

// "Retry later" answers are not stored by default, so a retry obeying Retry-After runs again.
TEST(GatewayConfigFile, DefaultStoredStatusesLeaveOutRetryLater) {
  auto c = ParseConfig("[[route]]\nprefix = \"/\"\n", "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  for (const Route& r : {c->routes.at(0), Route{}}) {
    for (unsigned status :
         {200u, 201u, 299u, 400u, 404u, 407u, 410u, 422u, 424u, 426u, 428u, 430u, 499u}) {
      EXPECT_TRUE(r.Stores(status)) << status;
    }
    for (unsigned status : {100u, 199u, 408u, 409u, 425u, 429u, 500u, 503u}) {
      EXPECT_FALSE(r.Stores(status)) << status;
    }
  }
}

TEST(GatewayConfigFile, ZeroLeaseOrRetention) {
  EXPECT_EQ(Error("[[route]]\nprefix = \"/\"\nlease = \"0s\"\n"),
            "idemd.toml:3: route.lease: must be above 0");
  EXPECT_EQ(Error("[[route]]\nprefix = \"/\"\n\nretention = 0\n"),
            "idemd.toml:4: route.retention: must be above 0");
}

// The stores refuse longer keys and durations (idem/key.h, core::kMaxDuration): a config
// allowing them would make every such request fail at the store.
TEST(GatewayConfigFile, LimitsTheStoresEnforce) {
  EXPECT_TRUE(ParseConfig("max_key_bytes = 255\n", "idemd.toml"));
  EXPECT_EQ(Error("max_key_bytes = 256\n"),
            "idemd.toml:1: max_key_bytes: 256 is above the maximum, 255");
  EXPECT_THAT(FlagError({"--max-key-bytes", "4096"}), HasSubstr("is above the maximum, 255"));
  EXPECT_TRUE(ParseConfig("[[route]]\nprefix = \"/\"\nretention = \"3660d\"\n", "idemd.toml"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nretention = \"3661d\"\n"),
              StartsWith("idemd.toml:3: route.retention: \"3661d\" is above the longest duration "
                         "idem accepts, 10 years"));
  EXPECT_THAT(Error("[[route]]\nprefix = \"/\"\nlease = \"4000d\"\n"),
              StartsWith("idemd.toml:3: route.lease: \"4000d\" is above the longest"));
}

// A deadline of now + d overflows the clocks' nanoseconds past 292 years, which would end a
// timeout at once: every duration option stops at 10 years.
TEST(GatewayConfigFile, EveryDurationIsAtMostTenYears) {
  EXPECT_TRUE(ParseConfig("idle_timeout = \"3660d\"\n", "idemd.toml"));
  EXPECT_EQ(Error("idle_timeout = \"150000d\"\n"),
            "idemd.toml:1: idle_timeout: \"150000d\" is above the longest duration idem "
            "accepts, 10 years");
  EXPECT_THAT(Error("client_timeout = 316224000001\n"), HasSubstr("is above the longest"));
  EXPECT_THAT(FlagError({"--shutdown-grace", "1000000d"}), HasSubstr("is above the longest"));
  EXPECT_THAT(FlagError({"--client-timeout", "3661d"}), HasSubstr("is above the longest"));
}

TEST(GatewayConfigFile, LeaseMustExceedUpstreamTimeout) {
  EXPECT_EQ(Error("upstream_timeout = \"30s\"\n[[route]]\nprefix = \"/\"\nlease = \"30s\"\n"),
            "idemd.toml:4: route.lease: 30s must be longer than upstream_timeout (30s, set at "
            "idemd.toml:1): a lease shorter than the upstream timeout lets a retry run the "
            "request a second time while the first is still upstream");
  // A route without a lease of its own: the [[route]] line is named.
  EXPECT_THAT(Error("upstream_timeout = \"2m\"\n\n[[route]]\nprefix = \"/\"\n"),
              StartsWith("idemd.toml:3: route.lease: the default 1m must be longer than "
                         "upstream_timeout (2m, set at idemd.toml:1)"));
  // No routes: the default route's lease against the file's upstream_timeout.
  EXPECT_THAT(Error("\nupstream_timeout = \"1m\"\n"),
              StartsWith("idemd.toml:2: upstream_timeout: 1m is not below the default route's "
                         "lease (1m): a lease shorter"));
  EXPECT_TRUE(ParseConfig("upstream_timeout = \"2m\"\n[[route]]\nprefix = \"/\"\nlease = \"3m\"\n",
                          "idemd.toml"));
}

TEST(GatewayConfigRouteFor, LongestPrefixOnSegments) {
  auto c = ParseConfig(
      "[[route]]\nprefix = \"/v1\"\n[[route]]\nprefix = \"/v1/charges\"\n"
      "[[route]]\nprefix = \"/static/\"\nkey = \"off\"\n",
      "idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  const auto prefix_for = [&](std::string_view path) -> std::string {
    const Route* r = c->RouteFor(path);
    return r == nullptr ? "(none)" : r->prefix;
  };
  EXPECT_EQ(prefix_for("/v1/charges"), "/v1/charges");
  EXPECT_EQ(prefix_for("/v1/charges/7/refund"), "/v1/charges");
  EXPECT_EQ(prefix_for("/v1/charges?limit=3"), "/v1/charges");
  EXPECT_EQ(prefix_for("/v1/chargesheet"), "/v1");
  EXPECT_EQ(prefix_for("/v1"), "/v1");
  EXPECT_EQ(prefix_for("/v1/refunds"), "/v1");
  EXPECT_EQ(prefix_for("/v10"), "(none)");
  EXPECT_EQ(prefix_for("/static/app.js"), "/static/");
  EXPECT_EQ(prefix_for("/static"), "(none)");
  EXPECT_EQ(prefix_for("/"), "(none)");

  Config catch_all;
  catch_all.routes = {Route{}, Route{}};
  catch_all.routes[1].prefix = "/a";
  EXPECT_EQ(catch_all.RouteFor("/a/b"), &catch_all.routes[1]);
  EXPECT_EQ(catch_all.RouteFor("/b"), &catch_all.routes[0]);
}

TEST(GatewayConfigFlags, DefaultsPlusFlags) {
  auto c = Parse({"--listen", "0.0.0.0:80", "--max-body-bytes=4096", "--strip-headers",
                  "Set-Cookie,X-A", "--upstream-timeout", "1500"});
  ASSERT_TRUE(c) << c.error().ToString();
  ASSERT_TRUE(c->config);
  EXPECT_EQ(c->config->listen.host, "0.0.0.0");
  EXPECT_EQ(c->config->listen.port, 80);
  EXPECT_EQ(c->config->max_body_bytes, 4096u);
  EXPECT_EQ(c->config->strip_headers, (std::vector<std::string>{"Set-Cookie", "X-A"}));
  EXPECT_EQ(c->config->upstream_timeout, milliseconds(1500));
  EXPECT_EQ(c->config->store, Config{}.store);
  EXPECT_TRUE(c->config->routes.empty());
}

TEST(GatewayConfigFlags, FlagsOverrideTheFileWhateverTheOrder) {
  TempFile file("override.toml",
                "threads = 2\nmax_body_bytes = 100\nlog_level = \"warn\"\n[[route]]\n"
                "prefix = \"/x\"\n");
  for (bool flags_first : {true, false}) {
    auto c =
        flags_first
            ? Parse({"--threads", "8", "--max-body-bytes=1KiB", "--config", file.path().c_str()})
            : Parse({"--config", file.path().c_str(), "--threads", "8", "--max-body-bytes=1KiB"});
    ASSERT_TRUE(c) << c.error().ToString();
    ASSERT_TRUE(c->config);
    EXPECT_EQ(c->config->threads, 8u);
    EXPECT_EQ(c->config->max_body_bytes, 1024u);
    EXPECT_EQ(c->config->log_level, "warn");  // from the file, not overridden
    ASSERT_EQ(c->config->routes.size(), 1u);
    EXPECT_EQ(c->config->routes[0].prefix, "/x");
  }
  auto last = Parse({"--threads", "3", "--threads=5"});
  ASSERT_TRUE(last);
  EXPECT_EQ(last->config->threads, 5u);  // a repeated flag: the last wins
}

TEST(GatewayConfigFlags, ConfigEqualsFormAndFileErrors) {
  TempFile file("bad_flag.toml", "\nthreads = 2000\n");
  const std::string arg = "--config=" + file.path();
  auto c = Parse({arg.c_str()});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message(), file.path() + ":2: threads: 2000 is above the maximum, 1024");
  auto missing = Parse({"--config", "/nonexistent/idemd.toml"});
  ASSERT_FALSE(missing);
  EXPECT_THAT(missing.error().message(), StartsWith("/nonexistent/idemd.toml: cannot open: "));
}

TEST(GatewayConfigFlags, LeaseCheckSeesFlags) {
  TempFile file("lease.toml", "[[route]]\nprefix = \"/\"\nlease = \"20s\"\n");
  auto c = Parse({"--config", file.path().c_str(), "--upstream-timeout", "20s"});
  ASSERT_FALSE(c);
  EXPECT_THAT(c.error().message(),
              StartsWith(file.path() + ":3: route.lease: 20s must be longer than upstream_timeout "
                                       "(20s, set at --upstream-timeout)"));
  EXPECT_THAT(FlagError({"--upstream-timeout=5m"}),
              StartsWith("--upstream-timeout: 5m is not below the default route's lease (1m)"));
}

TEST(GatewayConfigFlags, FlagErrors) {
  EXPECT_EQ(FlagError({"--bogus", "1"}), "--bogus: unknown flag; see --help");
  EXPECT_THAT(FlagError({"--max_body_bytes", "1"}),
              HasSubstr("(flags spell '_' as '-': --max-body-bytes)"));
  EXPECT_THAT(FlagError({"--prefix", "/x"}),
              StartsWith("--prefix: unknown flag (route options are set in the config file"));
  EXPECT_EQ(FlagError({"--threads"}), "--threads: missing value");
  EXPECT_EQ(FlagError({"--threads", "--listen", "127.0.0.1:1"}), "--threads: missing value");
  EXPECT_EQ(FlagError({"--threads", "four"}), "--threads: \"four\" is not a non-negative integer");
  EXPECT_EQ(FlagError({"--threads=2048"}), "--threads: 2048 is above the maximum, 1024");
  EXPECT_THAT(FlagError({"--max-body-bytes", "lots"}),
              StartsWith("--max-body-bytes: \"lots\" is not a size"));
  EXPECT_THAT(FlagError({"--upstream", "https://x"}),
              StartsWith("--upstream: \"https://x\": https is not supported"));
  EXPECT_THAT(FlagError({"--listen=nowhere"}),
              StartsWith("--listen: \"nowhere\" is not HOST:PORT"));
  EXPECT_THAT(FlagError({"serve"}), StartsWith("serve: unexpected argument"));
  EXPECT_EQ(FlagError({"--config", "a", "--config", "b"}), "--config: given twice");
  EXPECT_EQ(FlagError({"--config"}), "--config: missing value");
}

TEST(GatewayConfigFlags, Help) {
  for (const char* flag : {"--help", "-h"}) {
    auto c = Parse({"--threads", "bad", flag});
    ASSERT_TRUE(c) << c.error().ToString();
    EXPECT_FALSE(c->config.has_value());
  }
}

TEST(GatewayConfigHelp, NamesEveryOptionWithItsDefault) {
  const std::string help = HelpText();
  // The other mode of the same binary.
  EXPECT_THAT(help, HasSubstr("idemd consume --config FILE"));
  EXPECT_THAT(help, HasSubstr("idemd consume --help"));
  for (const char* flag :
       {"--config FILE",           "--listen HOST:PORT",    "--admin",
        "--upstream URL",          "--store URL",           "--threads",
        "--store-threads",         "--principal-header",    "--key-header",
        "--max-key-bytes",         "--max-body-bytes SIZE", "--max-header-bytes",
        "--max-stored-body-bytes", "--strip-headers",       "--upstream-timeout DURATION",
        "--client-timeout",        "--idle-timeout",        "--shutdown-grace",
        "--upstream-connections",  "--retry-after",         "--log-level"}) {
    EXPECT_THAT(help, HasSubstr(flag));
  }
  for (const char* text : {"(file: listen, default: 127.0.0.1:8080)",
                           "(file: store, default: log:./idemd-data)",
                           "(file: max_body_bytes, default: 1MiB)",
                           "(file: upstream_timeout, default: 30s)",
                           "default: 16KiB)",
                           "default: Idempotency-Key)",
                           "(file: retry_after, default: 1s)",
                           "prefix = ",
                           "methods = ",
                           "(default: [\"POST\", \"PATCH\"])",
                           "key = ",
                           "in_flight = ",
                           "anonymous = \"shared\"",
                           "wait = \"10s\"",
                           "stored_statuses = ",
                           "[\"200-407\", \"410-424\", \"426-428\", \"430-499\"]",
                           "lease = \"1m\"",
                           "retention = \"1d\"",
                           "scope = ",
                           "memory:",
                           "log:DIR",
                           "redis://",
                           "redis+cluster://",
                           "postgres://",
                           "Exit codes",
                           "  2  bad config",
                           "-h, --help",
                           "config file only"}) {
    EXPECT_THAT(help, HasSubstr(text));
  }
}

// The repository's files: the example config and the TOML blocks in docs/configuration.md.
std::string RepoFile(std::string_view relative) {
  std::string root = __FILE__;
  root.resize(root.rfind("src/gateway/"));
  std::ifstream in(root + std::string(relative));
  EXPECT_TRUE(in) << root << relative;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(GatewayConfigExamples, LedgerExampleLoads) {
  auto c = ParseConfig(RepoFile("examples/ledger/idemd.toml"), "examples/ledger/idemd.toml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(FormatForTest(c->listen), "127.0.0.1:8080");
  EXPECT_EQ(FormatForTest(c->admin), "127.0.0.1:9090");
  EXPECT_EQ(c->upstream, "http://127.0.0.1:9000");
  EXPECT_EQ(c->store, "log:./idemd-demo-data");
  ASSERT_EQ(c->routes.size(), 1u);
  EXPECT_EQ(c->routes[0].prefix, "/charges");
  EXPECT_EQ(c->routes[0].methods, std::vector<std::string>{"POST"});
  EXPECT_EQ(c->routes[0].key, KeyMode::kRequired);
  EXPECT_EQ(c->RouteFor("/charges"), &c->routes[0]);
  EXPECT_EQ(c->RouteFor("/accounts"), nullptr);
}

TEST(GatewayConfigExamples, DocumentedTomlParses) {
  const std::string doc = RepoFile("docs/configuration.md");
  const std::string section = doc.substr(doc.find("## idemd"));
  int blocks = 0;
  for (std::size_t at = section.find("```toml\n"); at != std::string::npos;
       at = section.find("```toml\n", at + 1)) {
    const std::size_t begin = at + 8;
    const std::string toml = section.substr(begin, section.find("```", begin) - begin);
    auto c = ParseConfig(toml, "docs/configuration.md");
    EXPECT_TRUE(c) << c.error().ToString();
    ++blocks;
  }
  EXPECT_GE(blocks, 1);
}

}  // namespace
}  // namespace idem::gateway
