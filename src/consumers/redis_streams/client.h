// One blocking hiredis connection to one Redis node, for the Redis Streams broker and its
// helpers. Commands are appended (pipelined) and their replies read in order. Any I/O error or
// timeout leaves the client broken: every later call answers kUnavailable, and the owner opens
// a new one. Error replies are replies, not Status: the caller decides what they mean.
#ifndef IDEM_CONSUMERS_REDIS_STREAMS_CLIENT_H_
#define IDEM_CONSUMERS_REDIS_STREAMS_CLIENT_H_

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/status.h"
#include "stores/redis/connection.h"

namespace idem::redis_streams {

using redis::Reply;

// Where the server is, from redis://[[user]:password@]host[:port][/db].
struct Address {
  std::string host;
  int port = 6379;
  std::string user;
  std::string password;
  int database = 0;
  std::string text;  // the URL with its password hidden, for messages
};
// kInvalidArgument naming what is wrong (the message starts with `option`).
Result<Address> ParseAddress(std::string_view url, std::string_view option = "url");

// The words of one command. The views must stay valid until the command is appended.
class Args {
 public:
  Args& Add(std::string_view word) {
    words_.push_back(word.data());
    sizes_.push_back(word.size());
    return *this;
  }
  Args& Reserve(std::size_t words) {
    words_.reserve(words);
    sizes_.reserve(words);
    return *this;
  }
  std::size_t size() const { return words_.size(); }

 private:
  friend class Client;
  std::vector<const char*> words_;
  std::vector<std::size_t> sizes_;
};

class Client {
 public:
  // Connects, authenticates and selects the database; `timeout` bounds the connect and every
  // later read and write (see SetTimeout).
  static Result<std::unique_ptr<Client>> Open(const Address& address,
                                              std::chrono::milliseconds timeout);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Queues a command; nothing is sent before Flush or Read.
  void Append(const Args& args);
  // Sends everything queued without reading a reply.
  Status Flush();
  // Sends what is queued, then the next reply in order.
  Result<Reply> Read();
  // Sends what is queued, then reads the next reply through `functions` (hiredis's object
  // callbacks; `privdata` reaches them as the root task's privdata), which keep what they read
  // themselves: nothing is returned and nothing is freed here.
  Status ReadWith(redisReplyObjectFunctions* functions, void* privdata);
  // Append + Read.
  Result<Reply> Call(const Args& args) {
    Append(args);
    return Read();
  }
  // How long one read or write may take (a blocking command needs its block time on top).
  Status SetTimeout(std::chrono::milliseconds timeout);

  bool broken() const { return broken_; }
  const std::string& where() const { return where_; }

 private:
  Client(redisContext* context, std::string where);
  Status Fail(std::string_view what);

  redisContext* context_;
  std::string where_;
  std::chrono::milliseconds timeout_{0};
  bool broken_ = false;
  std::string scratch_;  // Append's formatting buffer
};

using redis::Describe;  // "error \"ERR ...\"", "integer 5", ... for messages
inline bool IsError(const redisReply& r) { return r.type == REDIS_REPLY_ERROR; }
inline std::string_view Text(const redisReply& r) {
  return {r.str == nullptr ? "" : r.str, r.str == nullptr ? 0 : r.len};
}

}  // namespace idem::redis_streams

#endif  // IDEM_CONSUMERS_REDIS_STREAMS_CLIENT_H_
