// The memory store: records in per-shard pools of 48-byte slots, found through a per-shard
// open-addressing index; sessions and versioned entities in per-shard hash maps. Every
// decision is core::Decide*; this file only finds, packs and keeps what the machine returns.
#include "idem/stores/memory.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "core/journal.h"
#include "core/machine.h"
#include "core/spin_lock.h"
#include "core/thread_name.h"
#include "stores/memory/blob_pool.h"
#include "stores/memory/engine.h"
#include "stores/memory/key_code.h"
#include "stores/memory/slot_index.h"
#include "stores/memory/slot_pool.h"

namespace idem {
namespace {

using memory_internal::BlobArena;
using memory_internal::DecodeKey;
using memory_internal::EncodeKey;
using memory_internal::IndexHint;
using memory_internal::KeyCode;
using memory_internal::kMaxScopeId;
using memory_internal::kMaxTokenSeq;
using memory_internal::kNoSlot;
using memory_internal::ShardBlobs;
using memory_internal::Slot;
using memory_internal::SlotArena;
using memory_internal::SlotIndex;
using memory_internal::SlotPool;

// Sequenced records have no retention: they stay until acknowledged or until their session
// expires. The machine takes a retention, so they get one longer than any session.
constexpr std::chrono::milliseconds kUntilAcknowledged = std::chrono::hours(24 * 365 * 100);
// The reaper holds a shard lock for at most this many slots at a time.
constexpr std::uint32_t kReapSlice = 1024;
constexpr std::size_t kReapMinPerTick = std::size_t{1} << 16;
// A batch holds the locks of at most this many requests' shards at a time.
constexpr std::size_t kBatchChunk = 64;
constexpr std::uint32_t kNoScope = 0xFFFFFFFF;
constexpr std::size_t kMaxShards = std::size_t{1} << 16;
// The longest key a record can hold: a long key lives in the record's blob with a 16-bit
// length (BlobHeader). Replayed keys were validated when they were first stored, under
// whatever limit was then in force; recovery accepts any key a store can hold.
constexpr std::size_t kMaxStoredKeyBytes = std::numeric_limits<std::uint16_t>::max();

using core::SpinLock;

// Secret per process, so that keys cannot be chosen to collide (absl::Hash does the same).
struct HashSeeds {
  std::uint64_t s[4];
};
const HashSeeds& Seeds() {
  static const HashSeeds seeds = [] {
    std::random_device rd;
    HashSeeds h;
    for (auto& v : h.s) v = (std::uint64_t{rd()} << 32) ^ rd() ^ 0x9E3779B97F4A7C15u;
    return h;
  }();
  return seeds;
}

// The high and low halves of the 128-bit product, folded (wyhash's mix).
std::uint64_t Mix(std::uint64_t a, std::uint64_t b) {
  __extension__ using U128 = unsigned __int128;
  const U128 r = static_cast<U128>(a) * b;
  return static_cast<std::uint64_t>(r) ^ static_cast<std::uint64_t>(r >> 64);
}

std::uint64_t HashRecord(const KeyCode& code, std::uint64_t scope_hash) {
  const HashSeeds& seeds = Seeds();
  const std::uint64_t h = Mix(code.w[0] ^ seeds.s[0], code.w[1] ^ seeds.s[1]);
  return Mix(h ^ seeds.s[2] ^ code.form, scope_hash ^ seeds.s[3]);
}

// A fixed (unseeded) hash of bytes, the same in every process.
std::uint64_t FixedHash(std::string_view s, std::uint64_t h) {
  constexpr std::uint64_t k0 = 0xA0761D6478BD642Fu, k1 = 0xE7037ED1A0B428DBu;
  const char* p = s.data();
  std::size_t n = s.size();
  while (n > 16) {
    std::uint64_t a, b;
    std::memcpy(&a, p, 8);
    std::memcpy(&b, p + 8, 8);
    h = Mix(a ^ h ^ k0, b ^ k1);
    p += 16;
    n -= 16;
  }
  std::uint64_t a = 0, b = 0;
  if (n > 0) std::memcpy(&a, p, std::min<std::size_t>(n, 8));  // p may be null when n == 0
  if (n > 8) std::memcpy(&b, p + 8, n - 8);
  return Mix(a ^ h ^ k1, b ^ k0 ^ s.size());
}

// Which shard a record lives in is the same in every process, because a record's token
// carries its shard: a durable store reopens each record into the shard that handed out its
// token. Only load balance depends on this hash; the index's hashes stay seeded per process.
std::uint64_t ShardHash(std::string_view scope, std::string_view key) {
  return FixedHash(key, FixedHash(scope, 0x8BB84B93962EACC9u));
}

// What locates a record: computed once, outside the shard lock.
struct RecordId {
  KeyCode code;
  std::uint64_t scope_hash = 0;
  std::uint64_t hash = 0;
  std::uint64_t shard_hash = 0;
  std::uint32_t tag() const { return static_cast<std::uint32_t>(hash); }
};

std::uint64_t ScopeHash(std::string_view scope) {
  // Most stores use one scope, often the default one.
  if (scope.empty()) return 0x9E3779B97F4A7C15u;
  return absl::HashOf(absl::string_view(scope.data(), scope.size()));
}

// `fixed_shard`: place the record by ShardHash, the same in every process (a journaled
// engine needs that); otherwise by the seeded hash the index uses anyway, which costs nothing
// more (its high bits pick the shard, its low 32 bits are the index tag).
RecordId MakeRecordId(std::string_view scope, std::string_view key, bool fixed_shard) {
  RecordId id;
  id.code = EncodeKey(key);
  id.scope_hash = ScopeHash(scope);
  id.hash = HashRecord(id.code, id.scope_hash);
  id.shard_hash = fixed_shard ? ShardHash(scope, key) : id.hash;
  return id;
}

// Sessions and entities are named by (scope, name); scope is at most 255 bytes, so a length
// byte makes the concatenation unambiguous.
std::string CompositeKey(std::string_view scope, std::string_view name) {
  std::string k;
  k.reserve(1 + scope.size() + name.size());
  k.push_back(static_cast<char>(scope.size()));
  k.append(scope);
  k.append(name);
  return k;
}

// A record's out-of-line bytes: header, long key, fingerprint, response.
struct BlobHeader {
  std::uint32_t response_size;
  std::uint16_t key_size;  // hence kMaxStoredKeyBytes
  std::uint8_t has_fingerprint;
  std::uint8_t unused;
};

struct BlobView {
  std::string_view key;
  std::optional<Fingerprint> fingerprint;
  std::string_view response;
};

std::size_t BlobSize(const BlobHeader& h) {
  return sizeof(BlobHeader) + h.key_size + (h.has_fingerprint ? sizeof(Fingerprint) : 0) +
         h.response_size;
}

struct SeqRecord {
  core::RecordHead head;
  std::optional<Fingerprint> fingerprint;
  std::string response;
};

struct Session {
  std::string scope;
  std::string client_id;
  core::SessionHead head;
  absl::flat_hash_map<std::uint64_t, SeqRecord> records;
};

struct Entity {
  std::string scope;
  std::string entity;
  core::EntityHead head;
};

struct ScopeInfo {
  std::string name;
  std::uint64_t hash = 0;
  std::uint32_t refs = 0;  // records holding this id; 0: the id is free
};

SessionInfo MakeSessionInfo(const Session& s) {
  SessionInfo info;
  info.scope = s.scope;
  info.client_id = s.client_id;
  info.low_water = s.head.low_water;
  info.window = s.head.window;
  info.outstanding = static_cast<std::uint32_t>(s.records.size());
  info.expires = s.head.expires;
  return info;
}

// Built in place: the answer is not moved on its way out. (Each kind is spelled out, braced:
// clang 14, which builds the fuzz targets, has no parenthesised aggregate initialisation.)
Result<BeginAnswer> ToAnswer(const core::BeginDecision& d, std::string_view response) {
  switch (d.kind) {
    case core::BeginKind::kAcquired:
      return Result<BeginAnswer>(
          std::in_place, std::in_place_type<Acquired>,
          Acquired{d.next.token, d.next.attempt, d.next.lease_deadline, d.takeover});
    case core::BeginKind::kBusy:
      return Result<BeginAnswer>(std::in_place, std::in_place_type<Busy>,
                                 Busy{d.next.lease_deadline});
    case core::BeginKind::kReplay:
      return Result<BeginAnswer>(std::in_place, std::in_place_type<Replay>,
                                 Replay{d.next.outcome, std::string(response), d.next.attempt});
    case core::BeginKind::kConflict:
      break;
  }
  return Result<BeginAnswer>(std::in_place, std::in_place_type<Conflict>);
}

// One independently locked part of the store. Every member but `hint`/`slots`/`number`/`bits`
// is guarded by `mu`. The first line is the index's hint, read before the lock and written
// only when the index grows. What every call writes shares the second line with the lock, so
// a call moves one line between cores; the third line is read-mostly.
struct alignas(64) Shard {
  IndexHint hint;  // a line of its own (slot_index.h)
  SpinLock mu;
  std::uint32_t in_progress = 0;
  std::uint32_t completed = 0;
  // Invariant: tokens handed out by this shard are (seq << bits) | number for seq up to
  // token_seq, so a key (always in the same shard) only ever sees growing tokens.
  std::uint64_t token_seq = 0;
  SlotIndex index{hint};     // 32 bytes
  SlotPool pool;             // its first 8 bytes end the lock's line
  Slot* slots = nullptr;     // the store's arena: slot id -> record
  std::uint32_t number = 0;  // this shard's index: the low bits of its tokens
  int bits = 0;              // log2 of the shard count
  std::uint32_t last_scope = kNoScope;
  std::vector<ScopeInfo> scopes;
  std::vector<std::uint32_t> free_scopes;
  absl::flat_hash_map<std::string, std::uint32_t> scope_ids;
  ShardBlobs blobs;  // blob_pool.h
  std::size_t blob_bytes = 0;
  absl::flat_hash_map<std::string, Session> sessions;
  absl::flat_hash_map<std::string, Entity> entities;

