// postgres:// store URLs: idem's own parameters are taken out, the rest is libpq's URI.
#include <libpq-fe.h>

#include <charconv>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/duration_text.h"
#include "core/url_text.h"
#include "idem/stores/postgres.h"
#include "stores/postgres/schema.h"

namespace idem {
namespace {

Status Bad(std::string_view what) {
  return InvalidArgumentError("PostgreSQL store URL: " + std::string(what));
}

Result<std::uint64_t> ParseCount(std::string_view name, std::string_view text, std::uint64_t min,
                                 std::uint64_t max) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < min || v > max) {
    return Bad(std::string(name) + "=" + std::string(text) + " is not a whole number from " +
               std::to_string(min) + " to " + std::to_string(max));
  }
  return v;
}

// core::ParseDuration's syntax; 0 only where `zero_ok`.
Result<std::chrono::milliseconds> ParseDuration(std::string_view name, std::string_view text,
                                                bool zero_ok) {
  auto d = core::ParseDuration(text);
  const std::string option = std::string(name) + "=" + std::string(text);
  if (!d) return Bad(option + ": " + d.error().message());
  if (d->count() == 0 && !zero_ok) return Bad(option + " must be above 0");
  return d;
}

// libpq's PQconninfoParse checks the names of its options, not their values: a bad sslmode or
// port surfaced only at the first connection, as kUnavailable (exit 1, "is the server down?").
// These are the values libpq 15 takes for the options whose mistakes are plain to see.
Status CheckLibpqValue(std::string_view name, std::string_view value) {
  const auto one_of = [&](std::initializer_list<std::string_view> allowed) -> Status {
    for (std::string_view a : allowed) {
      if (value == a) return OkStatus();
    }
    std::string list;
    for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    return Bad(std::string(name) + "=" + std::string(value) + " is not one of " + list);
  };
  if (name == "sslmode") {
    return one_of({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"});
  }
  if (name == "gssencmode" || name == "channel_binding")
    return one_of({"disable", "prefer", "require"});
  if (name == "target_session_attrs") {
    return one_of({"any", "read-write", "read-only", "primary", "standby", "prefer-standby"});
  }
  if (name == "port") {  // one port, or one per host ("5432,5433"); empty: the default
    std::string_view rest = value;
    while (true) {
      const std::size_t comma = rest.find(',');
      const std::string_view port = rest.substr(0, comma);
      if (!port.empty() && !ParseCount("port", port, 1, 65535)) {
        return Bad("port " + std::string(port) + " is not a whole number from 1 to 65535");
      }
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  return OkStatus();
}

Result<PostgresStoreOptions> ParseUrl(std::string_view url) {
  if (const std::size_t at = core::FirstControlByte(url); at != std::string_view::npos) {
    return Bad(core::ControlByteMessage(url, at));
  }
  if (!url.starts_with("postgres://") && !url.starts_with("postgresql://")) {
    return Bad("\"" + std::string(url.substr(0, url.find(':'))) +
               ":\" is not postgres:// or postgresql://");
  }
  PostgresStoreOptions o;
  const std::size_t question = url.find('?');
  std::string conninfo(url.substr(0, question));
  std::string rest;  // the parameters left for libpq
  if (question != std::string_view::npos) {
    std::string_view query = url.substr(question + 1);
    while (!query.empty()) {
      const std::size_t amp = query.find('&');
      const std::string_view pair = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      if (pair.empty()) continue;
      const std::size_t eq = pair.find('=');
      if (eq == std::string_view::npos)
        return Bad("parameter \"" + std::string(pair) + "\" has no value");
      const std::string_view name = pair.substr(0, eq);
      const std::string_view value = pair.substr(eq + 1);
      if (name == "schema") {
        o.schema = std::string(value);
      } else if (name == "pool_size") {
        auto v = ParseCount(name, value, 1, 1024);
        if (!v) return v.error();
        o.pool_size = *v;
      } else if (name == "max_transactions") {
        auto v = ParseCount(name, value, 1, 4096);
        if (!v) return v.error();
        o.max_transactions = *v;
      } else if (name == "max_key_bytes") {
        auto v = ParseCount(name, value, 1, kMaxPostgresKeyBytes);
        if (!v) return v.error();
        o.max_key_bytes = *v;
      } else if (name == "reclaim_batch") {
        auto v = ParseCount(name, value, 1, 1'000'000);
        if (!v) return v.error();
        o.reclaim_batch = *v;
      } else if (name == "abandoned_retention" || name == "connect_timeout" ||
                 name == "statement_timeout" || name == "reclaim_interval") {
        auto v = ParseDuration(name, value, name == "reclaim_interval");
        if (!v) return v.error();
        if (name == "abandoned_retention") o.abandoned_retention = *v;
        if (name == "connect_timeout") o.connect_timeout = *v;
        if (name == "statement_timeout") o.statement_timeout = *v;
        if (name == "reclaim_interval") o.reclaim_interval = *v;
      } else {
        rest += rest.empty() ? "" : "&";
        rest += pair;
      }
    }
  }
  if (!rest.empty()) conninfo += "?" + rest;
  if (Status s = pg::CheckSchemaName(o.schema); !s.ok()) return Bad(s.message());
  // libpq has the last word on its own part (host, port, database, sslmode, ...).
  char* error = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &error);
  if (parsed == nullptr) {
    std::string why = error != nullptr ? error : "libpq cannot parse it";
    if (error != nullptr) PQfreemem(error);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    // libpq quotes the URI, or the part it refuses, password and all.
    return Bad(core::RedactUrlPasswordIn(why, conninfo));
  }
  Status values = OkStatus();
  for (const PQconninfoOption* opt = parsed; opt->keyword != nullptr && values.ok(); ++opt) {
    if (opt->val != nullptr) values = CheckLibpqValue(opt->keyword, opt->val);
  }
  PQconninfoFree(parsed);
  if (!values.ok()) return values;
  o.conninfo = std::move(conninfo);
  return o;
}

}  // namespace

// Every message is about `url`, and some quote a part of it (libpq's, a schema name): none
// may show its password.
Result<PostgresStoreOptions> ParsePostgresStoreUrl(std::string_view url) {
  Result<PostgresStoreOptions> o = ParseUrl(url);
  if (o.has_value()) return o;
  return Status(o.error().code(), core::RedactUrlPasswordIn(o.error().message(), url));
}

}  // namespace idem
