// The PostgreSQL store's class, shared by the store's calls (postgres_store.cc) and the
// transactional receiver (transactional.cc).
#ifndef IDEM_STORES_POSTGRES_POSTGRES_STORE_H_
#define IDEM_STORES_POSTGRES_POSTGRES_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/stores/postgres.h"
#include "stores/postgres/pool.h"
#include "stores/postgres/schema.h"

namespace idem::pg {

class PostgresStore final : public Store {
 public:
  // Use Open.
  PostgresStore(const PostgresStoreOptions& options, std::vector<Statement> statements);
  ~PostgresStore() override;

  // Connects, checks the schema version and starts the connections and the reaper.
  static Result<std::unique_ptr<Store>> Open(const PostgresStoreOptions& options);

  std::string_view Name() const override { return "postgres"; }
  Status Ready() override;

  Result<BeginAnswer> Begin(const BeginRequest& req) override;
  Result<WriteAnswer> Complete(const CompleteRequest& req) override;
  Result<WriteAnswer> Release(std::string_view scope, std::string_view key, Token token) override;
  Result<WriteAnswer> Extend(std::string_view scope, std::string_view key, Token token,
                             std::chrono::milliseconds lease) override;
  std::vector<Result<BeginAnswer>> BeginBatch(std::span<const BeginRequest> reqs) override;
  std::vector<Result<WriteAnswer>> CompleteBatch(std::span<const CompleteRequest> reqs) override;
  std::vector<Result<WriteAnswer>> ExtendBatch(std::span<const ExtendRequest> reqs) override;

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

  // ---- for transactional mode ----
  Clock& clock() const { return *clock_; }
  const PostgresStoreOptions& options() const { return options_; }
  ConnectionPool& transactions() { return pool_; }

 private:
  // Runs the ops through the group committer.
  void Run(std::span<Op> ops) { group_.Run(ops); }
  // One reaper step over blocks [from, to) of a table: rows reclaimed.
  Result<std::uint64_t> ReapStep(Connection& conn, int table, std::uint64_t from, std::uint64_t to,
                                 Timestamp now, std::size_t limit);
  Result<std::vector<std::uint64_t>> TableBlocks(Connection& conn);
  Result<std::uint64_t> ReapAll(Connection& conn, Timestamp now);
  void ReaperLoop();

  Status CheckClient(std::string_view scope, std::string_view client_id) const;
  Status CheckEntity(std::string_view scope, std::string_view entity) const;

  const PostgresStoreOptions options_;
  Clock* const clock_;
  const std::vector<Statement> statements_;
  ConnectionPool pool_;
  GroupCommitter group_;

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stopping_ = false;  // guarded by reaper_mu_
  std::thread reaper_;
};

// The PostgreSQL store behind `store`, or nullptr when it is another kind.
PostgresStore* AsPostgres(Store& store);

// Token <-> bigint: tokens come from a bigint sequence; a token above its range matches nothing.
inline std::int64_t TokenParam(Token t) { return static_cast<std::int64_t>(t); }
inline std::int64_t Millis(Timestamp t) { return t.time_since_epoch().count(); }
inline std::int64_t Millis(std::chrono::milliseconds d) { return d.count(); }

}  // namespace idem::pg

#endif  // IDEM_STORES_POSTGRES_POSTGRES_STORE_H_