  Token NextToken() const {
    IDEM_CHECK_MSG(token_seq < kMaxTokenSeq, "memory store shard ran out of tokens");
    return ((token_seq + 1) << bits) | number;
  }
  void TakeToken() { ++token_seq; }

  // ---- scopes: interned per shard, so the common single-scope case is one compare ----

  std::uint32_t FindScope(std::string_view scope) {
    if (last_scope != kNoScope) {
      const std::string& name = scopes[last_scope].name;
      if (name.size() == scope.size() &&
          (scope.empty() || std::memcmp(name.data(), scope.data(), scope.size()) == 0)) {
        return last_scope;
      }
    }
    const auto it = scope_ids.find(absl::string_view(scope.data(), scope.size()));
    if (it == scope_ids.end()) return kNoScope;
    last_scope = it->second;
    return it->second;
  }

  // The scope's id with one more reference, interning it if needed.
  Result<std::uint32_t> RefScope(std::string_view scope, std::uint64_t hash) {
    std::uint32_t id = FindScope(scope);
    if (id == kNoScope) {
      if (!free_scopes.empty()) {
        id = free_scopes.back();
        free_scopes.pop_back();
      } else {
        if (scopes.size() > kMaxScopeId) {
          return ResourceExhaustedError("the memory store holds too many scopes (over " +
                                        std::to_string(kMaxScopeId) + " per shard)");
        }
        id = static_cast<std::uint32_t>(scopes.size());
        scopes.emplace_back();
      }
      scopes[id].name.assign(scope);
      scopes[id].hash = hash;
      scope_ids.emplace(scopes[id].name, id);
      last_scope = id;
    }
    ++scopes[id].refs;
    return id;
  }

  void UnrefScope(std::uint32_t id) {
    if (--scopes[id].refs != 0) return;
    scope_ids.erase(scopes[id].name);
    scopes[id].name.clear();
    scopes[id].name.shrink_to_fit();
    free_scopes.push_back(id);
    if (last_scope == id) last_scope = kNoScope;
  }

  // ---- blobs ----

  BlobView Blob(const Slot& s) const {
    BlobView v;
    if (s.blob() == 0) return v;
    const char* p = blobs.Bytes(s.blob());
    BlobHeader h;
    std::memcpy(&h, p, sizeof(h));
    p += sizeof(h);
    v.key = std::string_view(p, h.key_size);
    p += h.key_size;
    if (h.has_fingerprint) {
      v.fingerprint.emplace();
      std::memcpy(v.fingerprint->bytes.data(), p, sizeof(Fingerprint));
      p += sizeof(Fingerprint);
    }
    v.response = std::string_view(p, h.response_size);
    return v;
  }

  std::string_view Response(const Slot& s) const {
    return s.blob() == 0 ? std::string_view() : Blob(s).response;
  }

  // Replaces the slot's blob (the arguments may point into the old one).
  void SetBlob(Slot& s, std::string_view long_key, const Fingerprint* fp,
               std::string_view response) {
    std::uint32_t id = 0;
    if (!long_key.empty() || fp != nullptr || !response.empty()) {
      IDEM_CHECK_MSG(response.size() <= 0xFFFFFFFFu, "response over 4 GiB");
      BlobHeader h{static_cast<std::uint32_t>(response.size()),
                   static_cast<std::uint16_t>(long_key.size()),
                   static_cast<std::uint8_t>(fp != nullptr ? 1 : 0), 0};
      const std::size_t size = BlobSize(h);
      auto [new_id, p] = blobs.New(size);
      id = new_id;
      std::memcpy(p, &h, sizeof(h));
      p += sizeof(h);
      if (!long_key.empty()) std::memcpy(p, long_key.data(), long_key.size());
      p += long_key.size();
      if (fp != nullptr) {
        std::memcpy(p, fp->bytes.data(), sizeof(Fingerprint));
        p += sizeof(Fingerprint);
      }
      if (!response.empty()) std::memcpy(p, response.data(), response.size());
      blob_bytes += size;
    }
    FreeBlob(s);
    s.set_blob(id);
    s.set_has_fingerprint(fp != nullptr);
  }

  void FreeBlob(Slot& s) {
    const std::uint32_t id = s.blob();
    if (id == 0) return;
    BlobHeader h;
    std::memcpy(&h, blobs.Bytes(id), sizeof(h));
    const std::size_t size = BlobSize(h);
    blob_bytes -= size;
    blobs.Delete(id, size);
    s.set_blob(0);
  }

  // ---- records ----

  std::uint32_t FindSlot(const RecordId& id, std::string_view scope_name, std::string_view key) {
    const std::uint32_t scope = FindScope(scope_name);
    if (scope == kNoScope) return kNoSlot;
    return index.Find(id.tag(), [&](std::uint32_t slot) {
      const Slot& s = slots[slot];
      return s.scope_id() == scope && s.key() == id.code &&
             (!id.code.IsLong() || Blob(s).key == key);
    });
  }

  core::RecordHead Head(const Slot& s) const { return s.head(bits, number); }

  void CountOut(RecordState state) {
    --(state == RecordState::kCompleted ? completed : in_progress);
  }

  // Removes a used slot from the index and the pool.
  void RemoveSlot(SlotArena& arena, std::uint32_t slot_id) {
    Slot& s = slots[slot_id];
    const std::uint32_t scope = s.scope_id();
    index.Erase(static_cast<std::uint32_t>(HashRecord(s.key(), scopes[scope].hash)), slot_id);
    CountOut(s.state());
    FreeBlob(s);
    UnrefScope(scope);
    pool.Free(arena, slot_id);
  }

  Record ToRecord(const Slot& s) const {
    const BlobView blob = Blob(s);
    const core::RecordHead h = Head(s);
    Record r;
    r.scope = scopes[s.scope_id()].name;
    const KeyCode code = s.key();
    r.key = code.IsLong() ? std::string(blob.key) : DecodeKey(code);
    r.state = h.state;
    r.fingerprint = blob.fingerprint;
    r.token = h.token;
    r.attempt = h.attempt;
    r.created = h.created;
    r.lease_deadline = h.lease_deadline;
    r.expires = h.expires;
    r.outcome = h.outcome;
    r.response = std::string(blob.response);
    return r;
  }

  struct ReapStep {
    std::size_t next;  // where to continue; SlotPool::kEnd when the shard is done
    std::uint64_t reclaimed;
  };
  // Reclaims expired records among `count` of the shard's slots, from the `from`-th on in
  // the order SlotPool::ForEach walks them.
  ReapStep ReapSlots(SlotArena& arena, std::size_t from, std::size_t count, Timestamp now) {
    std::uint64_t reclaimed = 0;
    const std::size_t next = pool.ForEach(from, count, [&](std::uint32_t id) {
      const Slot& s = slots[id];
      if (s.used() && !(now < s.expires())) {
        RemoveSlot(arena, id);
        ++reclaimed;
      }
    });
    return {next, reclaimed};
  }

  // Reclaims expired sessions (with their records) and entities; returns how many things.
  std::uint64_t ReapKeyed(Timestamp now) {
    std::uint64_t n = 0;
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (now >= it->second.head.expires) {
        n += 1 + it->second.records.size();
        sessions.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto it = entities.begin(); it != entities.end();) {
      if (now >= it->second.head.expires) {
        ++n;
        entities.erase(it++);
      } else {
        ++it;
      }
    }
    return n;
  }

  std::uint64_t KeyedBytes() const {
    std::uint64_t b = 0;
    for (const auto& [k, s] : sessions) {
      b += 2 * k.size() + sizeof(Session) + 16;
      for (const auto& [seq, r] : s.records) b += sizeof(SeqRecord) + 9 + r.response.size();
    }
    for (const auto& [k, e] : entities) b += 2 * k.size() + sizeof(Entity) + 16;
    return b;
  }
};

// The layout the comment on Shard promises, checked where it is built: an earlier member
// once pushed the pool's words off the lock's line, and only a profile showed it. Shard is
// not standard-layout (offsetof is conditionally supported there; g++ computes it and warns).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(offsetof(Shard, mu) == 64, "the hint fills the first line alone");
static_assert(offsetof(Shard, pool) + 8 <= 128, "the pool's first 8 bytes end the lock's line");
#pragma GCC diagnostic pop

class MemoryStore final : public memory_internal::Engine {
 public:
  MemoryStore(const MemoryStoreOptions& options, core::Journal* journal);
  ~MemoryStore() override;

