#include "tests/support/faulty_store.h"

namespace idem::testing {
namespace {
Status Injected() { return UnavailableError("injected fault: store unreachable"); }
}  // namespace

bool FaultyStore::Refuse(Op op) {
  if ((failing_.load() & op) == 0) return false;
  for (std::int64_t left = budget_.load(); left >= 0;) {
    if (left == 0) {
      failing_.store(0);
      return false;
    }
    if (budget_.compare_exchange_weak(left, left - 1)) break;
  }
  refused_.fetch_add(1);
  return true;
}

#define IDEM_FAULT(op) \
  if (Refuse(op)) return Injected()

Result<BeginAnswer> FaultyStore::Begin(const BeginRequest& req) {
  IDEM_FAULT(kBegin);
  return inner_.Begin(req);
}
Status FaultyStore::TooLong(std::string_view response) const {
  const std::size_t max = max_response_.load();
  if (response.size() <= max) return OkStatus();
  return InvalidArgumentError("response is " + std::to_string(response.size()) +
                              " bytes; this store holds at most " + std::to_string(max));
}

Result<WriteAnswer> FaultyStore::Complete(const CompleteRequest& req) {
  IDEM_FAULT(kComplete);
  IDEM_RETURN_IF_ERROR(TooLong(req.response));
  return inner_.Complete(req);
}
Result<WriteAnswer> FaultyStore::Release(std::string_view scope, std::string_view key,
                                         Token token) {
  IDEM_FAULT(kRelease);
  return inner_.Release(scope, key, token);
}
Result<WriteAnswer> FaultyStore::Extend(std::string_view scope, std::string_view key, Token token,
                                        std::chrono::milliseconds lease) {
  IDEM_FAULT(kExtend);
  return inner_.Extend(scope, key, token, lease);
}
Result<std::optional<Record>> FaultyStore::Get(std::string_view scope, std::string_view key) {
  IDEM_FAULT(kOperator);
  return inner_.Get(scope, key);
}
Result<std::vector<Record>> FaultyStore::List(const ListFilter& filter) {
  IDEM_FAULT(kOperator);
  return inner_.List(filter);
}
Result<bool> FaultyStore::Erase(std::string_view scope, std::string_view key) {
  IDEM_FAULT(kOperator);
  return inner_.Erase(scope, key);
}
Result<StoreStats> FaultyStore::Stats() {
  IDEM_FAULT(kOperator);
  return inner_.Stats();
}
Result<std::uint64_t> FaultyStore::Purge() {
  IDEM_FAULT(kOperator);
  return inner_.Purge();
}
Result<SessionInfo> FaultyStore::OpenSession(const SessionRequest& req) {
  IDEM_FAULT(kSession);
  return inner_.OpenSession(req);
}
Result<BeginAnswer> FaultyStore::BeginSequenced(const SequencedBeginRequest& req) {
  IDEM_FAULT(kSession);
  return inner_.BeginSequenced(req);
}
Result<WriteAnswer> FaultyStore::CompleteSequenced(const SequencedCompleteRequest& req) {
  IDEM_FAULT(kSession);
  IDEM_RETURN_IF_ERROR(TooLong(req.response));
  return inner_.CompleteSequenced(req);
}
Result<WriteAnswer> FaultyStore::ReleaseSequenced(std::string_view scope,
                                                  std::string_view client_id, std::uint64_t seq,
                                                  Token token) {
  IDEM_FAULT(kSession);
  return inner_.ReleaseSequenced(scope, client_id, seq, token);
}
Result<SessionInfo> FaultyStore::Acknowledge(std::string_view scope, std::string_view client_id,
                                             std::uint64_t ack) {
  IDEM_FAULT(kSession);
  return inner_.Acknowledge(scope, client_id, ack);
}
Result<BeginAnswer> FaultyStore::BeginVersioned(const VersionedBeginRequest& req) {
  IDEM_FAULT(kVersion);
  return inner_.BeginVersioned(req);
}
Result<WriteAnswer> FaultyStore::CompleteVersioned(const VersionedCompleteRequest& req) {
  IDEM_FAULT(kVersion);
  return inner_.CompleteVersioned(req);
}
Result<WriteAnswer> FaultyStore::ReleaseVersioned(std::string_view scope, std::string_view entity,
                                                  Token token) {
  IDEM_FAULT(kVersion);
  return inner_.ReleaseVersioned(scope, entity, token);
}
Result<std::optional<EntityVersion>> FaultyStore::GetVersion(std::string_view scope,
                                                             std::string_view entity) {
  IDEM_FAULT(kVersion);
  return inner_.GetVersion(scope, entity);
}

#undef IDEM_FAULT

}  // namespace idem::testing
