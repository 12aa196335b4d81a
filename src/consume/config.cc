#include "consume/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "gateway/config_values.h"
#include "idem/consumers/kafka.h"

namespace idem::consume {
namespace {

using std::chrono::milliseconds;
using namespace gateway::config_detail;  // NOLINT: the shared value syntax

constexpr std::uint32_t kMaxAttempts = 1000;
constexpr std::size_t kMaxBatch = 100'000;

std::optional<std::string> CheckLogLevel(std::string_view v) {
  if (v == "debug" || v == "info" || v == "warn" || v == "error") return std::nullopt;
  return Quote(v) + " is not a log level (debug, info, warn or error)";
}

Result<std::string> StringOf(const toml::node& n) {
  if (!n.is_string()) return WrongType(n, "a string");
  return n.as_string()->get();
}

Result<std::string> NonEmptyString(const toml::node& n) {
  auto s = StringOf(n);
  if (!s) return s;
  if (s->empty()) return InvalidArgumentError("must not be empty");
  return s;
}

Result<std::uint64_t> Count(const toml::node& n, std::uint64_t min, std::uint64_t max) {
  if (!n.is_integer()) return WrongType(n, "an integer");
  auto v = NonNegative(n);
  if (!v) return v;
  if (*v < min || *v > max) {
    return InvalidArgumentError(std::to_string(*v) + " is not within " + std::to_string(min) +
                                ".." + std::to_string(max));
  }
  return v;
}

constexpr milliseconds kMaxPollWait{10'000};

Result<milliseconds> PositiveDuration(const toml::node& n) {
  auto d = DurationFromNode(n);
  if (!d) return d;
  if (d->count() <= 0) return InvalidArgumentError("must be above 0");
  return d;
}

Result<KeySource> ParseKeySource(std::string_view s) {
  if (s == "fingerprint") return KeySource::Fingerprint();
  if (s.rfind("header:", 0) == 0) {
    const std::string_view name = s.substr(7);
    if (auto e = CheckHeaderName(name)) return InvalidArgumentError(*e);
    return KeySource::Header(std::string(name));
  }
  if (s.rfind("json:", 0) == 0) {
    const std::string_view ptr = s.substr(5);
    if (!ptr.empty() && ptr[0] != '/') {
      return InvalidArgumentError(Quote(ptr) + " is not a JSON pointer (it starts with '/')");
    }
    return KeySource::JsonPointer(std::string(ptr));
  }
  return InvalidArgumentError(Quote(s) +
                              " is not a key source (write \"header:NAME\", \"json:/pointer\" or "
                              "\"fingerprint\")");
}

// Where a versioned message names its entity or version: a header or a JSON pointer.
Result<KeySource> ParseFieldSource(const toml::node& n) {
  auto s = StringOf(n);
  if (!s) return s.error();
  if (*s == "fingerprint" || (!s->starts_with("header:") && !s->starts_with("json:"))) {
    return InvalidArgumentError(Quote(*s) +
                                " is not a field (write \"header:NAME\" or "
                                "\"json:/pointer\")");
  }
  return ParseKeySource(*s);
}

Result<FingerprintMode> ParseFingerprint(std::string_view s) {
  if (s == "none") return FingerprintMode::kNone;
  if (s == "bytes") return FingerprintMode::kBytes;
  if (s == "json") return FingerprintMode::kJson;
  return InvalidArgumentError(Quote(s) + " is not a fingerprint mode (none, bytes or json)");
}

Status CheckHandlerUrl(std::string_view url) {
  auto parsed = gateway::ParseUpstreamUrl(url);
  if (!parsed) return parsed.error();
  return OkStatus();
}

// One [[consumer]] option: how to read it into the config.
using Setter = std::function<Status(const toml::node&, ConsumerConfig&)>;

template <typename T, typename F>
Setter Set(T ConsumerConfig::*field, F parse) {
  return [field, parse](const toml::node& n, ConsumerConfig& c) -> Status {
    auto v = parse(n);
    if (!v) return v.error();
    c.*field = static_cast<T>(*v);
    return OkStatus();
  };
}

const std::map<std::string, Setter, std::less<>>& ConsumerOptions() {
  static const std::map<std::string, Setter, std::less<>> options{
      {"name", Set(&ConsumerConfig::name, NonEmptyString)},
      {"broker",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto s = StringOf(n);
         if (!s) return s.error();
         if (*s == "kafka") {
           c.broker = BrokerKind::kKafka;
         } else if (*s == "nats") {
           c.broker = BrokerKind::kNats;
         } else if (*s == "redis") {
           c.broker = BrokerKind::kRedis;
         } else {
           return InvalidArgumentError(Quote(*s) + " is not a broker (kafka, nats or redis)");
         }
         return OkStatus();
       }},
      {"url", Set(&ConsumerConfig::url, NonEmptyString)},
      {"topics",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto v = StringsFromNode(n);
         if (!v) return v.error();
         if (v->empty()) return InvalidArgumentError("must name at least one");
         for (const auto& t : *v) {
           if (t.empty()) return InvalidArgumentError("an empty name");
         }
         c.topics = std::move(*v);
         return OkStatus();
       }},
      {"group", Set(&ConsumerConfig::group, NonEmptyString)},
      {"dlq", Set(&ConsumerConfig::dlq, NonEmptyString)},
      {"stream", Set(&ConsumerConfig::stream, NonEmptyString)},
      {"dlq_stream", Set(&ConsumerConfig::dlq_stream, NonEmptyString)},
      {"consumer_name", Set(&ConsumerConfig::consumer_name, NonEmptyString)},
      {"payload_field", Set(&ConsumerConfig::payload_field, NonEmptyString)},
      {"ack_wait", Set(&ConsumerConfig::ack_wait, PositiveDuration)},
      {"claim_idle", Set(&ConsumerConfig::claim_idle, PositiveDuration)},
      {"session_timeout", Set(&ConsumerConfig::session_timeout, PositiveDuration)},
      {"properties",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         const toml::table* t = n.as_table();
         if (t == nullptr) return WrongType(n, "a table of librdkafka properties");
         c.properties.clear();
         for (auto [k, v] : InFileOrder(*t)) {
           if (v->is_string()) {
             c.properties.emplace_back(std::string(k->str()), v->as_string()->get());
           } else if (v->is_integer()) {
             c.properties.emplace_back(std::string(k->str()),
                                       std::to_string(v->as_integer()->get()));
           } else if (v->is_boolean()) {
             c.properties.emplace_back(std::string(k->str()),
                                       v->as_boolean()->get() ? "true" : "false");
           } else {
             return InvalidArgumentError("property " + Quote(k->str()) +
                                         ": expected a string, "
                                         "integer or boolean, got " +
                                         std::string(TypeName(*v)));
           }
         }
         return OkStatus();
       }},
      {"handler",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto s = StringOf(n);
         if (!s) return s.error();
         IDEM_RETURN_IF_ERROR(CheckHandlerUrl(*s));
         c.handler = std::move(*s);
         return OkStatus();
       }},
      {"handler_timeout", Set(&ConsumerConfig::handler_timeout, PositiveDuration)},
      {"key_header",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto s = StringOf(n);
         if (!s) return s.error();
         if (auto e = CheckHeaderName(*s)) return InvalidArgumentError(*e);
         c.key_header = std::move(*s);
         return OkStatus();
       }},
      {"attempt_header",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto s = StringOf(n);
         if (!s) return s.error();
         if (auto e = CheckHeaderName(*s)) return InvalidArgumentError(*e);
         c.attempt_header = std::move(*s);
         return OkStatus();
       }},
      {"permanent_statuses",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         const toml::array* a = n.as_array();
         if (a == nullptr) return WrongType(n, "an array of statuses");
         c.permanent_statuses.clear();
         for (const toml::node& e : *a) {
           auto r = ParseStatusRange(e);
           if (!r) return r.error();
           if (r->first < 300) {
             return InvalidArgumentError("a 1xx or 2xx status cannot be a failure");
           }
           c.permanent_statuses.push_back(*r);
         }
         return OkStatus();
       }},
      {"forward_headers",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto v = StringsFromNode(n);
         if (!v) return v.error();
         for (const auto& h : *v) {
           if (auto e = CheckHeaderName(h)) return InvalidArgumentError(*e);
         }
         c.forward_headers = std::move(*v);
         return OkStatus();
       }},
      {"scope", Set(&ConsumerConfig::scope, StringOf)},
      {"key",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto s = StringOf(n);
         if (!s) return s.error();
         auto k = ParseKeySource(*s);
         if (!k) return k.error();
         c.key = std::move(*k);
         return OkStatus();
       }},
      {"entity", Set(&ConsumerConfig::entity,
                     [](const toml::node& n) -> Result<std::optional<KeySource>> {
                       auto f = ParseFieldSource(n);
                       if (!f) return f.error();
                       return std::optional<KeySource>(std::move(*f));
                     })},
      {"version", Set(&ConsumerConfig::version,
                      [](const toml::node& n) -> Result<std::optional<KeySource>> {
                        auto f = ParseFieldSource(n);
                        if (!f) return f.error();
                        return std::optional<KeySource>(std::move(*f));
                      })},
      {"fingerprint",
       [](const toml::node& n, ConsumerConfig& c) -> Status {
         auto s = StringOf(n);
         if (!s) return s.error();
         auto f = ParseFingerprint(*s);
         if (!f) return f.error();
         c.fingerprint = *f;
         return OkStatus();
       }},
      {"batch",
       Set(&ConsumerConfig::batch, [](const toml::node& n) { return Count(n, 1, kMaxBatch); })},
      {"poll_wait", Set(&ConsumerConfig::poll_wait,
                        [](const toml::node& n) -> Result<milliseconds> {
                          // A stopping consumer finishes the poll it is in: this bounds how
                          // long SIGTERM takes.
                          auto d = DurationFromNode(n);
                          if (d && *d > kMaxPollWait) {
                            return InvalidArgumentError(FormatDuration(*d) +
                                                        " is above the maximum, 10s (a consumer "
                                                        "stopping finishes its current poll)");
                          }
                          return d;
                        })},
      {"lease", Set(&ConsumerConfig::lease, PositiveDuration)},
      {"retention", Set(&ConsumerConfig::retention, PositiveDuration)},
      {"failure_retention", Set(&ConsumerConfig::failure_retention, PositiveDuration)},
      {"max_attempts", Set(&ConsumerConfig::max_attempts,
                           [](const toml::node& n) { return Count(n, 1, kMaxAttempts); })},
      {"backoff", Set(&ConsumerConfig::backoff, DurationFromNode)},
      {"max_backoff", Set(&ConsumerConfig::max_backoff, DurationFromNode)},
      {"busy_timeout", Set(&ConsumerConfig::busy_timeout, DurationFromNode)},
      {"pipeline", Set(&ConsumerConfig::pipeline,
                       [](const toml::node& n) -> Result<bool> {
                         if (!n.is_boolean()) return WrongType(n, "true or false");
                         return n.as_boolean()->get();
                       })},
  };
  return options;
}