  std::string_view Name() const override { return "memory"; }

  Result<BeginAnswer> Begin(const BeginRequest& req) override;
  Result<WriteAnswer> Complete(const CompleteRequest& req) override;
  Result<WriteAnswer> Release(std::string_view scope, std::string_view key, Token token) override;
  Result<WriteAnswer> Extend(std::string_view scope, std::string_view key, Token token,
                             std::chrono::milliseconds lease) override;
  std::vector<Result<BeginAnswer>> BeginBatch(std::span<const BeginRequest> reqs) override;
  std::vector<Result<WriteAnswer>> CompleteBatch(std::span<const CompleteRequest> reqs) override;
  std::vector<Result<WriteAnswer>> ExtendBatch(std::span<const ExtendRequest> reqs) override;
  // Without a journal nothing blocks: the answers are ready at once. A journaled engine
  // blocks on durability; the store around it (the log store) starts batches itself.
  bool StartBatch(std::span<const BeginRequest> begins, std::span<const CompleteRequest> completes,
                  std::function<void(BatchAnswers)> done) override {
    if (journal_ != nullptr) return false;
    done(memory_internal::CompleteThenBegin(*this, begins, completes));
    return true;
  }

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

  Status Apply(const core::Change& c) override;
  void RaiseTokenFloor(std::uint64_t floor) override;
  std::uint64_t MaxToken() override;
  Status Snapshot(const std::function<Status(const core::Change&)>& sink) override;

 private:
  // ---- durability: what a journal (when there is one) must hear, and waiting for it ----
  Status Healthy() { return journal_ == nullptr ? OkStatus() : journal_->health(); }
  // The rest run under the shard lock and return the ticket to wait on.
  std::uint64_t Seen() { return journal_ == nullptr ? 0 : journal_->Last(); }
  // Every change of a shard goes to the journal in the shard's lane, which keeps their order.
  std::uint64_t Log(const Shard& sh, const core::Change& c) {
    return journal_ == nullptr ? 0 : journal_->Record(c, sh.number);
  }
  std::uint64_t LogRecord(const Shard& sh, const Slot& s, std::string_view scope,
                          std::string_view key);
  std::uint64_t LogRemoval(const Shard& sh, core::ChangeType type, std::string_view scope,
                           std::string_view name, std::uint64_t seq = 0);
  std::uint64_t LogSession(const Shard& sh, const Session& s);
  std::uint64_t LogSeqRecord(const Shard& sh, const Session& s, std::uint64_t seq,
                             const SeqRecord& r);
  std::uint64_t LogEntity(const Shard& sh, const Entity& e);
  // Runs `decide` under the shard's lock (it sets the ticket of what it changed or read), then
  // gives its answer once that is durable, waiting outside the lock.
  // One object from `decide` to the caller, never moved (answers are variants with strings).
  template <typename T, typename F>
  Result<T> UnderLock(Shard& sh, F decide) {
    std::uint64_t ticket = 0;
    Result<T> answer = [&] {
      std::lock_guard<SpinLock> lock(sh.mu);
      return decide(ticket);
    }();
    MakeDurable(answer, ticket);
    return answer;
  }
  // Leaves `r` as it is once the change behind it (or the state it read) is durable;
  // replaces it with the journal's error otherwise.
  template <typename T>
  void MakeDurable(Result<T>& r, std::uint64_t ticket) {
    if (journal_ == nullptr || ticket == 0) return;
    if (Status st = journal_->Wait(ticket); !st.ok()) r = std::move(st);
  }

  // Before a shard lock, what a change would otherwise do under it, stalling every caller of
  // the shard: fault in the page a new record or blob will use (FaultAhead, address_range.h),
  // make a growing index's next table (IndexHint::PrepareGrowth). By default the caller does it
  // here, where it stalls only this caller. With a preparer (prepare_on_own_thread) the caller
  // asks it, which keeps the arenas kPreparerPagesAhead huge pages ahead, and does the work
  // itself only as the fallback: an arena's next page still not resident when the page in use
  // is nearly full.
  void PrepareIndex(Shard& sh) {
    if (!preparer_.joinable()) {
      sh.hint.PrepareGrowth();
    } else if (sh.hint.WantsSpare()) {
      AskPreparer();
    }
  }
  template <typename Arena>  // SlotArena or BlobArena
  void PrepareArena(Arena& arena) {
    if (preparer_.joinable() && arena.WantsPrefault(kPreparerPagesAhead)) AskPreparer();
    arena.PrefaultNext();
  }
  void PrepareArenas() {
    PrepareArena(arena_);
    PrepareArena(blob_arena_);
  }
  // Wakes the preparer unless it was asked already and has not started since.
  void AskPreparer() {
    if (prepare_asked_.load(std::memory_order_relaxed) ||
        prepare_asked_.exchange(true, std::memory_order_relaxed)) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(prepare_mu_);
      prepare_wanted_ = true;
    }
    prepare_cv_.notify_one();
  }
  void PreparerLoop();
  static constexpr std::size_t kPreparerPagesAhead = 2;

  std::size_t ShardIndex(std::uint64_t hash) const {
    return bits_ == 0 ? 0 : static_cast<std::size_t>(hash >> (64 - bits_));
  }
  Shard& ShardFor(std::uint64_t hash) { return shards_[ShardIndex(hash)]; }

  // Caller holds sh.mu.
  Result<BeginAnswer> BeginLocked(Shard& sh, const RecordId& id, const BeginRequest& req,
                                  Timestamp now, std::uint64_t& ticket);
  WriteAnswer CompleteLocked(Shard& sh, const RecordId& id, const CompleteRequest& req,
                             Timestamp now, std::uint64_t& ticket);
  WriteAnswer ExtendLocked(Shard& sh, const RecordId& id, const ExtendRequest& req, Timestamp now,
                           std::uint64_t& ticket);
  template <typename Req, typename Answer, typename Check, typename Decide>
  std::vector<Result<Answer>> RunBatch(std::span<const Req> reqs, Check check, Decide decide);
  static constexpr std::uint32_t kAnswered = ~std::uint32_t{0};  // OrderByShard: left out
  std::vector<std::uint32_t> OrderByShard(std::span<const std::uint32_t> shard_of) const;

  Status CheckClient(std::string_view scope, std::string_view client_id) const;
  Status CheckEntity(std::string_view scope, std::string_view entity) const;
  static Status UnknownSession(std::string_view scope, std::string_view client_id);

  // Reclaims everything expired in `sh`, one slice of slots per lock hold.
  std::uint64_t ReapShard(Shard& sh);
  void ReaperLoop(std::chrono::milliseconds interval);

  Clock* const clock_;
  core::Journal* const journal_;
  const bool fixed_shards_;  // records placed by ShardHash (see MakeRecordId)
  const std::size_t max_key_bytes_;
  const std::chrono::milliseconds abandoned_retention_;
  int bits_ = 0;
  std::size_t shard_count_ = 1;
  // Declared before the shards: their pools point into the arenas' blocks.
  SlotArena arena_;
  BlobArena blob_arena_;
  std::unique_ptr<Shard[]> shards_;

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  std::atomic<bool> stopping_{false};
  std::thread reaper_;

