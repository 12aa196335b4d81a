// Publisher and ReadStream: what tests and benchmarks use to fill and inspect streams.
#include <atomic>
#include <mutex>

#include "consumers/nats/connection.h"
#include "idem/consumers/nats.h"

namespace idem::nats {

struct Publisher::Impl {
  Connection connection;
  // Filled by libnats' PublishAsync error callback (its own thread).
  std::mutex mu;
  std::uint64_t failures = 0;
  std::string first_failure;

  static void OnError(jsCtx*, jsPubAckErr* pae, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    std::lock_guard<std::mutex> lock(self->mu);
    if (self->failures++ == 0) {
      self->first_failure = std::string(natsStatus_GetText(pae->Err)) +
                            (pae->ErrText != nullptr ? std::string(": ") + pae->ErrText : "");
    }
  }
};

Publisher::Publisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Publisher::~Publisher() = default;

Result<std::unique_ptr<Publisher>> Publisher::Open(const std::string& url) {
  auto impl = std::make_unique<Impl>();
  ConnectOptions co;
  co.url = url;
  co.name = "idem-publisher";
  co.max_pending_publishes = 4000;
  co.publish_error_handler = &Impl::OnError;
  co.publish_error_closure = impl.get();
  auto c = Connect(co);
  if (!c) return c.error();
  impl->connection = std::move(*c);
  return std::unique_ptr<Publisher>(new Publisher(std::move(impl)));
}

Status Publisher::EnsureStream(std::string_view name, const std::vector<std::string>& subjects) {
  return nats::EnsureStream(impl_->connection.js.get(), name, subjects);
}

Status Publisher::DeleteStream(std::string_view name) {
  const std::string n(name);
  jsErrCode jerr = static_cast<jsErrCode>(0);
  const natsStatus s = js_DeleteStream(impl_->connection.js.get(), n.c_str(), nullptr, &jerr);
  if (s == NATS_OK || s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) return OkStatus();
  return UnavailableError(ErrorText("nats: delete stream '" + n + "'", s));
}

namespace {

Result<MsgPtr> MakeMessage(std::string_view subject, std::string_view payload,
                           const Headers& headers) {
  const std::string subj(subject);
  natsMsg* raw = nullptr;
  const natsStatus s =
      natsMsg_Create(&raw, subj.c_str(), nullptr, payload.data(), static_cast<int>(payload.size()));
  if (s != NATS_OK) return InvalidArgumentError(ErrorText("nats: message on '" + subj + "'", s));
  MsgPtr msg(raw);
  IDEM_RETURN_IF_ERROR(WriteHeaders(msg.get(), headers));
  return msg;
}

}  // namespace

Result<std::uint64_t> Publisher::Publish(std::string_view subject, std::string_view payload,
                                         const Headers& headers) {
  auto msg = MakeMessage(subject, payload, headers);
  if (!msg) return msg.error();
  jsPubAck* ack = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  const natsStatus s = js_PublishMsg(&ack, impl_->connection.js.get(), msg->get(), nullptr, &jerr);
  if (s != NATS_OK) {
    return UnavailableError(ErrorText("nats: publish to '" + std::string(subject) + "'", s));
  }
  const std::uint64_t seq = ack->Sequence;
  jsPubAck_Destroy(ack);
  return seq;
}

Status Publisher::PublishAsync(std::string_view subject, std::string_view payload,
                               const Headers& headers) {
  auto msg = MakeMessage(subject, payload, headers);
  if (!msg) return msg.error();
  natsMsg* raw = msg->release();
  // On success libnats owns the message and sets `raw` to NULL; on failure it is still ours.
  const natsStatus s = js_PublishMsgAsync(impl_->connection.js.get(), &raw, nullptr);
  natsMsg_Destroy(raw);
  if (s != NATS_OK) {
    return UnavailableError(ErrorText("nats: publish to '" + std::string(subject) + "'", s));
  }
  return OkStatus();
}

Status Publisher::WaitPublished(std::chrono::milliseconds timeout) {
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = std::max<std::int64_t>(timeout.count(), 1);
  const natsStatus s = js_PublishAsyncComplete(impl_->connection.js.get(), &po);
  if (s != NATS_OK) return UnavailableError(ErrorText("nats: waiting for PubAcks", s));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->failures > 0) {
    Status st = UnavailableError("nats: " + std::to_string(impl_->failures) +
                                 " publishes failed; the first: " + impl_->first_failure);
    impl_->failures = 0;
    impl_->first_failure.clear();
    return st;
  }
  return OkStatus();
}

Result<std::vector<StoredMessage>> ReadStream(const std::string& url, std::string_view stream) {
  ConnectOptions co;
  co.url = url;
  co.name = "idem-read-stream";
  auto c = Connect(co);
  if (!c) return c.error();
  const std::string name(stream);
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&si, c->js.get(), name.c_str(), nullptr, &jerr);
  if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
    return NotFoundError("nats: stream '" + name + "' does not exist");
  }
  if (s != NATS_OK) return UnavailableError(ErrorText("nats: stream info '" + name + "'", s));
  const std::uint64_t first = si->State.FirstSeq;
  const std::uint64_t last = si->State.LastSeq;
  const std::uint64_t count = si->State.Msgs;
  jsStreamInfo_Destroy(si);
  std::vector<StoredMessage> out;
  if (count == 0) return out;
  out.reserve(count);
  for (std::uint64_t seq = first; seq <= last; ++seq) {
    natsMsg* raw = nullptr;
    jerr = static_cast<jsErrCode>(0);
    s = js_GetMsg(&raw, c->js.get(), name.c_str(), seq, nullptr, &jerr);
    MsgPtr msg(raw);
    if (s == NATS_NOT_FOUND) continue;  // deleted
    if (s != NATS_OK) {
      return UnavailableError(ErrorText("nats: get " + name + "/" + std::to_string(seq), s));
    }
    StoredMessage m;
    m.subject = natsMsg_GetSubject(msg.get());
    m.sequence = seq;
    m.payload.assign(natsMsg_GetData(msg.get()),
                     static_cast<std::size_t>(natsMsg_GetDataLength(msg.get())));
    m.headers = ReadHeaders(msg.get());
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace idem::nats