// What a broker needs, checked once the table is read. `lines`: where each option was set;
// an error about an option names its line, one about a missing option the table's.
Status CheckConsumer(const ConsumerConfig& c, std::string_view table_at,
                     const std::map<std::string, std::string>& lines) {
  const auto at = [&](const std::string& option) -> std::string_view {
    auto it = lines.find(option);
    return it == lines.end() ? table_at : std::string_view(it->second);
  };
  const auto missing = [&](std::string_view option, std::string_view why) {
    return ErrorAt(table_at, "consumer." + std::string(option),
                   "missing" + (why.empty() ? std::string() : " (" + std::string(why) + ")"));
  };
  if (c.name.empty()) return missing("name", "");
  if (c.url.empty()) return missing("url", "");
  if (c.group.empty()) return missing("group", "the consumer group or durable name");
  if (c.dlq.empty()) return missing("dlq", "poison and failing messages go there");
  if (c.handler.empty()) return missing("handler", "http://host:port/path");
  if (c.topics.empty() && c.broker != BrokerKind::kNats) {
    return missing("topics", c.broker == BrokerKind::kKafka ? "Kafka topics" : "Redis streams");
  }
  if (c.broker == BrokerKind::kNats && c.stream.empty()) {
    return missing("stream", "the JetStream stream");
  }
  if (c.max_backoff < c.backoff) {
    return ErrorAt(at("max_backoff"), "consumer.max_backoff", "is below backoff");
  }
  const auto same_name = [](std::string_view a, std::string_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) ==
             std::tolower(static_cast<unsigned char>(y));
    });
  };
  if (same_name(c.key_header, c.attempt_header)) {
    return ErrorAt(at("attempt_header"), "consumer.attempt_header",
                   Quote(c.attempt_header) +
                       " is key_header too: the attempt number would "
                       "replace the key on the handler's request");
  }
  for (std::size_t i = 0; i < c.topics.size(); ++i) {
    if (std::find(c.topics.begin(), c.topics.begin() + static_cast<std::ptrdiff_t>(i),
                  c.topics[i]) != c.topics.begin() + static_cast<std::ptrdiff_t>(i)) {
      return ErrorAt(at("topics"), "consumer.topics", Quote(c.topics[i]) + " is listed twice");
    }
  }
  if (std::find(c.topics.begin(), c.topics.end(), c.dlq) != c.topics.end()) {
    return ErrorAt(at("dlq"), "consumer.dlq",
                   Quote(c.dlq) +
                       " is also one of the topics read: every dead letter would be "
                       "consumed again, and a poison message dead-lettered forever");
  }
  if (c.broker == BrokerKind::kKafka && c.session_timeout < kafka::kMinSessionTimeout) {
    return ErrorAt(at("session_timeout"), "consumer.session_timeout",
                   "is below 1s: the group would drop a consumer between two polls (its "
                   "heartbeat is a third of it)");
  }
  if (c.entity.has_value() != c.version.has_value()) {
    return missing(c.entity ? "version" : "entity",
                   "a versioned message names an entity and a version: set both");
  }
  // No bound between lease and handler_timeout: the consumer extends a batch's leases while
  // its handler calls run (ConsumerOptions::keep_leases).
  return OkStatus();
}