  std::mutex prepare_mu_;
  std::condition_variable prepare_cv_;
  bool prepare_wanted_ = false;  // guarded by prepare_mu_
  std::atomic<bool> prepare_asked_{false};
  std::thread preparer_;  // prepare_on_own_thread
};

// ---------------------------------------------------------------------------------------------

MemoryStore::MemoryStore(const MemoryStoreOptions& options, core::Journal* journal)
    : clock_(options.clock != nullptr ? options.clock : &Clock::System()),
      journal_(journal),
      fixed_shards_(journal != nullptr),
      // A long key is kept in its record's blob with a 16-bit length.
      max_key_bytes_(std::min<std::size_t>(options.max_key_bytes, kMaxStoredKeyBytes)),
      // NewMemoryStore cannot refuse options: one out of range is brought into it (the log
      // store refuses it at open). Below 0 would end a record before its lease does.
      abandoned_retention_(std::clamp(options.abandoned_retention, std::chrono::milliseconds(0),
                                      core::kMaxDuration)) {
  std::size_t n = options.shards;
  if (n == 0) n = std::max<std::size_t>(64, 4 * std::thread::hardware_concurrency());
  n = std::bit_ceil(std::clamp<std::size_t>(n, 1, kMaxShards));
  shard_count_ = n;
  bits_ = std::countr_zero(n);
  shards_.reset(new Shard[n]);
  for (std::size_t i = 0; i < n; ++i) {
    shards_[i].number = static_cast<std::uint32_t>(i);
    shards_[i].slots = &arena_.at(0);
    shards_[i].blobs.set_arena(&blob_arena_);
    shards_[i].bits = bits_;
  }
  if (options.reclaim_interval.count() > 0) {
    reaper_ = std::thread([this, interval = options.reclaim_interval] {
      core::NameThisThread("idem-reaper");
      ReaperLoop(interval);
    });
  }
  if (options.prepare_on_own_thread) {
    preparer_ = std::thread([this] {
      core::NameThisThread("idem-prepare");
      PreparerLoop();
    });
  }
}

MemoryStore::~MemoryStore() {
  {
    std::lock_guard<std::mutex> lock(reaper_mu_);
    stopping_.store(true, std::memory_order_relaxed);
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  {
    // stopping_ is set: a preparer that has not yet checked it sees it, one that has is waiting.
    std::lock_guard<std::mutex> lock(prepare_mu_);
  }
  prepare_cv_.notify_all();
  if (preparer_.joinable()) preparer_.join();
}

// ---- records ----

Result<BeginAnswer> MemoryStore::Begin(const BeginRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckBegin(req, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const RecordId id = MakeRecordId(req.scope, req.key, fixed_shards_);
  Shard& sh = ShardFor(id.shard_hash);
  // The index line's miss overlaps the clock read and the lock.
  sh.hint.Prefetch(id.tag());
  PrepareIndex(sh);
  PrepareArenas();
  const Timestamp now = clock_->Now();
  return UnderLock<BeginAnswer>(sh, [&](std::uint64_t& ticket) -> Result<BeginAnswer> {
    return BeginLocked(sh, id, req, now, ticket);
  });
}

Result<BeginAnswer> MemoryStore::BeginLocked(Shard& sh, const RecordId& id, const BeginRequest& req,
                                             Timestamp now, std::uint64_t& ticket) {
  const std::uint32_t slot_id = sh.FindSlot(id, req.scope, req.key);
  core::RecordHead current;
  std::optional<Fingerprint> stored_fp;
  if (slot_id != kNoSlot) {
    const Slot& s = sh.slots[slot_id];
    current = sh.Head(s);
    if (s.has_fingerprint()) stored_fp = sh.Blob(s).fingerprint;
  }
  const Fingerprint* request_fp = req.fingerprint ? &*req.fingerprint : nullptr;
  const core::BeginDecision d =
      core::DecideBegin(slot_id == kNoSlot ? nullptr : &current, stored_fp ? &*stored_fp : nullptr,
                        request_fp, req.lease, now, sh.NextToken(), abandoned_retention_);
  if (d.kind != core::BeginKind::kAcquired) {
    ticket = std::max(ticket, Seen());
    return ToAnswer(d, d.kind == core::BeginKind::kReplay ? sh.Response(sh.slots[slot_id])
                                                          : std::string_view());
  }
  const std::string_view long_key = id.code.IsLong() ? req.key : std::string_view();
  if (slot_id == kNoSlot) {
    const Result<std::uint32_t> scope = sh.RefScope(req.scope, id.scope_hash);
    if (!scope.has_value()) return scope.error();
    const std::optional<std::uint32_t> new_id = sh.pool.Allocate(arena_);
    if (!new_id) {
      sh.UnrefScope(*scope);
      return ResourceExhaustedError("the memory store is full");
    }
    Slot& s = sh.slots[*new_id];
    s.set_key(id.code);
    s.set_scope_id(*scope);
    s.set_head(d.next, sh.bits);
    if (!long_key.empty() || request_fp != nullptr) sh.SetBlob(s, long_key, request_fp, {});
    sh.index.Insert(id.tag(), *new_id);
    ticket = std::max(ticket, LogRecord(sh, s, req.scope, req.key));
  } else {
    Slot& s = sh.slots[slot_id];
    if (!d.takeover) {
      // The old record had expired: this is a new record under the same key.
      sh.CountOut(current.state);
      if (s.blob() != 0 || request_fp != nullptr) sh.SetBlob(s, long_key, request_fp, {});
    } else {
      --sh.in_progress;
    }
    s.set_head(d.next, sh.bits);
    ticket = std::max(ticket, LogRecord(sh, s, req.scope, req.key));
  }
  ++sh.in_progress;
  sh.TakeToken();
  return ToAnswer(d, {});
}

Result<WriteAnswer> MemoryStore::Complete(const CompleteRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckComplete(req, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const RecordId id = MakeRecordId(req.scope, req.key, fixed_shards_);
  Shard& sh = ShardFor(id.shard_hash);
  sh.hint.Prefetch(id.tag());
  PrepareArena(blob_arena_);  // a completion stores a response, never a new record
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    return Result<WriteAnswer>(CompleteLocked(sh, id, req, now, ticket));
  });
}

WriteAnswer MemoryStore::CompleteLocked(Shard& sh, const RecordId& id, const CompleteRequest& req,
                                        Timestamp now, std::uint64_t& ticket) {
  const std::uint32_t slot_id = sh.FindSlot(id, req.scope, req.key);
  if (slot_id == kNoSlot) {
    ticket = std::max(ticket, Seen());
    return core::DecideComplete(nullptr, req.token, req.outcome, req.retention, now).answer;
  }
  Slot& s = sh.slots[slot_id];
  const core::RecordHead current = sh.Head(s);
  const core::WriteDecision d =
      core::DecideComplete(&current, req.token, req.outcome, req.retention, now);
  if (d.answer != WriteAnswer::kApplied) {
    ticket = std::max(ticket, Seen());
    return d.answer;
  }
  s.set_head(d.next, sh.bits);
  --sh.in_progress;
  ++sh.completed;
  if (!req.response.empty()) {
    const BlobView blob = sh.Blob(s);
    sh.SetBlob(s, blob.key, blob.fingerprint ? &*blob.fingerprint : nullptr, req.response);
  }
  ticket = std::max(ticket, LogRecord(sh, s, req.scope, req.key));
  return d.answer;
}

Result<WriteAnswer> MemoryStore::Release(std::string_view scope, std::string_view key,
                                         Token token) {
  IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const RecordId id = MakeRecordId(scope, key, fixed_shards_);
  Shard& sh = ShardFor(id.shard_hash);
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    const std::uint32_t slot_id = sh.FindSlot(id, scope, key);
    ticket = Seen();
    if (slot_id == kNoSlot) return core::DecideRelease(nullptr, token, now);
    const core::RecordHead current = sh.Head(sh.slots[slot_id]);
    const WriteAnswer a = core::DecideRelease(&current, token, now);
    if (a == WriteAnswer::kApplied) {
      sh.RemoveSlot(arena_, slot_id);
      ticket = LogRemoval(sh, core::ChangeType::kRecordDelete, scope, key);
    }
    return a;
  });
}

Result<WriteAnswer> MemoryStore::Extend(std::string_view scope, std::string_view key, Token token,
                                        std::chrono::milliseconds lease) {
  const ExtendRequest req{.scope = scope, .key = key, .token = token, .lease = lease};
  IDEM_RETURN_IF_ERROR(core::CheckExtend(req, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const RecordId id = MakeRecordId(scope, key, fixed_shards_);
  Shard& sh = ShardFor(id.shard_hash);
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    return Result<WriteAnswer>(ExtendLocked(sh, id, req, now, ticket));
  });
}

WriteAnswer MemoryStore::ExtendLocked(Shard& sh, const RecordId& id, const ExtendRequest& req,
                                      Timestamp now, std::uint64_t& ticket) {
  const std::uint32_t slot_id = sh.FindSlot(id, req.scope, req.key);
  ticket = Seen();
  if (slot_id == kNoSlot) {
    return core::DecideExtend(nullptr, req.token, req.lease, now, abandoned_retention_).answer;
  }
  Slot& s = sh.slots[slot_id];
  const core::RecordHead current = sh.Head(s);
  const core::WriteDecision d =
      core::DecideExtend(&current, req.token, req.lease, now, abandoned_retention_);
  if (d.answer == WriteAnswer::kApplied) {
    s.set_head(d.next, sh.bits);
    ticket = LogRecord(sh, s, req.scope, req.key);
  }
  return d.answer;
}

// Request indices grouped by shard in shard order (which is address order, the locking order
// of batches), each shard's in request order; requests marked kAnswered are left out.
std::vector<std::uint32_t> MemoryStore::OrderByShard(
    std::span<const std::uint32_t> shard_of) const {
  std::vector<std::uint32_t> order;
  order.reserve(shard_of.size());
  if (shard_count_ <= 4 * shard_of.size() + 64) {
    // A counting sort: starts[s + 1] counts shard s's requests, then becomes where its run
    // begins. Several times cheaper than a comparison sort for the default 64 shards.
    std::vector<std::uint32_t> starts(shard_count_ + 1, 0);
    for (std::uint32_t s : shard_of) {
      if (s != kAnswered) ++starts[s + 1];
    }
    for (std::size_t s = 1; s < starts.size(); ++s) starts[s] += starts[s - 1];
    order.resize(starts.back());
    for (std::size_t i = 0; i < shard_of.size(); ++i) {
      if (shard_of[i] != kAnswered) order[starts[shard_of[i]]++] = static_cast<std::uint32_t>(i);
    }
    return order;
  }
  // Many shards and a small batch: sort (shard, index) pairs packed into plain integers.
  std::vector<std::uint64_t> packed;
  packed.reserve(shard_of.size());
  for (std::size_t i = 0; i < shard_of.size(); ++i) {
    if (shard_of[i] != kAnswered) packed.push_back(std::uint64_t{shard_of[i]} << 32 | i);
  }
  std::sort(packed.begin(), packed.end());
  for (std::uint64_t p : packed) order.push_back(static_cast<std::uint32_t>(p));
  return order;
}

