#include "consumers/nats/connection.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <thread>

#include "core/spare_messages.h"

namespace idem::nats {
namespace {

using Clock = std::chrono::steady_clock;

struct OptionsCloser {
  void operator()(natsOptions* o) const { natsOptions_Destroy(o); }
};
struct StreamInfoCloser {
  void operator()(jsStreamInfo* si) const { jsStreamInfo_Destroy(si); }
};

std::vector<std::string> SplitUrls(std::string_view url) {
  std::vector<std::string> out;
  while (!url.empty()) {
    const auto comma = url.find(',');
    std::string_view part = url.substr(0, comma);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (!part.empty()) out.emplace_back(part);
    if (comma == std::string_view::npos) break;
    url.remove_prefix(comma + 1);
  }
  return out;
}

std::string Clean(std::string_view s) {
  std::string out(s);
  std::replace_if(
      out.begin(), out.end(), [](char c) { return c == '\r' || c == '\n'; }, ' ');
  return out;
}

}  // namespace

std::string HideSecrets(std::string_view url) {
  std::string out;
  bool first = true;
  for (std::string_view part : SplitUrls(url)) {
    if (!first) out += ",";
    first = false;
    const auto scheme = part.find("://");
    const std::size_t start = scheme == std::string_view::npos ? 0 : scheme + 3;
    const auto at = part.find('@', start);
    if (at == std::string_view::npos) {
      out += part;
      continue;
    }
    const std::string_view userinfo = part.substr(start, at - start);
    const auto colon = userinfo.find(':');
    out += part.substr(0, start);
    out +=
        colon == std::string_view::npos ? "***" : std::string(userinfo.substr(0, colon)) + ":***";
    out += part.substr(at);
  }
  return out;
}

std::string ErrorText(std::string_view what, natsStatus s) {
  std::string text(what);
  text += ": ";
  text += natsStatus_GetText(s);
  natsStatus last = NATS_OK;
  const char* detail = nats_GetLastError(&last);
  if (detail != nullptr && *detail != '\0' && last == s) {
    text += " (";
    text += detail;
    text += ")";
  }
  return text;
}

Result<Connection> Connect(const ConnectOptions& options) {
  const std::vector<std::string> urls = SplitUrls(options.url);
  if (urls.empty()) return InvalidArgumentError("nats: url is empty");
  natsOptions* raw = nullptr;
  if (natsStatus s = natsOptions_Create(&raw); s != NATS_OK) {
    return InternalError(ErrorText("nats: options", s));
  }
  std::unique_ptr<natsOptions, OptionsCloser> opts(raw);
  std::vector<const char*> servers;
  servers.reserve(urls.size());
  for (const auto& u : urls) servers.push_back(u.c_str());
  const auto attempt_timeout = std::min<std::int64_t>(options.connect_timeout.count(), 2000);
  natsStatus s =
      natsOptions_SetServers(opts.get(), servers.data(), static_cast<int>(servers.size()));
  if (s != NATS_OK) {
    return InvalidArgumentError(ErrorText("nats: url '" + HideSecrets(options.url) + "'", s));
  }
  s = natsOptions_SetName(opts.get(), options.name.c_str());
  // Reconnect forever: a broker restart must not need a new Open.
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts.get(), -1);
  if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts.get(), options.reconnect_wait.count());
  if (s == NATS_OK)
    s = natsOptions_SetTimeout(opts.get(), std::max<std::int64_t>(attempt_timeout, 1));
  // A server that stops answering without closing the socket is noticed within ~10 s.
  if (s == NATS_OK) s = natsOptions_SetPingInterval(opts.get(), 5000);
  if (s == NATS_OK) s = natsOptions_SetMaxPingsOut(opts.get(), 2);
  if (s != NATS_OK) return InternalError(ErrorText("nats: options", s));

  const auto deadline = Clock::now() + options.connect_timeout;
  natsConnection* conn = nullptr;
  while (true) {
    s = natsConnection_Connect(&conn, opts.get());
    if (s == NATS_OK) break;
    if (s != NATS_NO_SERVER && s != NATS_TIMEOUT && s != NATS_IO_ERROR) {
      return UnavailableError(ErrorText("nats: connect to " + HideSecrets(options.url), s));
    }
    if (Clock::now() >= deadline) {
      return UnavailableError(
          ErrorText("nats: no server answered at " + HideSecrets(options.url), s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Connection c;
  c.conn.reset(conn);

  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = options.request_timeout.count();
  if (options.max_pending_publishes > 0) {
    jo.PublishAsync.MaxPending = options.max_pending_publishes;
    // A publisher that got that far ahead waits this long for PubAcks before it fails (the
    // default, 200 ms, fails a bulk publish on a busy machine).
    jo.PublishAsync.StallWait = 10'000;
  }
  jo.PublishAsync.ErrHandler = options.publish_error_handler;
  jo.PublishAsync.ErrHandlerClosure = options.publish_error_closure;
  jsCtx* js = nullptr;
  if (s = natsConnection_JetStream(&js, conn, &jo); s != NATS_OK) {
    return InternalError(ErrorText("nats: JetStream context", s));
  }
  c.js.reset(js);
  return c;
}

Result<std::vector<std::string>> StreamSubjects(jsCtx* js, std::string_view name) {
  const std::string n(name);
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  const natsStatus s = js_GetStreamInfo(&si, js, n.c_str(), nullptr, &jerr);
  std::unique_ptr<jsStreamInfo, StreamInfoCloser> owned(si);
  if (s == NATS_OK) {
    std::vector<std::string> subjects;
    if (si->Config != nullptr) {
      for (int i = 0; i < si->Config->SubjectsLen; ++i)
        subjects.emplace_back(si->Config->Subjects[i]);
    }
    return subjects;
  }
  if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
    return FailedPreconditionError("nats: stream '" + n + "' does not exist");
  }
  return UnavailableError(ErrorText("nats: stream info '" + n + "'", s));
}

Status EnsureStream(jsCtx* js, std::string_view name, const std::vector<std::string>& subjects) {
  Status exists = CheckStream(js, name);
  if (exists.ok() || exists.code() != StatusCode::kFailedPrecondition) return exists;
  const std::string n(name);
  std::vector<const char*> subs;
  subs.reserve(subjects.size());
  for (const auto& s : subjects) subs.push_back(s.c_str());
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = n.c_str();
  cfg.Subjects = subs.data();
  cfg.SubjectsLen = static_cast<int>(subs.size());
  cfg.Storage = js_FileStorage;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  const natsStatus s = js_AddStream(&si, js, &cfg, nullptr, &jerr);
  std::unique_ptr<jsStreamInfo, StreamInfoCloser> owned(si);
  if (s == NATS_OK) return OkStatus();
  if (jerr == JSStreamNameExistErr) return OkStatus();  // created meanwhile by someone else
  if (s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || s == NATS_CONNECTION_CLOSED) {
    return UnavailableError(ErrorText("nats: create stream '" + n + "'", s));
  }
  return FailedPreconditionError(ErrorText("nats: create stream '" + n + "'", s));
}

std::optional<AckReply> ParseAckReply(std::string_view reply) {
  constexpr std::string_view kPrefix = "$JS.ACK.";
  if (reply.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  reply.remove_prefix(kPrefix.size());
  // Tokens after the prefix: 7 in the old form, 9 or more in the new one.
  std::string_view tokens[12];
  std::size_t n = 0;
  while (n < 12) {
    const auto dot = reply.find('.');
    tokens[n++] = reply.substr(0, dot);
    if (dot == std::string_view::npos) break;
    reply.remove_prefix(dot + 1);
  }
  std::size_t first;  // index of <delivered>
  if (n == 7) {
    first = 2;
  } else if (n >= 9) {
    first = 4;
  } else {
    return std::nullopt;
  }
  const std::string_view delivered = tokens[first];
  const std::string_view sequence = tokens[first + 1];
  AckReply out;
  const auto [end, ec] =
      std::from_chars(delivered.data(), delivered.data() + delivered.size(), out.delivered);
  if (ec != std::errc() || end != delivered.data() + delivered.size()) return std::nullopt;
  const auto [seq_end, seq_ec] =
      std::from_chars(sequence.data(), sequence.data() + sequence.size(), out.sequence);
  if (seq_ec != std::errc() || seq_end != sequence.data() + sequence.size()) return std::nullopt;
  out.stream_sequence = sequence;
  return out;
}

Headers ReadHeaders(natsMsg* msg) {
  Headers out;
  ReadHeadersInto(msg, out);
  return out;
}

void ReadHeadersInto(natsMsg* msg, Headers& out) {
  std::size_t set = 0;
  const char** keys = nullptr;
  int count = 0;
  if (natsMsgHeader_Keys(msg, &keys, &count) == NATS_OK) {
    for (int i = 0; i < count; ++i) {
      const char** values = nullptr;
      int n = 0;
      if (natsMsgHeader_Values(msg, keys[i], &values, &n) != NATS_OK) continue;
      for (int j = 0; j < n; ++j) idem::internal::SetHeader(out, set++, keys[i], values[j]);
      std::free(static_cast<void*>(values));
    }
    std::free(static_cast<void*>(keys));
  }
  out.resize(set);
}

Status WriteHeaders(natsMsg* msg, const Headers& headers) {
  for (const auto& [name, value] : headers) {
    if (value.empty()) continue;
    const std::string n = Clean(name);
    const std::string v = Clean(value);
    if (natsStatus s = natsMsgHeader_Add(msg, n.c_str(), v.c_str()); s != NATS_OK) {
      return InvalidArgumentError(ErrorText("nats: header '" + n + "'", s));
    }
  }
  return OkStatus();
}

}  // namespace idem::nats
