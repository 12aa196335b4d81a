// What the NATS broker, the publisher and ReadStream share: owning handles for libnats objects,
// connecting with reconnects on, stream creation, header conversion and error text.
#ifndef IDEM_SRC_CONSUMERS_NATS_CONNECTION_H_
#define IDEM_SRC_CONSUMERS_NATS_CONNECTION_H_

#include <nats/nats.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/consumers/nats.h"
#include "idem/status.h"

namespace idem::nats {

struct ConnectionCloser {
  void operator()(natsConnection* c) const { natsConnection_Destroy(c); }
};
struct JetStreamCloser {
  void operator()(jsCtx* js) const { jsCtx_Destroy(js); }
};
struct MsgCloser {
  void operator()(natsMsg* m) const { natsMsg_Destroy(m); }
};
using ConnectionPtr = std::unique_ptr<natsConnection, ConnectionCloser>;
using JetStreamPtr = std::unique_ptr<jsCtx, JetStreamCloser>;
using MsgPtr = std::unique_ptr<natsMsg, MsgCloser>;

// `url` (one or more, comma separated) with passwords and tokens replaced by "***", for
// messages: nats://user:***@host:4222, nats://***@host:4222.
std::string HideSecrets(std::string_view url);

// "what: STATUS_TEXT (libnats' last error of this thread)".
std::string ErrorText(std::string_view what, natsStatus s);

struct ConnectOptions {
  std::string url;  // one or more, comma separated
  std::string name = "idem";
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds reconnect_wait{250};
  // JetStream API calls and synchronous publishes.
  std::chrono::milliseconds request_timeout{5000};
  // Async publishes in flight at most (0: libnats' default).
  int max_pending_publishes = 0;
  jsPubAckErrHandler publish_error_handler = nullptr;
  void* publish_error_closure = nullptr;
};

struct Connection {
  ConnectionPtr conn;
  JetStreamPtr js;  // destroyed before conn (members are destroyed in reverse order)
};

// Connects, retrying until connect_timeout; the connection reconnects forever afterwards.
// kUnavailable naming the URL when no server answered; kInvalidArgument for a bad URL.
Result<Connection> Connect(const ConnectOptions& options);

// Creates stream `name` (file storage) over `subjects` unless it exists. kFailedPrecondition
// when the server refuses it; kUnavailable when JetStream does not answer.
Status EnsureStream(jsCtx* js, std::string_view name, const std::vector<std::string>& subjects);
// The subjects of stream `name`; kFailedPrecondition when it does not exist.
Result<std::vector<std::string>> StreamSubjects(jsCtx* js, std::string_view name);
// ok when stream `name` exists; kFailedPrecondition when not.
inline Status CheckStream(jsCtx* js, std::string_view name) {
  return StreamSubjects(js, name).status();
}

// What the reply subject of a JetStream delivery says, read without allocating:
//   $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>
//   $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<stream seq>...  (newer)
struct AckReply {
  std::string_view stream_sequence;  // decimal digits
  std::uint64_t sequence = 0;        // the same, as a number
  std::uint64_t delivered = 0;
};
// nullopt when `reply` is not such a subject.
std::optional<AckReply> ParseAckReply(std::string_view reply);

// The message's headers (empty when it has none).
Headers ReadHeaders(natsMsg* msg);
// The same into `out`, whose strings keep their storage (a recycled message's).
void ReadHeadersInto(natsMsg* msg, Headers& out);
// Adds `headers` to `msg`; CR and LF in names and values become spaces (they would end the
// header block on the wire). A header with an empty value is left out: libnats 3.4 reads a
// header block holding one as malformed and drops every header of the message.
Status WriteHeaders(natsMsg* msg, const Headers& headers);

}  // namespace idem::nats

#endif  // IDEM_SRC_CONSUMERS_NATS_CONNECTION_H_