Status ParseConsumer(std::string_view file, const toml::table& t, ConsumeConfig& config,
                     std::set<std::string>& names) {
  ConsumerConfig c;
  bool has_scope = false;
  bool has_broker = false;
  std::map<std::string, std::string> lines;  // option -> "FILE:LINE"
  const std::string table_at = At(file, t.source());
  for (auto [k, v] : InFileOrder(t)) {
    const std::string key(k->str());
    const std::string where = At(file, k->source());
    auto it = ConsumerOptions().find(key);
    if (it == ConsumerOptions().end()) {
      return ErrorAt(where, "consumer." + key, "unknown option");
    }
    if (Status s = it->second(*v, c); !s.ok()) {
      return ErrorAt(where, "consumer." + key, s.message());
    }
    lines[key] = where;
    has_scope = has_scope || key == "scope";
    has_broker = has_broker || key == "broker";
  }
  // No default: a consumer of a NATS or Redis URL that left it out ran as a Kafka consumer that
  // consumed nothing, with no error.
  if (!has_broker) return ErrorAt(table_at, "consumer.broker", "missing (kafka, nats or redis)");
  IDEM_RETURN_IF_ERROR(CheckConsumer(c, table_at, lines));
  if (!names.insert(c.name).second) {
    return ErrorAt(table_at, "consumer.name", Quote(c.name) + " is used by two consumers");
  }
  if (!has_scope) c.scope = c.name;
  c.defined_at = table_at;
  if (c.broker == BrokerKind::kNats && c.dlq_stream.empty()) c.dlq_stream = c.stream + "_DLQ";
  if (c.consumer_name.empty()) c.consumer_name = c.name;
  config.consumers.push_back(std::move(c));
  return OkStatus();
}

