#include "consumers/redis_streams/client.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <string>
#include <utility>

#include "core/url_text.h"
#include "idem/stores/redis.h"

namespace idem::redis_streams {
namespace {

timeval ToTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

}  // namespace

Result<Address> ParseAddress(std::string_view url, std::string_view option) {
  // The store's URL grammar, so that both take the same URLs; the store's own options
  // (?prefix=...) and clusters mean nothing here.
  const std::string name(option);
  auto options = ParseRedisStoreUrl(url);
  if (!options) return InvalidArgumentError(name + ": " + options.error().message());
  const std::string text = core::RedactUrlPassword(url);
  if (options->cluster) {
    return InvalidArgumentError(name + " \"" + text +
                                "\": one node only (redis://HOST:PORT): one XREADGROUP reads "
                                "every stream, which a Redis Cluster allows only in one slot");
  }
  if (url.find('?') != std::string_view::npos) {
    return InvalidArgumentError(name + " \"" + text +
                                "\": takes no ?options (set the timeouts in the config)");
  }
  auto endpoint = redis::ParseEndpoint(options->nodes.at(0), 6379);
  if (!endpoint) return InvalidArgumentError(name + ": " + endpoint.error().message());
  Address a;
  a.host = std::move(endpoint->host);
  a.port = endpoint->port;
  a.user = std::move(options->user);
  a.password = std::move(options->password);
  a.database = options->database;
  a.text = text;
  return a;
}

Result<std::unique_ptr<Client>> Client::Open(const Address& address,
                                             std::chrono::milliseconds timeout) {
  const std::string where = "redis " + address.host + ":" + std::to_string(address.port);
  redisContext* c = redisConnectWithTimeout(address.host.c_str(), address.port, ToTimeval(timeout));
  if (c == nullptr) return UnavailableError(where + ": cannot allocate a connection");
  if (c->err != 0) {
    const std::string why = c->errstr;
    redisFree(c);
    return UnavailableError(where + ": cannot connect: " + why);
  }
  // Keep the reply buffer between replies: by default hiredis frees it whenever more than 16 KiB
  // is unused, and a batch of entries is larger, so each batch regrew it from nothing.
  c->reader->maxbuf = 0;
  std::unique_ptr<Client> client(new Client(c, where));
  IDEM_RETURN_IF_ERROR(client->SetTimeout(timeout));
  if (!address.password.empty()) {
    Args auth;
    auth.Add("AUTH");
    if (!address.user.empty()) auth.Add(address.user);
    auth.Add(address.password);
    client->Append(auth);
  }
  const std::string db = std::to_string(address.database);
  if (address.database != 0) client->Append(Args().Add("SELECT").Add(db));
  const int hellos = (address.password.empty() ? 0 : 1) + (address.database != 0 ? 1 : 0);
  for (int i = 0; i < hellos; ++i) {
    auto r = client->Read();
    if (!r) return r.error();
    if (IsError(**r)) return UnavailableError(where + ": AUTH/SELECT refused: " + Describe(**r));
  }
  return client;
}

Client::Client(redisContext* context, std::string where)
    : context_(context), where_(std::move(where)) {}

Client::~Client() { redisFree(context_); }

Status Client::Fail(std::string_view what) {
  broken_ = true;
  std::string why = context_->err != 0 ? context_->errstr : "broken connection";
  if (context_->err == REDIS_ERR_IO && why.find("temporarily unavailable") != std::string::npos) {
    why = "no answer within " + std::to_string(timeout_.count()) + " ms";
  }
  return UnavailableError(where_ + ": " + std::string(what) + ": " + why);
}

// The command in RESP, formatted here rather than by redisAppendCommandArgv, whose sdscatfmt
// took a tenth of a consumer's time on XACKs of a few hundred ids.
void Client::Append(const Args& args) {
  if (broken_) return;
  std::string& out = scratch_;
  out.clear();
  char digits[24];
  auto number = [&](char kind, std::size_t n) {
    out.push_back(kind);
    const auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
    out.append(digits, end);
    out.append("\r\n");
  };
  number('*', args.words_.size());
  for (std::size_t i = 0; i < args.words_.size(); ++i) {
    number('$', args.sizes_[i]);
    out.append(args.words_[i], args.sizes_[i]);
    out.append("\r\n");
  }
  if (redisAppendFormattedCommand(context_, out.data(), out.size()) != REDIS_OK) broken_ = true;
}

// hiredis writes with write(2), which raises SIGPIPE on a connection the server closed and
// kills a process that did not ignore it; a library must not change that for its process.
// So the client sends hiredis's output buffer itself with MSG_NOSIGNAL, and hiredis, finding
// the buffer empty, only reads.
Status Client::Flush() {
  if (broken_) return UnavailableError(where_ + ": broken connection");
  sds& out = context_->obuf;
  while (sdslen(out) > 0) {
    const ssize_t n = ::send(context_->fd, out, sdslen(out), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      const bool slow = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      return UnavailableError(
          where_ + ": write: " +
          (slow ? "no progress within " + std::to_string(timeout_.count()) + " ms"
                : std::string(n < 0 ? std::strerror(errno) : "closed")));
    }
    // sdsrange(out, n, -1), without calling it: hiredis 0.14 declares sds.h's functions
    // without extern "C", so C++ cannot link them; sdslen and sdssetlen are inline.
    const std::size_t rest = sdslen(out) - static_cast<std::size_t>(n);
    std::memmove(out, out + n, rest);
    out[rest] = '\0';
    sdssetlen(out, rest);
  }
  return OkStatus();
}

Result<Reply> Client::Read() {
  IDEM_RETURN_IF_ERROR(Flush());
  void* reply = nullptr;
  if (redisGetReply(context_, &reply) != REDIS_OK || reply == nullptr) return Fail("read");
  return Reply(static_cast<redisReply*>(reply));
}

Status Client::ReadWith(redisReplyObjectFunctions* functions, void* privdata) {
  IDEM_RETURN_IF_ERROR(Flush());
  redisReader* reader = context_->reader;
  redisReplyObjectFunctions* const saved = reader->fn;
  void* const saved_privdata = reader->privdata;
  reader->fn = functions;
  reader->privdata = privdata;
  // redisGetReply without its write (the buffer is empty): parse what is buffered, read more
  // until a whole reply is there.
  void* reply = nullptr;
  int ok = redisGetReplyFromReader(context_, &reply);
  while (ok == REDIS_OK && reply == nullptr) {
    ok = redisBufferRead(context_);
    if (ok == REDIS_OK) ok = redisGetReplyFromReader(context_, &reply);
  }
  reader->fn = saved;
  reader->privdata = saved_privdata;
  if (ok != REDIS_OK) return Fail("read");
  return OkStatus();
}

Status Client::SetTimeout(std::chrono::milliseconds timeout) {
  if (timeout == timeout_) return OkStatus();
  if (broken_) return UnavailableError(where_ + ": broken connection");
  if (redisSetTimeout(context_, ToTimeval(timeout)) != REDIS_OK) return Fail("set timeout");
  timeout_ = timeout;
  return OkStatus();
}

}  // namespace idem::redis_streams