// Batches: validate and locate every request first (their key and index misses overlap),
// order them by shard (stably: repeats of a key keep their order), then, a chunk at a time,
// lock the chunk's shards in address order (so batches cannot deadlock), prefetch every
// candidate record, and only then decide, request by request.
template <typename Req, typename Answer, typename Check, typename Decide>
std::vector<Result<Answer>> MemoryStore::RunBatch(std::span<const Req> reqs, Check check,
                                                  Decide decide) {
  std::vector<std::optional<Result<Answer>>> answers(reqs.size());
  if (Status health = Healthy(); !health.ok()) {
    return std::vector<Result<Answer>>(reqs.size(), Result<Answer>(health));
  }
  std::uint64_t ticket = 0;
  std::vector<RecordId> ids(reqs.size());
  std::vector<std::uint32_t> shard_of(reqs.size(), kAnswered);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    Status st = check(reqs[i]);
    if (!st.ok()) {
      answers[i].emplace(std::move(st));
      continue;
    }
    ids[i] = MakeRecordId(reqs[i].scope, reqs[i].key, fixed_shards_);
    shard_of[i] = static_cast<std::uint32_t>(ShardIndex(ids[i].shard_hash));
    shards_[shard_of[i]].hint.Prefetch(ids[i].tag());
    PrepareIndex(shards_[shard_of[i]]);
  }
  PrepareArenas();
  const std::vector<std::uint32_t> order = OrderByShard(shard_of);
  // A chunk at a time, so a huge batch does not hold every shard for long.
  if (journal_ != nullptr) journal_->BeginGroup();
  std::vector<Shard*> locked;
  for (std::size_t begin = 0; begin < order.size(); begin += kBatchChunk) {
    const std::span<const std::uint32_t> chunk(
        order.data() + begin, std::min<std::size_t>(kBatchChunk, order.size() - begin));
    locked.clear();
    for (std::uint32_t i : chunk) {
      Shard* sh = &ShardFor(ids[i].shard_hash);
      if (locked.empty() || locked.back() != sh) {
        sh->mu.lock();
        locked.push_back(sh);
      }
    }
    for (std::uint32_t i : chunk) {
      const std::uint32_t guess = ShardFor(ids[i].shard_hash).index.FirstWithTag(ids[i].tag());
      if (guess != kNoSlot) arena_.Prefetch(guess);
    }
    const Timestamp now = clock_->Now();
    for (std::uint32_t i : chunk) {
      answers[i].emplace(decide(ShardFor(ids[i].shard_hash), ids[i], reqs[i], now, ticket));
    }
    for (Shard* sh : locked) sh->mu.unlock();
  }
  if (journal_ != nullptr) journal_->EndGroup();
  // One wait for the whole batch: its changes share group commits.
  const Status durable = journal_ != nullptr && ticket != 0 ? journal_->Wait(ticket) : OkStatus();
  std::vector<Result<Answer>> out;
  out.reserve(reqs.size());
  for (auto& a : answers) {
    if (!durable.ok() && a->has_value()) {
      out.emplace_back(durable);
    } else {
      out.push_back(std::move(*a));
    }
  }
  return out;
}

std::vector<Result<BeginAnswer>> MemoryStore::BeginBatch(std::span<const BeginRequest> reqs) {
  return RunBatch<BeginRequest, BeginAnswer>(
      reqs, [this](const BeginRequest& r) { return core::CheckBegin(r, max_key_bytes_); },
      [this](Shard& sh, const RecordId& id, const BeginRequest& r, Timestamp now,
             std::uint64_t& ticket) { return BeginLocked(sh, id, r, now, ticket); });
}

std::vector<Result<WriteAnswer>> MemoryStore::CompleteBatch(std::span<const CompleteRequest> reqs) {
  return RunBatch<CompleteRequest, WriteAnswer>(
      reqs, [this](const CompleteRequest& r) { return core::CheckComplete(r, max_key_bytes_); },
      [this](Shard& sh, const RecordId& id, const CompleteRequest& r, Timestamp now,
             std::uint64_t& ticket) {
        return Result<WriteAnswer>(CompleteLocked(sh, id, r, now, ticket));
      });
}

std::vector<Result<WriteAnswer>> MemoryStore::ExtendBatch(std::span<const ExtendRequest> reqs) {
  return RunBatch<ExtendRequest, WriteAnswer>(
      reqs, [this](const ExtendRequest& r) { return core::CheckExtend(r, max_key_bytes_); },
      [this](Shard& sh, const RecordId& id, const ExtendRequest& r, Timestamp now,
             std::uint64_t& ticket) {
        return Result<WriteAnswer>(ExtendLocked(sh, id, r, now, ticket));
      });
}

// ---- operator calls ----

Result<std::optional<Record>> MemoryStore::Get(std::string_view scope, std::string_view key) {
  IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const RecordId id = MakeRecordId(scope, key, fixed_shards_);
  Shard& sh = ShardFor(id.shard_hash);
  const Timestamp now = clock_->Now();
  return UnderLock<std::optional<Record>>(
      sh, [&](std::uint64_t& ticket) -> Result<std::optional<Record>> {
        ticket = Seen();
        const std::uint32_t slot_id = sh.FindSlot(id, scope, key);
        if (slot_id == kNoSlot) return std::optional<Record>();
        const Slot& s = sh.slots[slot_id];
        if (!core::IsLive(sh.Head(s), now)) return std::optional<Record>();
        return std::optional<Record>(sh.ToRecord(s));
      });
}

Result<std::vector<Record>> MemoryStore::List(const ListFilter& filter) {
  if (filter.scope) IDEM_RETURN_IF_ERROR(ValidateScope(*filter.scope));
  IDEM_RETURN_IF_ERROR(Healthy());
  std::vector<Record> out;
  const Timestamp now = clock_->Now();
  for (std::size_t i = 0; i < shard_count_ && out.size() < filter.limit; ++i) {
    Shard& sh = shards_[i];
    // Slice by slice, like the reaper, so a big shard is not locked for the whole scan.
    for (std::size_t from = 0; from != SlotPool::kEnd && out.size() < filter.limit;) {
      std::lock_guard<SpinLock> lock(sh.mu);
      std::uint32_t scope = kNoScope;
      if (filter.scope) {
        scope = sh.FindScope(*filter.scope);
        if (scope == kNoScope) break;
      }
      from = sh.pool.ForEach(from, kReapSlice, [&](std::uint32_t id) {
        const Slot& s = sh.slots[id];
        if (out.size() >= filter.limit || !s.used() || (filter.scope && s.scope_id() != scope)) {
          return;
        }
        const core::RecordHead h = sh.Head(s);
        if (!core::IsLive(h, now) || (filter.state && h.state != *filter.state) ||
            (filter.created_before && !(h.created < *filter.created_before))) {
          return;
        }
        out.push_back(sh.ToRecord(s));
      });
    }
  }
  Result<std::vector<Record>> answer(std::move(out));
  MakeDurable(answer, Seen());
  return answer;
}