// A top-level option from the file or a flag.
Status SetTop(std::string_view option, std::string_view value, ConsumeConfig& config) {
  if (option == "store") {
    if (auto e = CheckStoreUrl(value)) return InvalidArgumentError(*e);
    config.store = std::string(value);
  } else if (option == "admin") {
    auto e = gateway::ParseEndpoint(value);
    if (!e) return e.error();
    config.admin = *e;
  } else if (option == "log_level") {
    if (auto e = CheckLogLevel(value)) return InvalidArgumentError(*e);
    config.log_level = std::string(value);
  } else {
    return InvalidArgumentError("unknown option");
  }
  return OkStatus();
}

}  // namespace

std::string_view BrokerKindName(BrokerKind k) {
  switch (k) {
    case BrokerKind::kKafka:
      return "kafka";
    case BrokerKind::kNats:
      return "nats";
    case BrokerKind::kRedis:
      return "redis";
  }
  return "unknown";
}

Result<ConsumeConfig> ParseConsumeConfig(std::string_view text, std::string_view file) {
  auto parsed = ParseToml(text, file);
  if (!parsed) return parsed.error();
  const toml::table& root = *parsed;
  ConsumeConfig config;
  std::set<std::string> names;
  for (auto [k, v] : InFileOrder(root)) {
    const std::string key(k->str());
    const std::string where = At(file, k->source());
    if (key == "consumer") {
      const toml::array* a = v->as_array();
      if (a == nullptr || !a->is_array_of_tables()) {
        return ErrorAt(where, key, "expected an array of tables ([[consumer]])");
      }
      for (const toml::node& t : *a) {
        IDEM_RETURN_IF_ERROR(ParseConsumer(file, *t.as_table(), config, names));
      }
      continue;
    }
    if (ConsumerOptions().count(key) > 0) {
      return ErrorAt(where, key, "unknown option (consumer options go in a [[consumer]] table)");
    }
    if (!v->is_string()) return ErrorAt(where, key, WrongType(*v, "a string").message());
    if (Status s = SetTop(key, v->as_string()->get(), config); !s.ok()) {
      return ErrorAt(where, key, s.message());
    }
  }
  if (config.consumers.empty()) {
    return InvalidArgumentError(std::string(file) + ": no [[consumer]] table: nothing to consume");
  }
  return config;
}

