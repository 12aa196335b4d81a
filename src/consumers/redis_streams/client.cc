#include "consumers/redis_streams/client.h"

#include <sys/time.h>

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

void Client::Append(const Args& args) {
  if (broken_) return;
  // hiredis 0.14 takes `const char**` but does not change the array.
  if (redisAppendCommandArgv(context_, static_cast<int>(args.words_.size()),
                             const_cast<const char**>(args.words_.data()),
                             args.sizes_.data()) != REDIS_OK) {
    broken_ = true;
  }
}

Status Client::Flush() {
  if (broken_) return UnavailableError(where_ + ": broken connection");
  int done = 0;
  while (done == 0) {
    if (redisBufferWrite(context_, &done) != REDIS_OK) return Fail("write");
  }
  return OkStatus();
}

Result<Reply> Client::Read() {
  if (broken_) return UnavailableError(where_ + ": broken connection");
  void* reply = nullptr;
  if (redisGetReply(context_, &reply) != REDIS_OK || reply == nullptr) return Fail("read");
  return Reply(static_cast<redisReply*>(reply));
}

Status Client::SetTimeout(std::chrono::milliseconds timeout) {
  if (timeout == timeout_) return OkStatus();
  if (broken_) return UnavailableError(where_ + ": broken connection");
  if (redisSetTimeout(context_, ToTimeval(timeout)) != REDIS_OK) return Fail("set timeout");
  timeout_ = timeout;
  return OkStatus();
}

}  // namespace idem::redis_streams