Result<bool> MemoryStore::Erase(std::string_view scope, std::string_view key) {
  IDEM_RETURN_IF_ERROR(core::CheckRecordId(scope, key, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const RecordId id = MakeRecordId(scope, key, fixed_shards_);
  Shard& sh = ShardFor(id.shard_hash);
  const Timestamp now = clock_->Now();
  return UnderLock<bool>(sh, [&](std::uint64_t& ticket) -> Result<bool> {
    ticket = Seen();
    const std::uint32_t slot_id = sh.FindSlot(id, scope, key);
    if (slot_id == kNoSlot) return false;
    const bool live = core::IsLive(sh.Head(sh.slots[slot_id]), now);
    sh.RemoveSlot(arena_, slot_id);
    ticket = LogRemoval(sh, core::ChangeType::kRecordDelete, scope, key);
    return live;
  });
}

Result<StoreStats> MemoryStore::Stats() {
  IDEM_RETURN_IF_ERROR(Healthy());
  StoreStats st;
  st.bytes = arena_.bytes() + sizeof(Shard) * shard_count_;
  for (std::size_t i = 0; i < shard_count_; ++i) {
    Shard& sh = shards_[i];
    std::lock_guard<SpinLock> lock(sh.mu);
    st.in_progress += sh.in_progress;
    st.completed += sh.completed;
    for (const auto& [k, session] : sh.sessions) {
      for (const auto& [seq, r] : session.records) {
        ++(r.head.state == RecordState::kCompleted ? st.completed : st.in_progress);
      }
    }
    st.sessions += sh.sessions.size();
    st.entities += sh.entities.size();
    st.bytes += sh.index.bytes() + sh.blob_bytes + sh.blobs.table_bytes() +
                sh.scopes.capacity() * sizeof(ScopeInfo) + sh.KeyedBytes();
  }
  return st;
}

std::uint64_t MemoryStore::ReapShard(Shard& sh) {
  std::uint64_t n = 0;
  for (std::size_t from = 0; from != SlotPool::kEnd;) {
    // Each slice takes the lock afresh, so callers of this shard wait one slice at most.
    std::lock_guard<SpinLock> lock(sh.mu);
    const Shard::ReapStep step = sh.ReapSlots(arena_, from, kReapSlice, clock_->Now());
    from = step.next;
    n += step.reclaimed;
  }
  std::lock_guard<SpinLock> lock(sh.mu);
  return n + sh.ReapKeyed(clock_->Now());
}

void MemoryStore::PreparerLoop() {
  std::unique_lock<std::mutex> lock(prepare_mu_);
  while (true) {
    prepare_cv_.wait(lock, [&] { return prepare_wanted_ || stopping_.load(); });
    if (stopping_.load()) return;
    prepare_wanted_ = false;
    lock.unlock();
    // From here on a new need asks again. A full fence: a caller whose need this pass misses
    // sees the flag cleared, and asks.
    prepare_asked_.exchange(false);
    arena_.PrefaultNext(kPreparerPagesAhead);
    blob_arena_.PrefaultNext(kPreparerPagesAhead);
    for (std::size_t i = 0; i < shard_count_; ++i) shards_[i].hint.PrepareGrowth();
    lock.lock();
  }
}

Result<std::uint64_t> MemoryStore::Purge() {
  IDEM_RETURN_IF_ERROR(Healthy());
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < shard_count_; ++i) n += ReapShard(shards_[i]);
  return n;
}

void MemoryStore::ReaperLoop(std::chrono::milliseconds interval) {
  // Where the sweep goes on at the next tick.
  std::size_t shard = 0;
  std::size_t from = 0;
  std::unique_lock<std::mutex> lock(reaper_mu_);
  while (true) {
    // Real time on purpose: the reaper paces itself; what is expired comes from clock_.
    reaper_cv_.wait_for(lock, interval,
                        [this] { return stopping_.load(std::memory_order_relaxed); });
    if (stopping_.load(std::memory_order_relaxed)) return;
    lock.unlock();
    // A tick sweeps a sixteenth of the slots (at least kReapMinPerTick), so a whole pass
    // takes about sixteen intervals whatever the size, at a small, steady cost.
    std::size_t budget = std::max(kReapMinPerTick, arena_.slots() / 16);
    while (budget > 0 && !stopping_.load(std::memory_order_relaxed)) {
      Shard& sh = shards_[shard];
      std::lock_guard<SpinLock> shard_lock(sh.mu);
      if (from == 0) sh.ReapKeyed(clock_->Now());
      from = sh.ReapSlots(arena_, from, kReapSlice, clock_->Now()).next;
      budget -= std::min<std::size_t>(budget, kReapSlice);
      if (from == SlotPool::kEnd) {
        shard = (shard + 1) % shard_count_;
        from = 0;
      }
    }
    lock.lock();
  }
}

// ---- client sessions ----

Status MemoryStore::CheckClient(std::string_view scope, std::string_view client_id) const {
  SessionRequest r;
  r.scope = scope;
  r.client_id = client_id;
  return core::CheckSession(r, max_key_bytes_);
}

Status MemoryStore::UnknownSession(std::string_view scope, std::string_view client_id) {
  return FailedPreconditionError("session '" + std::string(client_id) + "' in scope '" +
                                 std::string(scope) + "' is unknown or expired; register it again");
}

Result<SessionInfo> MemoryStore::OpenSession(const SessionRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckSession(req, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  std::string key = CompositeKey(req.scope, req.client_id);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<SessionInfo>(sh, [&](std::uint64_t& ticket) -> Result<SessionInfo> {
    auto [it, inserted] = sh.sessions.try_emplace(std::move(key));
    Session& s = it->second;
    if (inserted) {
      s.scope.assign(req.scope);
      s.client_id.assign(req.client_id);
    } else if (now >= s.head.expires) {
      // An expired session registered again starts afresh, as if the reaper had taken it.
      s.records.clear();
      s.head = core::SessionHead();
      LogRemoval(sh, core::ChangeType::kSessionDelete, s.scope, s.client_id);
    }
    s.head.window = req.window;
    s.head.ttl = req.ttl;
    s.head.expires = now + req.ttl;
    ticket = LogSession(sh, s);
    return MakeSessionInfo(s);
  });
}

namespace {
void DropThrough(Session& s, std::uint64_t drop_through) {
  if (drop_through == 0) return;
  for (auto it = s.records.begin(); it != s.records.end();) {
    if (it->first <= drop_through) {
      s.records.erase(it++);
    } else {
      ++it;
    }
  }
}
}  // namespace

Result<BeginAnswer> MemoryStore::BeginSequenced(const SequencedBeginRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckSequenced(req, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(req.scope, req.client_id);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  // The session gate and the record decision happen under one lock.
  return UnderLock<BeginAnswer>(sh, [&](std::uint64_t& ticket) -> Result<BeginAnswer> {
    const auto it = sh.sessions.find(key);
    Session* session = it == sh.sessions.end() ? nullptr : &it->second;
    const core::SessionDecision g =
        core::DecideSequenced(session ? &session->head : nullptr, req.seq, req.ack, now);
    switch (g.gate) {
      case core::SessionGate::kUnknown:
        return UnknownSession(req.scope, req.client_id);
      case core::SessionGate::kWindowFull:
        return ResourceExhaustedError("sequence number " + std::to_string(req.seq) +
                                      " is past the session window (low water " +
                                      std::to_string(session->head.low_water) + ", window " +
                                      std::to_string(session->head.window) + ")");
      case core::SessionGate::kStale:
      case core::SessionGate::kProceed:
        break;
    }
    session->head = g.next;
    DropThrough(*session, g.drop_through);
    ticket = LogSession(sh, *session);
    if (g.gate == core::SessionGate::kStale) return BeginAnswer(Stale{});

    const auto rit = session->records.find(req.seq);
    SeqRecord* rec = rit == session->records.end() ? nullptr : &rit->second;
    const Fingerprint* request_fp = req.fingerprint ? &*req.fingerprint : nullptr;
    const core::BeginDecision d = core::DecideBegin(
        rec ? &rec->head : nullptr, rec && rec->fingerprint ? &*rec->fingerprint : nullptr,
        request_fp, req.lease, now, sh.NextToken(), abandoned_retention_);
    if (d.kind == core::BeginKind::kAcquired) {
      sh.TakeToken();
      if (rec == nullptr || !d.takeover) {
        SeqRecord fresh;
        fresh.head = d.next;
        fresh.fingerprint = req.fingerprint;
        rec = &session->records.insert_or_assign(req.seq, std::move(fresh)).first->second;
      } else {
        rec->head = d.next;
      }
      ticket = LogSeqRecord(sh, *session, req.seq, *rec);
      return ToAnswer(d, {});
    }
    return ToAnswer(d, rec != nullptr ? std::string_view(rec->response) : std::string_view());
  });
}

Result<WriteAnswer> MemoryStore::CompleteSequenced(const SequencedCompleteRequest& req) {
  IDEM_RETURN_IF_ERROR(CheckClient(req.scope, req.client_id));
  if (req.seq == 0) return InvalidArgumentError("sequence number 0: numbers start at 1");
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(req.scope, req.client_id);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    const auto it = sh.sessions.find(key);
    if (it == sh.sessions.end() || now >= it->second.head.expires) {
      return UnknownSession(req.scope, req.client_id);
    }
    Session& session = it->second;
    const auto rit = session.records.find(req.seq);
    SeqRecord* rec = rit == session.records.end() ? nullptr : &rit->second;
    const core::WriteDecision d = core::DecideComplete(rec ? &rec->head : nullptr, req.token,
                                                       req.outcome, kUntilAcknowledged, now);
    ticket = Seen();
    if (d.answer == WriteAnswer::kApplied) {
      rec->head = d.next;
      rec->response.assign(req.response);
      session.head.expires = now + session.head.ttl;
      LogSeqRecord(sh, session, req.seq, *rec);
      ticket = LogSession(sh, session);
    }
    return d.answer;
  });
}

Result<WriteAnswer> MemoryStore::ReleaseSequenced(std::string_view scope,
                                                  std::string_view client_id, std::uint64_t seq,
                                                  Token token) {
  IDEM_RETURN_IF_ERROR(CheckClient(scope, client_id));
  if (seq == 0) return InvalidArgumentError("sequence number 0: numbers start at 1");
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(scope, client_id);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    const auto it = sh.sessions.find(key);
    if (it == sh.sessions.end() || now >= it->second.head.expires) {
      return UnknownSession(scope, client_id);
    }
    Session& session = it->second;
    const auto rit = session.records.find(seq);
    const WriteAnswer a =
        core::DecideRelease(rit == session.records.end() ? nullptr : &rit->second.head, token, now);
    ticket = Seen();
    if (a == WriteAnswer::kApplied) {
      session.records.erase(rit);
      session.head.expires = now + session.head.ttl;
      LogRemoval(sh, core::ChangeType::kSeqDelete, scope, client_id, seq);
      ticket = LogSession(sh, session);
    }
    return a;
  });
}