Result<std::optional<ConsumeConfig>> ParseConsumeCommandLine(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return std::optional<ConsumeConfig>();
  }
  std::optional<std::string> path;
  std::vector<std::pair<std::string, std::string>> flags;  // (flag, value)
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.substr(0, 2) != "--" || arg.size() == 2) {
      return InvalidArgumentError(std::string(arg) + ": unexpected argument (see --help)");
    }
    const auto eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--") {
      value = argv[++i];
    } else {
      return InvalidArgumentError(name + ": missing value");
    }
    if (name == "--config") {
      if (path) return InvalidArgumentError("--config: given twice");
      path = std::move(value);
    } else if (name == "--store" || name == "--admin" || name == "--log-level") {
      flags.emplace_back(name, std::move(value));
    } else {
      return InvalidArgumentError(name + ": unknown flag; see --help");
    }
  }
  if (!path) {
    return InvalidArgumentError("--config FILE is required: consumers are defined in the file");
  }
  auto text = ReadFile(*path);
  if (!text) return text.error();
  auto config = ParseConsumeConfig(*text, *path);
  if (!config) return config.error();
  for (const auto& [flag, value] : flags) {
    std::string option = flag.substr(2);
    std::replace(option.begin(), option.end(), '-', '_');
    if (Status s = SetTop(option, value, *config); !s.ok()) {
      return InvalidArgumentError(flag + ": " + s.message());
    }
  }
  return std::optional<ConsumeConfig>(std::move(*config));
}

