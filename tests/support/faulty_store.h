// FaultyStore: a Store that forwards to another and fails on demand, to test fail-closed paths.
#ifndef IDEM_TESTS_SUPPORT_FAULTY_STORE_H_
#define IDEM_TESTS_SUPPORT_FAULTY_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

#include "idem/store.h"

namespace idem::testing {

class FaultyStore : public Store {
 public:
  enum Op : std::uint32_t {
    kBegin = 1,
    kComplete = 2,
    kRelease = 4,
    kExtend = 8,
    kOperator = 16,  // Get/List/Erase/Stats/Purge
    kSession = 32,
    kVersion = 64,
    kAll = 127,
  };

  explicit FaultyStore(Store& inner) : inner_(inner) {}

  // Every call to an op in `ops` fails with kUnavailable until Heal(). The inner store is not
  // called, so nothing changes.
  void Fail(std::uint32_t ops) { failing_.store(ops); }
  void Heal() {
    failing_.store(0);
    budget_.store(-1);
  }
  // Only the next `n` calls to ops in `ops` fail; then it heals by itself.
  void FailTimes(std::uint32_t ops, std::int64_t n) {
    budget_.store(n);
    failing_.store(ops);
  }
  // From now on a completion whose response is longer than `bytes` is refused with
  // kInvalidArgument, as a store with a response limit refuses it (the log store's is ~64 MiB).
  void RefuseResponsesOver(std::size_t bytes) { max_response_.store(bytes); }
  // How many calls were refused.
  std::uint64_t refused() const { return refused_.load(); }
  // What Broken() says from now on (a store failed for good), or ok again.
  void SetBroken(Status s) {
    std::lock_guard lock(broken_mu_);
    broken_ = std::move(s);
  }
  Status Broken() const override {
    std::lock_guard lock(broken_mu_);
    return broken_;
  }

  std::string_view Name() const override { return "faulty"; }
  Result<BeginAnswer> Begin(const BeginRequest& req) override;
  Result<WriteAnswer> Complete(const CompleteRequest& req) override;
  Result<WriteAnswer> Release(std::string_view scope, std::string_view key, Token token) override;
  Result<WriteAnswer> Extend(std::string_view scope, std::string_view key, Token token,
                             std::chrono::milliseconds lease) override;
  Result<std::optional<Record>> Get(std::string_view scope, std::string_view key) override;
  Result<std::vector<Record>> List(const ListFilter& filter) override;
  Result<bool> Erase(std::string_view scope, std::string_view key) override;
  Result<StoreStats> Stats() override;
  Result<std::uint64_t> Purge() override;
  Result<SessionInfo> OpenSession(const SessionRequest& req) override;
  Result<BeginAnswer> BeginSequenced(const SequencedBeginRequest& req) override;
  Result<WriteAnswer> CompleteSequenced(const SequencedCompleteRequest& req) override;
  Result<WriteAnswer> ReleaseSequenced(std::string_view scope, std::string_view client_id,
                                       std::uint64_t seq, Token token) override;
  Result<SessionInfo> Acknowledge(std::string_view scope, std::string_view client_id,
                                  std::uint64_t ack) override;
  Result<BeginAnswer> BeginVersioned(const VersionedBeginRequest& req) override;
  Result<WriteAnswer> CompleteVersioned(const VersionedCompleteRequest& req) override;
  Result<WriteAnswer> ReleaseVersioned(std::string_view scope, std::string_view entity,
                                       Token token) override;
  Result<std::optional<EntityVersion>> GetVersion(std::string_view scope,
                                                  std::string_view entity) override;

 protected:
  // The store calls are forwarded to.
  Store& inner() const { return inner_; }

 private:
  bool Refuse(Op op);
  Status TooLong(std::string_view response) const;
  Store& inner_;
  std::atomic<std::size_t> max_response_{SIZE_MAX};
  std::atomic<std::uint32_t> failing_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::int64_t> budget_{-1};  // calls left to refuse; -1: no bound
  mutable std::mutex broken_mu_;
  Status broken_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTS_SUPPORT_FAULTY_STORE_H_
