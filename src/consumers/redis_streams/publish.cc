// Publish and ReadStream: small one-connection helpers for tests, benchmarks and tools.
#include <algorithm>
#include <string>

#include "consumers/redis_streams/client.h"
#include "consumers/redis_streams/entries.h"
#include "idem/consumers/redis_streams.h"

namespace idem::redis_streams {
namespace {

constexpr std::chrono::milliseconds kTimeout{10'000};
constexpr std::size_t kPipeline = 512;  // XADDs in flight at once

Result<std::unique_ptr<Client>> OpenUrl(std::string_view url) {
  auto address = ParseAddress(url);
  if (!address) return address.error();
  return Client::Open(*address, kTimeout);
}

Args XAdd(std::string_view stream, std::string_view payload_field, std::string_view payload,
          const Fields& headers) {
  Args args;
  args.Add("XADD").Add(stream).Add("*").Add(payload_field).Add(payload);
  for (const auto& [name, value] : headers) args.Add(name).Add(value);
  return args;
}

Status CheckAdded(const Client& c, std::string_view stream, const redisReply& r) {
  if (r.type == REDIS_REPLY_STRING) return OkStatus();
  return UnavailableError(c.where() + ": XADD " + std::string(stream) + " answered " + Describe(r));
}

}  // namespace

Result<std::string> Publish(std::string_view url, std::string_view stream, std::string_view payload,
                            const Fields& headers, std::string_view payload_field) {
  auto c = OpenUrl(url);
  if (!c) return c.error();
  auto r = (*c)->Call(XAdd(stream, payload_field, payload, headers));
  if (!r) return r.error();
  IDEM_RETURN_IF_ERROR(CheckAdded(**c, stream, **r));
  return std::string(Text(**r));
}

Status Publish(std::string_view url, std::string_view stream, std::span<const StreamEntry> entries,
               std::string_view payload_field) {
  auto c = OpenUrl(url);
  if (!c) return c.error();
  std::size_t sent = 0;
  std::size_t answered = 0;
  while (answered < entries.size()) {
    // Keep up to kPipeline commands in flight: queue more, then read what is answered.
    for (; sent < entries.size() && sent - answered < kPipeline; ++sent) {
      (*c)->Append(XAdd(stream, payload_field, entries[sent].payload, entries[sent].headers));
    }
    const std::size_t until = std::min(entries.size(), answered + kPipeline / 2);
    for (; answered < until; ++answered) {
      auto r = (*c)->Read();
      if (!r) return r.error();
      IDEM_RETURN_IF_ERROR(CheckAdded(**c, stream, **r));
    }
  }
  return OkStatus();
}

Result<std::vector<BrokerMessage>> ReadStream(std::string_view url, std::string_view stream,
                                              std::string_view payload_field) {
  auto c = OpenUrl(url);
  if (!c) return c.error();
  std::vector<BrokerMessage> out;
  std::string from = "-";
  while (true) {
    auto r =
        (*c)->Call(Args().Add("XRANGE").Add(stream).Add(from).Add("+").Add("COUNT").Add("1000"));
    if (!r) return r.error();
    std::vector<ParsedEntry> entries;
    if (IsError(**r)) {
      return UnavailableError((*c)->where() + ": XRANGE " + std::string(stream) + " answered " +
                              Describe(**r));
    }
    IDEM_RETURN_IF_ERROR(ParseEntries(**r, stream, payload_field, entries));
    if (entries.empty()) break;
    from = "(" + entries.back().id.ToString();
    for (ParsedEntry& e : entries) out.push_back(std::move(e.message));
  }
  return out;
}

}  // namespace idem::redis_streams
