#include "idem/record.h"

#include <type_traits>

#include "idem/store.h"

namespace idem {

std::string_view RecordStateName(RecordState s) {
  return s == RecordState::kInProgress ? "in_progress" : "completed";
}

std::string_view OutcomeName(Outcome o) { return o == Outcome::kSuccess ? "success" : "failure"; }

std::string_view WriteAnswerName(WriteAnswer a) {
  return a == WriteAnswer::kApplied ? "applied" : "lease_lost";
}

std::string_view BeginAnswerName(const BeginAnswer& a) {
  return std::visit(
      [](const auto& v) -> std::string_view {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Acquired>) return "acquired";
        if constexpr (std::is_same_v<T, Busy>) return "busy";
        if constexpr (std::is_same_v<T, Replay>) return "replay";
        if constexpr (std::is_same_v<T, Conflict>) return "conflict";
        return "stale";
      },
      a);
}

std::vector<Result<BeginAnswer>> Store::BeginBatch(std::span<const BeginRequest> reqs) {
  std::vector<Result<BeginAnswer>> out;
  out.reserve(reqs.size());
  for (const auto& r : reqs) out.push_back(Begin(r));
  return out;
}

std::vector<Result<WriteAnswer>> Store::CompleteBatch(std::span<const CompleteRequest> reqs) {
  std::vector<Result<WriteAnswer>> out;
  out.reserve(reqs.size());
  for (const auto& r : reqs) out.push_back(Complete(r));
  return out;
}

std::vector<Result<WriteAnswer>> Store::ExtendBatch(std::span<const ExtendRequest> reqs) {
  std::vector<Result<WriteAnswer>> out;
  out.reserve(reqs.size());
  for (const auto& r : reqs) out.push_back(Extend(r.scope, r.key, r.token, r.lease));
  return out;
}

Status Store::Broken() const { return OkStatus(); }

Status Store::Ready() {
  auto probe = Get("idemd.readyz", "probe");
  return probe ? OkStatus() : probe.error();
}

bool Store::StartBatch(std::span<const BeginRequest>, std::span<const CompleteRequest>,
                       std::function<void(BatchAnswers)>) {
  return false;
}

}  // namespace idem
