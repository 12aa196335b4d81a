// The handler of `idemd consume`: each message is POSTed to a configured URL, with its key and
// attempt number in headers, over one keep-alive HTTP/1.1 connection per consumer thread.
//
//   2xx                          -> kSuccess, the response "STATUS BODY" is stored
//   a permanent status (config)  -> kPermanent: dead-lettered at once
//   anything else, or no answer
//   within handler_timeout       -> kRetryable
//
// The verdict is the status line's: a body over 1 MiB, or one cut short, is not read (the
// response keeps the status only) and the connection is closed instead of reused. A request is
// sent a second time only when a reused connection failed before any answer came.
//
// Not thread-safe: one per consumer thread. Boost.Beast is confined to http_handler.cc.
#ifndef IDEM_CONSUME_HTTP_HANDLER_H_
#define IDEM_CONSUME_HTTP_HANDLER_H_

#include <memory>

#include "consume/config.h"
#include "idem/consumer.h"
#include "idem/status.h"

namespace idem::consume {

class HttpHandler {
 public:
  // kInvalidArgument when the URL is not http://host[:port]/path or the host does not resolve.
  static Result<std::unique_ptr<HttpHandler>> Open(const ConsumerConfig& config);
  ~HttpHandler();
  HttpHandler(const HttpHandler&) = delete;
  HttpHandler& operator=(const HttpHandler&) = delete;

  HandlerVerdict Handle(const HandlerContext& context, const BrokerMessage& message);

 private:
  struct Impl;
  explicit HttpHandler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::consume

#endif  // IDEM_CONSUME_HTTP_HANDLER_H_