std::string ConsumeHelpText() {
  return R"(idemd consume: dedup messages from Kafka, NATS JetStream or Redis Streams in front of an
HTTP handler. Each distinct key runs the handler once; duplicates are acknowledged with the
stored outcome; failures are retried with backoff, then dead-lettered.

Usage: idemd consume --config FILE [--store URL] [--admin HOST:PORT] [--log-level LEVEL]

Top-level options (file or flag):
  store       where keys and outcomes are kept: memory:, log:DIR[?sync=...], redis://...,
              redis+cluster://..., postgres://...      (default log:./idemd-consume-data)
  admin       /metrics, /healthz, /readyz              (default 127.0.0.1:9091)
  log_level   debug, info, warn or error               (default info)

[[consumer]] tables (file only), one thread each:
  name               required; the metrics label and the default scope
  broker             kafka | nats | redis (required)
  url                kafka: bootstrap "host:port,..."; nats: nats://host:port;
                     redis: redis://[:password@]host:port[/db]
  topics             kafka topics | redis streams | JetStream subjects (the stream's subjects
                     when it is created; the filter when there is one)
  group              kafka group | redis consumer group | JetStream durable name
  dlq                dead-letter topic | stream | subject (required; not one of topics)
  stream             nats: the JetStream stream (required); dlq_stream: its DLQ's stream
                     (default STREAM_DLQ)
  consumer_name      redis: this process's stable name in the group (default: name)
  payload_field      redis: the entry field holding the payload (default payload)
  ack_wait           nats: unacked this long -> redelivered (default 30s)
  claim_idle         redis: pending this long on a dead consumer -> reclaimed (default 30s)
  session_timeout    kafka: session.timeout.ms (default 45s, at least 1s)
  properties         kafka: more librdkafka properties, { "fetch.min.bytes" = "1" }
  handler            http://host[:port]/path: each message is POSTed there with its key in
                     key_header and the attempt number in attempt_header
  handler_timeout    one bound for a call: connect, request, answer (default 10s; it may be
                     longer than lease: leases are extended while a call runs)
  key_header         (default Idempotency-Key)    attempt_header (default Idempotency-Attempt;
                     not key_header)
  permanent_statuses statuses that dead-letter at once (default 400,403,404,405,410,413,415,
                     422); 2xx succeeds; any other status or no answer is retried
  forward_headers    message headers copied onto the handler's request
  key                where the key is: "header:NAME" (default header:Idempotency-Key),
                     "json:/pointer" into the payload, or "fingerprint" (of the payload)
  fingerprint        none | bytes | json: a key reused for another payload is dead-lettered
                     as a conflict
  entity, version    versioned messages (both or neither): where a message names its entity
                     and version, "header:NAME" or "json:/pointer". Such a message runs only
                     above its entity's applied version (else it is acknowledged as stale),
                     one version of an entity at a time; its handler key is ENTITY#VERSION
  scope              store scope (default: name)
  batch              messages per poll (default 256)      poll_wait (default 100ms, at most 10s)
  lease              (default 30s)  retention (default 24h)  failure_retention (default 24h)
  max_attempts       handler runs before the DLQ (default 5)
  backoff, max_backoff  retry delays: backoff doubling up to max_backoff, with jitter
                     (default 100ms, 10s)
  busy_timeout       how long a key another worker holds is waited for (default lease + 1s)
  pipeline           poll the next batch while a batch's begins (with the completions of
                     the batch before it) go to the store: one group commit per batch, and
                     its sync overlaps the poll (default true)

Durations: "250ms", "30s", "5m", "1h" or an integer of milliseconds.
Exit status: 0 after SIGTERM/SIGINT, 1 when the store, a broker or the admin listener cannot be
opened, 2 for a bad command line or configuration. See docs/consumers.md.
)";
}

}  // namespace idem::consume