Result<SessionInfo> MemoryStore::Acknowledge(std::string_view scope, std::string_view client_id,
                                             std::uint64_t ack) {
  IDEM_RETURN_IF_ERROR(CheckClient(scope, client_id));
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(scope, client_id);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<SessionInfo>(sh, [&](std::uint64_t& ticket) -> Result<SessionInfo> {
    const auto it = sh.sessions.find(key);
    Session* session = it == sh.sessions.end() ? nullptr : &it->second;
    // The machine's session gate with the first number above the new low water: it raises
    // the low water, refreshes the expiry and says what to drop, exactly as an ack on a Begin
    // does.
    const std::uint64_t probe =
        std::max(ack, session != nullptr ? session->head.low_water : std::uint64_t{0}) + 1;
    const core::SessionDecision g =
        core::DecideSequenced(session ? &session->head : nullptr, probe, ack, now);
    if (g.gate == core::SessionGate::kUnknown) return UnknownSession(scope, client_id);
    session->head = g.next;
    DropThrough(*session, g.drop_through);
    ticket = LogSession(sh, *session);
    return MakeSessionInfo(*session);
  });
}

// ---- versioned entities ----

Status MemoryStore::CheckEntity(std::string_view scope, std::string_view entity) const {
  VersionedBeginRequest r;
  r.scope = scope;
  r.entity = entity;
  r.version = 1;
  return core::CheckVersioned(r, max_key_bytes_);
}

Result<BeginAnswer> MemoryStore::BeginVersioned(const VersionedBeginRequest& req) {
  IDEM_RETURN_IF_ERROR(core::CheckVersioned(req, max_key_bytes_));
  IDEM_RETURN_IF_ERROR(Healthy());
  std::string key = CompositeKey(req.scope, req.entity);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<BeginAnswer>(sh, [&](std::uint64_t& ticket) -> Result<BeginAnswer> {
    auto it = sh.entities.find(key);
    const core::VersionDecision d =
        core::DecideVersioned(it == sh.entities.end() ? nullptr : &it->second.head, req.version,
                              req.lease, now, sh.NextToken(), abandoned_retention_);
    ticket = Seen();
    switch (d.kind) {
      case core::VersionKind::kAcquired:
        sh.TakeToken();
        if (it == sh.entities.end()) {
          it = sh.entities.try_emplace(std::move(key)).first;
          it->second.scope.assign(req.scope);
          it->second.entity.assign(req.entity);
        }
        it->second.head = d.next;
        ticket = LogEntity(sh, it->second);
        return BeginAnswer(
            Acquired{d.next.token, d.next.attempt, d.next.lease_deadline, d.takeover});
      case core::VersionKind::kBusy:
        return BeginAnswer(Busy{d.next.lease_deadline});
      case core::VersionKind::kStale:
        break;
    }
    return BeginAnswer(Stale{});
  });
}

Result<WriteAnswer> MemoryStore::CompleteVersioned(const VersionedCompleteRequest& req) {
  IDEM_RETURN_IF_ERROR(CheckEntity(req.scope, req.entity));
  IDEM_RETURN_IF_ERROR(core::CheckRetention(req.retention));
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(req.scope, req.entity);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    const auto it = sh.entities.find(key);
    const core::EntityWrite w = core::DecideCompleteVersioned(
        it == sh.entities.end() ? nullptr : &it->second.head, req.token, req.retention, now);
    ticket = Seen();
    if (w.answer == WriteAnswer::kApplied) {
      it->second.head = w.next;
      ticket = LogEntity(sh, it->second);
    }
    return w.answer;
  });
}

Result<WriteAnswer> MemoryStore::ReleaseVersioned(std::string_view scope, std::string_view entity,
                                                  Token token) {
  IDEM_RETURN_IF_ERROR(CheckEntity(scope, entity));
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(scope, entity);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<WriteAnswer>(sh, [&](std::uint64_t& ticket) -> Result<WriteAnswer> {
    const auto it = sh.entities.find(key);
    const core::EntityWrite w = core::DecideReleaseVersioned(
        it == sh.entities.end() ? nullptr : &it->second.head, token, now);
    ticket = Seen();
    if (w.answer == WriteAnswer::kApplied) {
      it->second.head = w.next;
      ticket = LogEntity(sh, it->second);
    }
    return w.answer;
  });
}

Result<std::optional<EntityVersion>> MemoryStore::GetVersion(std::string_view scope,
                                                             std::string_view entity) {
  IDEM_RETURN_IF_ERROR(CheckEntity(scope, entity));
  IDEM_RETURN_IF_ERROR(Healthy());
  const std::string key = CompositeKey(scope, entity);
  Shard& sh = ShardFor(absl::HashOf(key));
  const Timestamp now = clock_->Now();
  return UnderLock<std::optional<EntityVersion>>(
      sh, [&](std::uint64_t& ticket) -> Result<std::optional<EntityVersion>> {
        ticket = Seen();
        const auto it = sh.entities.find(key);
        if (it == sh.entities.end() || now >= it->second.head.expires) {
          return std::optional<EntityVersion>();
        }
        const Entity& e = it->second;
        EntityVersion v;
        v.scope = e.scope;
        v.entity = e.entity;
        v.applied = e.head.applied;
        if (e.head.in_progress != 0) v.in_progress = e.head.in_progress;
        v.token = e.head.token;
        v.attempt = e.head.attempt;
        v.lease_deadline = e.head.lease_deadline;
        v.expires = e.head.expires;
        return std::optional<EntityVersion>(std::move(v));
      });
}

// ---- the journal's side ----

std::uint64_t MemoryStore::LogRecord(const Shard& sh, const Slot& s, std::string_view scope,
                                     std::string_view key) {
  if (journal_ == nullptr) return 0;
  core::Change c;
  c.type = core::ChangeType::kRecordPut;
  c.scope = scope;
  c.name = key;
  c.record = sh.Head(s);
  const BlobView blob = sh.Blob(s);
  c.fingerprint = blob.fingerprint;
  c.response = blob.response;
  return Log(sh, c);
}

std::uint64_t MemoryStore::LogRemoval(const Shard& sh, core::ChangeType type,
                                      std::string_view scope, std::string_view name,
                                      std::uint64_t seq) {
  if (journal_ == nullptr) return 0;
  core::Change c;
  c.type = type;
  c.scope = scope;
  c.name = name;
  c.seq = seq;
  return Log(sh, c);
}

// Images of a session, one of its records, and an entity: what the journal hears when they
// change and what a snapshot writes out.
core::Change SessionImage(const Session& s) {
  core::Change c;
  c.type = core::ChangeType::kSessionPut;
  c.scope = s.scope;
  c.name = s.client_id;
  c.session = s.head;
  return c;
}

core::Change SeqRecordImage(const Session& s, std::uint64_t seq, const SeqRecord& r) {
  core::Change c;
  c.type = core::ChangeType::kSeqPut;
  c.scope = s.scope;
  c.name = s.client_id;
  c.seq = seq;
  c.record = r.head;
  c.fingerprint = r.fingerprint;
  c.response = r.response;
  return c;
}

core::Change EntityImage(const Entity& e) {
  core::Change c;
  c.type = core::ChangeType::kEntityPut;
  c.scope = e.scope;
  c.name = e.entity;
  c.entity = e.head;
  return c;
}

std::uint64_t MemoryStore::LogSession(const Shard& sh, const Session& s) {
  return Log(sh, SessionImage(s));
}

std::uint64_t MemoryStore::LogSeqRecord(const Shard& sh, const Session& s, std::uint64_t seq,
                                        const SeqRecord& r) {
  return Log(sh, SeqRecordImage(s, seq, r));
}

std::uint64_t MemoryStore::LogEntity(const Shard& sh, const Entity& e) {
  return Log(sh, EntityImage(e));
}

Status MemoryStore::Apply(const core::Change& c) {
  const Timestamp now = clock_->Now();
  auto corrupt = [&](std::string_view what) {
    return DataLossError("log entry for '" + std::string(c.name) + "' in scope '" +
                         std::string(c.scope) + "': " + std::string(what));
  };
  switch (c.type) {
    case core::ChangeType::kRecordPut:
    case core::ChangeType::kRecordDelete: {
      IDEM_RETURN_IF_ERROR(core::CheckRecordId(c.scope, c.name, kMaxStoredKeyBytes));
      const RecordId id = MakeRecordId(c.scope, c.name, fixed_shards_);
      Shard& sh = ShardFor(id.shard_hash);
      std::lock_guard<SpinLock> lock(sh.mu);
      std::uint32_t slot_id = sh.FindSlot(id, c.scope, c.name);
      if (c.type == core::ChangeType::kRecordDelete || !core::IsLive(c.record, now)) {
        if (slot_id != kNoSlot) sh.RemoveSlot(arena_, slot_id);
        return OkStatus();
      }
      if ((c.record.token & ((Token{1} << sh.bits) - 1)) != sh.number || c.record.token == 0) {
        return corrupt("token " + std::to_string(c.record.token) +
                       " was not handed out by this store's shard for the key");
      }
      if (slot_id == kNoSlot) {
        const Result<std::uint32_t> scope = sh.RefScope(c.scope, id.scope_hash);
        if (!scope.has_value()) return scope.error();
        const std::optional<std::uint32_t> new_id = sh.pool.Allocate(arena_);
        if (!new_id) {
          sh.UnrefScope(*scope);
          return ResourceExhaustedError("the memory store is full");
        }
        slot_id = *new_id;
        Slot& s = sh.slots[slot_id];
        s.set_key(id.code);
        s.set_scope_id(*scope);
        sh.index.Insert(id.tag(), slot_id);
      } else {
        sh.CountOut(sh.slots[slot_id].state());
      }
      Slot& s = sh.slots[slot_id];
      s.set_head(c.record, sh.bits);
      ++(c.record.state == RecordState::kCompleted ? sh.completed : sh.in_progress);
      const std::string_view long_key = id.code.IsLong() ? c.name : std::string_view();
      if (!long_key.empty() || c.fingerprint || !c.response.empty() || s.blob() != 0) {
        sh.SetBlob(s, long_key, c.fingerprint ? &*c.fingerprint : nullptr, c.response);
      }
      sh.token_seq = std::max(sh.token_seq, c.record.token >> sh.bits);
      return OkStatus();
    }
    case core::ChangeType::kSessionPut:
    case core::ChangeType::kSessionDelete:
    case core::ChangeType::kSeqPut:
    case core::ChangeType::kSeqDelete: {
      std::string key = CompositeKey(c.scope, c.name);
      Shard& sh = ShardFor(absl::HashOf(key));
      std::lock_guard<SpinLock> lock(sh.mu);
      auto it = sh.sessions.find(key);
      if (c.type == core::ChangeType::kSessionDelete) {
        if (it != sh.sessions.end()) sh.sessions.erase(it);
        return OkStatus();
      }
      if (c.type == core::ChangeType::kSessionPut) {
        // Applied even if expired by now: a live session's expiry slides forward with each
        // request, so the log holds many images of it and an old one may be expired while a
        // later one is not; dropping the session (and its records) at the old image lost them
        // (the caller reclaims what is still expired once the whole log is applied). Every
        // image is written at `expires - ttl`; an image written when the session we hold had
        // already expired is of a session registered afresh after the reaper took the old one
        // (which it does without a journal entry), so the old records go.
        const Timestamp written = c.session.expires - c.session.ttl;
        if (it != sh.sessions.end() && written >= it->second.head.expires) {
          it->second.records.clear();
        }
        if (it == sh.sessions.end()) {
          it = sh.sessions.try_emplace(std::move(key)).first;
          it->second.scope.assign(c.scope);
          it->second.client_id.assign(c.name);
        }
        it->second.head = c.session;
        DropThrough(it->second, c.session.low_water);
        return OkStatus();
      }
      // The session was deleted (or never registered): its records went with it.
      if (it == sh.sessions.end()) return OkStatus();
      if (c.type == core::ChangeType::kSeqDelete) {
        it->second.records.erase(c.seq);
        return OkStatus();
      }
      SeqRecord r;
      r.head = c.record;
      r.fingerprint = c.fingerprint;
      r.response.assign(c.response);
      it->second.records.insert_or_assign(c.seq, std::move(r));
      sh.token_seq = std::max(sh.token_seq, c.record.token >> sh.bits);
      return OkStatus();
    }
    case core::ChangeType::kEntityPut:
    case core::ChangeType::kEntityDelete: {
      std::string key = CompositeKey(c.scope, c.name);
      Shard& sh = ShardFor(absl::HashOf(key));
      std::lock_guard<SpinLock> lock(sh.mu);
      auto it = sh.entities.find(key);
      if (c.type == core::ChangeType::kEntityDelete || now >= c.entity.expires) {
        if (it != sh.entities.end()) sh.entities.erase(it);
        return OkStatus();
      }
      if (it == sh.entities.end()) {
        it = sh.entities.try_emplace(std::move(key)).first;
        it->second.scope.assign(c.scope);
        it->second.entity.assign(c.name);
      }
      it->second.head = c.entity;
      sh.token_seq = std::max(sh.token_seq, c.entity.token >> sh.bits);
      return OkStatus();
    }
    case core::ChangeType::kTokenFloor:
      RaiseTokenFloor(c.token_floor);
      return OkStatus();
  }
  return corrupt("unknown change type");
}

void MemoryStore::RaiseTokenFloor(std::uint64_t floor) {
  for (std::size_t i = 0; i < shard_count_; ++i) {
    Shard& sh = shards_[i];
    std::lock_guard<SpinLock> lock(sh.mu);
    // NextToken() is ((token_seq + 1) << bits) | number, which is then above the floor.
    sh.token_seq = std::max(sh.token_seq, floor >> bits_);
  }
}

std::uint64_t MemoryStore::MaxToken() {
  std::uint64_t max = 0;
  for (std::size_t i = 0; i < shard_count_; ++i) {
    Shard& sh = shards_[i];
    std::lock_guard<SpinLock> lock(sh.mu);
    max = std::max(max, (sh.token_seq << bits_) | sh.number);
  }
  return max;
}

Status MemoryStore::Snapshot(const std::function<Status(const core::Change&)>& sink) {
  const Timestamp now = clock_->Now();
  // A slice's live records, copied out under the lock into one buffer (no allocation per
  // record): each image's scope, key and response follow each other in `bytes`.
  struct RecordImage {
    core::RecordHead head;
    std::optional<Fingerprint> fingerprint;
    std::uint32_t scope_size;
    std::uint32_t key_size;
    std::uint32_t response_size;
  };
  std::vector<RecordImage> records;
  std::string bytes;
  std::vector<Session> sessions;
  std::vector<Entity> entities;
  for (std::size_t i = 0; i < shard_count_; ++i) {
    Shard& sh = shards_[i];
    // Slots never move, so a slice at a time sees every record that stays; one made or
    // changed meanwhile is in the journal after the snapshot's point anyway.
    for (std::size_t from = 0; from != SlotPool::kEnd;) {
      records.clear();
      bytes.clear();
      {
        std::lock_guard<SpinLock> lock(sh.mu);
        from = sh.pool.ForEach(from, kReapSlice, [&](std::uint32_t id) {
          const Slot& s = sh.slots[id];
          if (!s.used()) return;
          const core::RecordHead head = sh.Head(s);
          if (!core::IsLive(head, now)) return;
          const BlobView blob = sh.Blob(s);
          const std::string& scope = sh.scopes[s.scope_id()].name;
          bytes.append(scope);
          const std::size_t key_at = bytes.size();
          const KeyCode code = s.key();
          if (code.IsLong()) {
            bytes.append(blob.key);
          } else {
            memory_internal::AppendKey(code, &bytes);
          }
          const std::size_t key_size = bytes.size() - key_at;
          bytes.append(blob.response);
          records.push_back({head, blob.fingerprint, static_cast<std::uint32_t>(scope.size()),
                             static_cast<std::uint32_t>(key_size),
                             static_cast<std::uint32_t>(blob.response.size())});
        });
      }
      std::string_view rest = bytes;
      auto take = [&rest](std::size_t n) {
        const std::string_view part = rest.substr(0, n);
        rest.remove_prefix(n);
        return part;
      };
      for (const RecordImage& r : records) {
        core::Change c;
        c.type = core::ChangeType::kRecordPut;
        c.scope = take(r.scope_size);
        c.name = take(r.key_size);
        c.record = r.head;
        c.fingerprint = r.fingerprint;
        c.response = take(r.response_size);
        IDEM_RETURN_IF_ERROR(sink(c));
      }
    }
    sessions.clear();
    entities.clear();
    {
      std::lock_guard<SpinLock> lock(sh.mu);
      for (const auto& [k, s] : sh.sessions) {
        if (now < s.head.expires) sessions.push_back(s);
      }
      for (const auto& [k, e] : sh.entities) {
        if (now < e.head.expires) entities.push_back(e);
      }
    }
    for (const Session& s : sessions) {
      IDEM_RETURN_IF_ERROR(sink(SessionImage(s)));
      for (const auto& [seq, r] : s.records) IDEM_RETURN_IF_ERROR(sink(SeqRecordImage(s, seq, r)));
    }
    for (const Entity& e : entities) IDEM_RETURN_IF_ERROR(sink(EntityImage(e)));
  }
  return OkStatus();
}

}  // namespace

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options) {
  return std::make_unique<MemoryStore>(options, nullptr);
}

namespace memory_internal {
std::unique_ptr<Engine> Engine::Create(const MemoryStoreOptions& options, core::Journal* journal) {
  return std::make_unique<MemoryStore>(options, journal);
}
}  // namespace memory_internal

}  // namespace idem
