// Memory-store specifics: the compact encoding, the reaper, sharding and counters. The
// generic behaviour is in src/stores/store_contract_suite.cc.
#include "idem/stores/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "stores/memory/address_range.h"
#include "stores/memory/blob_pool.h"
#include "stores/memory/key_code.h"
#include "stores/memory/slot_index.h"
#include "tests/support/fake_clock.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using testing::FakeClock;

// prefix + n. (Not `"literal" + std::to_string(n)`: g++ 12 at -O3 warns about it falsely.)
std::string Numbered(std::string_view prefix, std::uint64_t n) {
  std::string s(prefix);
  s += std::to_string(n);
  return s;
}

Fingerprint Fp(std::uint8_t seed) {
  Fingerprint f;
  for (std::size_t i = 0; i < f.bytes.size(); ++i) {
    f.bytes[i] = static_cast<std::uint8_t>(seed + i);
  }
  return f;
}

class MemoryStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<Store> Make(std::size_t shards = 0, milliseconds reclaim = milliseconds(0)) {
    MemoryStoreOptions o;
    o.clock = &clock_;
    o.shards = shards;
    o.reclaim_interval = reclaim;
    return NewMemoryStore(o);
  }

  Token MustAcquire(Store& s, std::string_view scope, std::string_view key,
                    std::optional<Fingerprint> fp = std::nullopt) {
    BeginRequest r;
    r.scope = scope;
    r.key = key;
    r.fingerprint = fp;
    Result<BeginAnswer> a = s.Begin(r);
    EXPECT_TRUE(a.has_value()) << a.status().ToString();
    if (!a.has_value() || !std::holds_alternative<Acquired>(*a)) {
      ADD_FAILURE() << "not acquired: " << (a.has_value() ? BeginAnswerName(*a) : "error");
      return 0;
    }
    return std::get<Acquired>(*a).token;
  }

  void MustComplete(Store& s, std::string_view scope, std::string_view key, Token token,
                    std::string_view response = {}, milliseconds retention = milliseconds(60000)) {
    CompleteRequest c;
    c.scope = scope;
    c.key = key;
    c.token = token;
    c.response = response;
    c.retention = retention;
    Result<WriteAnswer> w = s.Complete(c);
    ASSERT_TRUE(w.has_value()) << w.status().ToString();
    EXPECT_EQ(*w, WriteAnswer::kApplied);
  }

  void BatchesAnswerInRequestOrder(Store& store);

  FakeClock clock_;
};

// ---- the compact encoding ----

TEST(KeyCodeTest, RoundTripsEveryPackedForm) {
  using memory_internal::DecodeKey;
  using memory_internal::EncodeKey;
  const std::vector<std::string> keys = {
      "a",
      "abc",
      std::string("\0a\0", 3),
      "0123456789abcdef",                  // 16: raw
      "0123456789abcdef0",                 // 17: lowercase hex, odd
      "0123456789abcdef0123456789abcdef",  // 32: lowercase hex
      "0123456789ABCDEF0123456789ABCDEF",  // 32: uppercase hex
      "0123456789ABCDEF012",               // 19: uppercase hex, odd
      "01234567890123456789",              // digits only: lowercase form
  };
  for (const std::string& k : keys) {
    const memory_internal::KeyCode code = EncodeKey(k);
    EXPECT_FALSE(code.IsLong()) << k;
    EXPECT_EQ(DecodeKey(code), k);
  }
  EXPECT_NE(EncodeKey("0123456789abcdef0123456789abcdef"),
            EncodeKey("0123456789ABCDEF0123456789ABCDEF"));
  EXPECT_NE(EncodeKey("0123456789abcdef0"), EncodeKey("0123456789abcdef00"));
  EXPECT_TRUE(EncodeKey("0123456789abcdef0123456789abcdefa").IsLong());  // 33 chars
  EXPECT_TRUE(EncodeKey("0123456789abcdef0123456789ABCDEF").IsLong());   // mixed case
  EXPECT_TRUE(EncodeKey("0123456789abcdef-").IsLong());                  // not hex
  // The characters next to each hex range, and bytes with the high bit set.
  for (char c : {'/', ':', '@', 'G', '`', 'g', '\x80', '\xb0', '\xff'}) {
    std::string k(20, 'a');
    k[7] = c;
    EXPECT_TRUE(EncodeKey(k).IsLong()) << static_cast<int>(c);
  }
}

TEST_F(MemoryStoreTest, KeysOfEveryFormRoundTripThroughGet) {
  auto store = Make();
  std::vector<std::string> keys = {
      "k",
      "order-42",
      "0123456789abcdef",
      "0123456789abcdef0123456789abcdef",
      "0123456789ABCDEF0123456789ABCDEF",
      "0123456789abcdef0123456789ABCDEF",
      "0123456789abcdef0123456789abc",
      "0123456789abcdef0123456789abcdef0",
      std::string("nul\0in\0the\0middle", 17),
      std::string("\0", 1),
      std::string(16, '\0'),
      std::string(40, '\0'),
      std::string(255, 'x'),
      std::string(255, '\xff'),
      "an ordinary key that is longer than sixteen bytes",
  };
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const Token t = MustAcquire(*store, "scope", keys[i]);
    MustComplete(*store, "scope", keys[i], t, Numbered("response ", i));
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    Result<std::optional<Record>> r = store->Get("scope", keys[i]);
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->has_value()) << i;
    EXPECT_EQ((*r)->key, keys[i]) << i;
    EXPECT_EQ((*r)->scope, "scope");
    EXPECT_EQ((*r)->state, RecordState::kCompleted);
    EXPECT_EQ((*r)->response, Numbered("response ", i));
  }
  Result<std::vector<Record>> all = store->List({});
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->size(), keys.size());
  // Case matters: the lowercase and uppercase hex keys are different records.
  EXPECT_FALSE(store->Get("scope", "0123456789abcdef0123456789abcdeF")->has_value());
}

// A long key lives in its record's blob with a 16-bit length: a larger max_key_bytes is capped
// there, and a key over it is refused like any key over the limit (it used to overflow).
TEST_F(MemoryStoreTest, KeysAreLimitedTo65535BytesWhateverTheOption) {
  MemoryStoreOptions o;
  o.clock = &clock_;
  o.reclaim_interval = milliseconds(0);
  o.max_key_bytes = 1 << 20;
  auto store = NewMemoryStore(o);
  const std::string longest(65535, 'k');
  MustComplete(*store, "s", longest, MustAcquire(*store, "s", longest), "r");
  auto got = store->Get("s", longest);
  ASSERT_TRUE(got && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->key, longest);
  auto over = store->Begin({"s", std::string(65536, 'k'), std::nullopt, milliseconds(1000)});
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), StatusCode::kInvalidArgument);
}

TEST_F(MemoryStoreTest, FingerprintResponseAndEveryFieldRoundTrip) {
  auto store = Make();
  const std::string key(200, 'q');
  const Token t = MustAcquire(*store, "tenant/a", key, Fp(7));
  const Timestamp started = clock_.Now();
  clock_.Advance(milliseconds(5));
  const std::string response(100'000, 'r');
  CompleteRequest c;
  c.scope = "tenant/a";
  c.key = key;
  c.token = t;
  c.outcome = Outcome::kFailure;
  c.response = response;
  c.retention = milliseconds(9000);
  ASSERT_EQ(*store->Complete(c), WriteAnswer::kApplied);

  const std::optional<Record> r = *store->Get("tenant/a", key);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->scope, "tenant/a");
  EXPECT_EQ(r->key, key);
  EXPECT_EQ(r->state, RecordState::kCompleted);
  ASSERT_TRUE(r->fingerprint.has_value());
  EXPECT_EQ(*r->fingerprint, Fp(7));
  EXPECT_EQ(r->token, t);
  EXPECT_EQ(r->attempt, 1u);
  EXPECT_EQ(r->created, started);
  EXPECT_EQ(r->lease_deadline, started + milliseconds(30'000));
  EXPECT_EQ(r->expires, clock_.Now() + milliseconds(9000));
  EXPECT_EQ(r->outcome, Outcome::kFailure);
  EXPECT_EQ(r->response, response);

  BeginRequest again;
  again.scope = "tenant/a";
  again.key = key;
  again.fingerprint = Fp(7);
  const BeginAnswer replay = *store->Begin(again);
  ASSERT_TRUE(std::holds_alternative<Replay>(replay));
  EXPECT_EQ(std::get<Replay>(replay).response, response);
  EXPECT_EQ(std::get<Replay>(replay).outcome, Outcome::kFailure);
  again.fingerprint = Fp(8);
  EXPECT_TRUE(std::holds_alternative<Conflict>(*store->Begin(again)));
}

// Blobs of every pooled size, allocated and freed at random across several runs: no live
// block is overwritten by another, and a freed block is what the next one of its size gets.
TEST(BlobPoolTest, BlocksNeverOverlapAndFreedOnesAreReused) {
  using memory_internal::BlobArena;
  using memory_internal::BlobPool;
  BlobArena arena;
  BlobPool pool;
  std::mt19937 rng(11);
  std::map<std::uint32_t, std::string> live;  // grain -> what was written there
  std::size_t written = 0;
  for (int step = 0; step < 40'000; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      ASSERT_EQ(std::string_view(arena.at(it->first), it->second.size()), it->second);
      const std::size_t size = it->second.size();
      const std::uint32_t grain = it->first;
      pool.Free(arena, grain, size);
      live.erase(it);
      // The next block of the same size is the one just freed.
      const std::optional<std::uint32_t> again = pool.Allocate(arena, size);
      ASSERT_TRUE(again.has_value());
      EXPECT_EQ(*again, grain);
      pool.Free(arena, *again, size);
      continue;
    }
    const std::size_t size = 1 + rng() % BlobPool::kMaxBytes;
    const std::optional<std::uint32_t> grain = pool.Allocate(arena, size);
    ASSERT_TRUE(grain.has_value());
    ASSERT_NE(*grain, 0u);
    ASSERT_EQ(*grain & memory_internal::ShardBlobs::kNotPooled, 0u);
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    std::memcpy(arena.at(*grain), bytes.data(), size);
    written += size;
    ASSERT_TRUE(live.emplace(*grain, std::move(bytes)).second) << "grain handed out twice";
  }
  EXPECT_GT(written, std::size_t{4} * BlobArena::kRunGrains * BlobArena::kGrain);  // several runs
  std::uint32_t end = 0;
  for (const auto& [grain, bytes] : live) {
    EXPECT_GE(grain, end) << "blocks overlap";
    end = grain +
          static_cast<std::uint32_t>((bytes.size() + BlobArena::kGrain - 1) / BlobArena::kGrain);
    EXPECT_EQ(std::string_view(arena.at(grain), bytes.size()), bytes);
  }
}

// The next index table is made outside the lock once the current one is 70% full, and the
// growth under the lock takes it. First in one thread, where it is deterministic: every growth
// of a table large enough to be a mapping of its own (from 4096 entries) takes the spare made
// before it, and the spare counts in bytes(). Then with another thread asking for spares all
// along, as callers do before they lock a shard: every entry stays findable (and TSan watches).
TEST(SlotIndexTest, SpareTableMadeOutsideTheLockIsTheOneGrowthTakes) {
  using memory_internal::IndexHint;
  using memory_internal::kNoSlot;
  using memory_internal::SlotIndex;
  const auto tag_of = [](std::uint32_t i) { return i * 2654435761u; };
  constexpr std::uint32_t kEntries = 200'000;

  IndexHint alone_hint;
  SlotIndex alone(alone_hint);
  std::size_t spares_counted = 0;
  for (std::uint32_t i = 0; i < kEntries; ++i) {
    const std::size_t before = alone.bytes();
    alone.Insert(tag_of(i), i);
    alone_hint.PrepareGrowth();
    if (alone.bytes() == before * 3) ++spares_counted;  // a spare of twice the table's size
  }
  // Spares for the growths from 4096 ... 131072 entries, and one for the next growth (at 80%
  // of 262144), which has not happened: it is still held, and counted.
  EXPECT_EQ(spares_counted, 7u);
  EXPECT_EQ(alone.spares_taken(), 6u) << "a growth did not take the spare made for it";
  EXPECT_EQ(alone.bytes(), 3 * std::size_t{262'144} * sizeof(std::uint64_t));

  IndexHint hint;
  SlotIndex index(hint);
  std::mutex mu;  // the shard lock
  std::atomic<bool> done{false};
  std::thread preparer([&] {
    while (!done.load()) hint.PrepareGrowth();
  });
  for (std::uint32_t i = 0; i < kEntries; ++i) {
    std::lock_guard<std::mutex> lock(mu);
    index.Insert(tag_of(i), i);
  }
  done.store(true);
  preparer.join();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(index.size(), kEntries);
  for (std::uint32_t i = 0; i < kEntries; ++i) {
    ASSERT_EQ(index.Find(tag_of(i), [&](std::uint32_t slot) { return slot == i; }), i);
  }
  EXPECT_EQ(index.Find(tag_of(kEntries), [](std::uint32_t) { return true; }), kNoSlot);
}

// Pages are made resident a huge page ahead of what is in use, never changing what is
// written there, also while other threads ask at the same time.
TEST(FaultAheadTest, PopulatesAheadOfUseWithoutChangingContents) {
  using memory_internal::FaultAhead;
  using memory_internal::kHugePageBytes;
  const memory_internal::AddressRange range =
      memory_internal::ReserveAddressRange(16 * kHugePageBytes, 16 * kHugePageBytes);
  FaultAhead ahead(range);
  ahead.Keep(0);
  ahead.Keep(64 << 10);  // what a store with one run of records or blobs holds
  EXPECT_EQ(ahead.populated(), kHugePageBytes) << "a small user should stay small";
  // Written before the populating call reaches it.
  std::memset(range.base + 3 * kHugePageBytes, 0x5A, 4096);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t used = 0; used < 12 * kHugePageBytes; used += 4096 * (t + 1)) {
        ahead.Keep(used);
      }
    });
  }
  for (auto& t : threads) t.join();
  ahead.Keep(12 * kHugePageBytes);
  EXPECT_GE(ahead.populated(), 13 * kHugePageBytes);
  EXPECT_LE(ahead.populated(), range.bytes);
  // Further ahead on request (the preparer thread's two pages), never past the range.
  EXPECT_TRUE(ahead.Wants(12 * kHugePageBytes, 2));
  ahead.Keep(12 * kHugePageBytes, 2);
  EXPECT_EQ(ahead.populated(), 15 * kHugePageBytes);
  EXPECT_FALSE(ahead.Wants(12 * kHugePageBytes, 2));
  EXPECT_FALSE(ahead.Wants(13 * kHugePageBytes - 1, 1));
  ahead.Keep(15 * kHugePageBytes, 2);
  EXPECT_EQ(ahead.populated(), range.bytes);
  for (std::size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(static_cast<unsigned char>(range.base[3 * kHugePageBytes + i]), 0x5A);
  }
  EXPECT_EQ(range.base[3 * kHugePageBytes + 4096], 0);
  memory_internal::ReleaseAddressRange(range);
}

// Four threads fill one shard with new records, half of them through the batch calls, so its
// index grows through several spare tables made outside the lock while the other threads insert,
// and the record and blob arenas are populated ahead of use past their first 2 MiB: by the
// callers, or by the store's preparer thread racing them. No record is lost or mixed up with
// another.
class MemoryStoreFillTest : public MemoryStoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(MemoryStoreFillTest, ThreadsFillingOneShardThroughItsGrowthsLoseNoRecord) {
  MemoryStoreOptions o;
  o.clock = &clock_;
  o.shards = 1;
  o.reclaim_interval = milliseconds(0);
  o.prepare_on_own_thread = GetParam();
  auto store = NewMemoryStore(o);
  constexpr int kThreads = 4;
  constexpr std::uint64_t kPerThread = 40'000;  // 160 k records: ~7.7 MB of slots
  constexpr std::size_t kBatch = 16;
  const auto key_of = [](int t, std::uint64_t i) {
    return Numbered("k" + std::to_string(t) + "-", i);
  };
  const auto response_of = [](int t, std::uint64_t i) {
    return Numbered("response " + std::to_string(t) + "/", i);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kPerThread; i += kBatch) {
        std::vector<std::string> keys, responses;
        for (std::uint64_t j = i; j < i + kBatch; ++j) {
          keys.push_back(key_of(t, j));
          responses.push_back(response_of(t, j));
        }
        std::vector<BeginRequest> begins(kBatch);
        for (std::size_t j = 0; j < kBatch; ++j) begins[j].key = keys[j];
        std::vector<Result<BeginAnswer>> began;
        if (t % 2 == 0) {
          for (const auto& b : begins) began.push_back(store->Begin(b));
        } else {
          began = store->BeginBatch(begins);
        }
        std::vector<CompleteRequest> completes(kBatch);
        for (std::size_t j = 0; j < kBatch; ++j) {
          ASSERT_TRUE(began[j].has_value()) << began[j].status().ToString();
          ASSERT_TRUE(std::holds_alternative<Acquired>(*began[j])) << keys[j];
          completes[j].key = keys[j];
          completes[j].token = std::get<Acquired>(*began[j]).token;
          completes[j].response = responses[j];
          completes[j].retention = milliseconds(60'000);
        }
        std::vector<Result<WriteAnswer>> done;
        if (t % 2 == 0) {
          for (const auto& c : completes) done.push_back(store->Complete(c));
        } else {
          done = store->CompleteBatch(completes);
        }
        for (const auto& w : done) {
          ASSERT_TRUE(w.has_value()) << w.status().ToString();
          ASSERT_EQ(*w, WriteAnswer::kApplied);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (std::uint64_t i = 0; i < kPerThread; ++i) {
      BeginRequest b;
      const std::string key = key_of(t, i);
      b.key = key;
      const Result<BeginAnswer> a = store->Begin(b);
      ASSERT_TRUE(a.has_value()) << a.status().ToString();
      ASSERT_TRUE(std::holds_alternative<Replay>(*a)) << key;
      ASSERT_EQ(std::get<Replay>(*a).response, response_of(t, i)) << key;
    }
  }
  const Result<StoreStats> stats = store->Stats();
  ASSERT_TRUE(stats.has_value());
  EXPECT_EQ(stats->completed, kThreads * kPerThread);
}

INSTANTIATE_TEST_SUITE_P(Preparation, MemoryStoreFillTest, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "OwnThread" : "Callers"; });

// The names of this process's threads.
std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

// With prepare_on_own_thread the store runs one preparer thread, from its construction to its
// destruction, which does not wait for work it was never given.
TEST_F(MemoryStoreTest, ThePreparerThreadLivesExactlyAsLongAsItsStore) {
  const auto preparers = [] {
    const std::vector<std::string> names = ThreadNames();
    return std::count(names.begin(), names.end(), "idem-prepare");
  };
  // A new thread names itself once it runs: give it a moment.
  const auto eventually = [&](std::ptrdiff_t n) {
    for (int i = 0; i < 500 && preparers() != n; ++i) std::this_thread::sleep_for(milliseconds(10));
    return preparers();
  };
  ASSERT_EQ(preparers(), 0);
  MemoryStoreOptions o;
  o.clock = &clock_;
  o.reclaim_interval = milliseconds(0);
  o.prepare_on_own_thread = true;
  auto store = NewMemoryStore(o);
  EXPECT_EQ(eventually(1), 1);
  const Token t = MustAcquire(*store, "", "k");
  MustComplete(*store, "", "k", t, "r");
  const auto start = std::chrono::steady_clock::now();
  store.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // Joined; the kernel may list an exited thread a moment longer.
  EXPECT_EQ(eventually(0), 0);
  // Without the option (and without a reaper) the store starts no thread at all. Counting every
  // thread does not depend on when a new one would name itself: it is listed once created.
  o.prepare_on_own_thread = false;
  const std::size_t threads_before = ThreadNames().size();
  store = NewMemoryStore(o);
  EXPECT_EQ(ThreadNames().size(), threads_before);
}

// Records whose blobs sit on either side of the pooled limit (key, fingerprint and response
// together), replaced and erased in between, answer with exactly their own bytes.
TEST_F(MemoryStoreTest, ResponsesOfEverySizeReplayExactlyAcrossReuse) {
  auto store = Make(/*shards=*/1);
  const auto response_for = [](std::size_t round, std::size_t size) {
    std::string r(size, '\0');
    for (std::size_t i = 0; i < size; ++i) r[i] = static_cast<char>('a' + (round * 7 + i) % 26);
    return r;
  };
  const auto key_for = [](std::size_t i) {
    // Every third key is too long to pack, so it lives in the blob too.
    return i % 3 == 0 ? Numbered(std::string(120, 'k'), i) : Numbered("key-", i);
  };
  constexpr std::size_t kKeys = 320;
  for (std::size_t round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < kKeys; ++i) {
      const std::optional<Fingerprint> fp =
          i % 2 == 0 ? std::optional<Fingerprint>(Fp(static_cast<std::uint8_t>(i))) : std::nullopt;
      const Token t = MustAcquire(*store, "s", key_for(i), fp);
      MustComplete(*store, "s", key_for(i), t, response_for(round, (i * 37 + round * 11) % 400));
    }
    for (std::size_t i = 0; i < kKeys; ++i) {
      const std::string key = key_for(i);
      BeginRequest b;
      b.scope = "s";
      b.key = key;
      if (i % 2 == 0) b.fingerprint = Fp(static_cast<std::uint8_t>(i));
      const BeginAnswer a = *store->Begin(b);
      ASSERT_TRUE(std::holds_alternative<Replay>(a)) << i;
      EXPECT_EQ(std::get<Replay>(a).response, response_for(round, (i * 37 + round * 11) % 400))
          << "key " << i << " round " << round;
      const std::optional<Record> r = *store->Get("s", key);
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->key, key);
    }
    // Free every blob before the next round reuses their blocks with other sizes.
    for (std::size_t i = 0; i < kKeys; ++i) ASSERT_TRUE(*store->Erase("s", key_for(i)));
  }
}

TEST_F(MemoryStoreTest, ManyScopesKeepTheSameKeyApart) {
  auto store = Make(/*shards=*/4);
  constexpr int kScopes = 500;
  for (int i = 0; i < kScopes; ++i) {
    const std::string scope = Numbered("scope-", i);
    MustComplete(*store, scope, "same-key", MustAcquire(*store, scope, "same-key"),
                 "from " + scope);
  }
  for (int i = 0; i < kScopes; ++i) {
    const std::string scope = Numbered("scope-", i);
    const std::optional<Record> r = *store->Get(scope, "same-key");
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->scope, scope);
    EXPECT_EQ(r->response, "from " + scope);
  }
  ListFilter f;
  f.scope = "scope-7";
  EXPECT_EQ(store->List(f)->size(), 1u);
  // Erasing a scope's last record frees its id; the scope can come back.
  for (int i = 0; i < kScopes; ++i) {
    EXPECT_TRUE(*store->Erase(Numbered("scope-", i), "same-key"));
  }
  EXPECT_EQ(store->List({})->size(), 0u);
  MustAcquire(*store, "scope-3", "same-key");
  EXPECT_EQ(store->Get("scope-3", "same-key")->value().scope, "scope-3");
  EXPECT_FALSE(store->Get("scope-4", "same-key")->has_value());
}

TEST_F(MemoryStoreTest, ReacquiringAnExpiredRecordStartsAfresh) {
  auto store = Make();
  const std::string key(64, 'z');
  const Token t1 = MustAcquire(*store, "", key, Fp(1));
  MustComplete(*store, "", key, t1, "old", milliseconds(100));
  clock_.Advance(milliseconds(200));
  const Token t2 = MustAcquire(*store, "", key, std::nullopt);
  EXPECT_GT(t2, t1);
  const std::optional<Record> r = *store->Get("", key);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->state, RecordState::kInProgress);
  EXPECT_FALSE(r->fingerprint.has_value());
  EXPECT_EQ(r->response, "");
  EXPECT_EQ(r->attempt, 1u);
  const StoreStats st = *store->Stats();
  EXPECT_EQ(st.in_progress, 1u);
  EXPECT_EQ(st.completed, 0u);
}

TEST_F(MemoryStoreTest, TokensGrowPerKeyAcrossReleaseAndTakeover) {
  auto store = Make(/*shards=*/2);
  Token last = 0;
  for (int i = 0; i < 50; ++i) {
    const Token t = MustAcquire(*store, "s", "key");
    EXPECT_GT(t, last);
    last = t;
    ASSERT_EQ(*store->Release("s", "key", t), WriteAnswer::kApplied);
  }
  BeginRequest r;
  r.scope = "s";
  r.key = "key";
  r.lease = milliseconds(10);
  const Acquired first = std::get<Acquired>(*store->Begin(r));
  clock_.Advance(milliseconds(11));
  const Acquired second = std::get<Acquired>(*store->Begin(r));
  EXPECT_GT(second.token, first.token);
  EXPECT_EQ(second.attempt, 2u);
  EXPECT_EQ(*store->Release("s", "key", first.token), WriteAnswer::kLeaseLost);
}

// A record keeps its attempt count in 16 bits: past 65535 takeovers the count stays at 65535,
// and the answer says what the record holds.
TEST_F(MemoryStoreTest, TheAttemptCountStopsAt65535) {
  auto store = Make();
  BeginRequest r;
  r.scope = "s";
  r.key = "stuck";
  r.lease = milliseconds(1);
  std::uint32_t attempt = 0;
  for (std::uint32_t i = 1; i <= 65540; ++i) {
    attempt = std::get<Acquired>(*store->Begin(r)).attempt;
    if (attempt != std::min<std::uint32_t>(i, 65535)) break;
    clock_.Advance(milliseconds(1));
  }
  EXPECT_EQ(attempt, 65535u);
  const Result<std::optional<Record>> got = store->Get("s", "stuck");
  ASSERT_TRUE(got.has_value() && got->has_value());
  EXPECT_EQ((*got)->attempt, 65535u);
}

// NewMemoryStore cannot refuse its options: an abandoned_retention below 0 is held at 0, so an
// abandoned record still lasts as long as its lease.
TEST_F(MemoryStoreTest, ANegativeAbandonedRetentionStillHoldsTheLease) {
  MemoryStoreOptions o;
  o.clock = &clock_;
  o.abandoned_retention = milliseconds(-60'000);
  auto store = NewMemoryStore(o);
  BeginRequest r;
  r.scope = "s";
  r.key = "k";
  r.lease = milliseconds(1000);
  ASSERT_TRUE(std::holds_alternative<Acquired>(*store->Begin(r)));
  clock_.Advance(milliseconds(999));
  EXPECT_TRUE(std::holds_alternative<Busy>(*store->Begin(r)));
  clock_.Advance(milliseconds(1));
  EXPECT_TRUE(std::holds_alternative<Acquired>(*store->Begin(r)));
}

TEST_F(MemoryStoreTest, ShardCountsAreRoundedAndAllWork) {
  for (std::size_t shards : {1u, 3u, 7u, 64u}) {
    auto store = Make(shards);
    for (int i = 0; i < 2000; ++i) {
      const std::string key = Numbered("k", i);
      MustComplete(*store, "", key, MustAcquire(*store, "", key));
    }
    EXPECT_EQ(store->Stats()->completed, 2000u) << shards;
    for (int i = 0; i < 2000; i += 2) {
      EXPECT_TRUE(*store->Erase("", Numbered("k", i)));
    }
    for (int i = 0; i < 2000; ++i) {
      EXPECT_EQ(store->Get("", Numbered("k", i))->has_value(), i % 2 == 1) << i;
    }
  }
}

// ---- batches ----

// Batches put their requests in shard order two ways (a counting sort when the shards are
// few next to the batch, a comparison sort when they are many): both answer alike.
TEST_F(MemoryStoreTest, BatchesAnswerInRequestOrder) {
  for (std::size_t shards : {std::size_t{8}, std::size_t{1} << 16}) {
    SCOPED_TRACE(shards);
    BatchesAnswerInRequestOrder(*Make(shards));
  }
}

void MemoryStoreTest::BatchesAnswerInRequestOrder(Store& store) {
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back(Numbered("batch-", i));
  std::vector<BeginRequest> reqs;
  for (const auto& k : keys) {
    BeginRequest r;
    r.key = k;
    reqs.push_back(r);
  }
  reqs.push_back(reqs[10]);        // a repeat: Busy, after the first Acquired
  reqs.push_back(BeginRequest{});  // empty key: kInvalidArgument in its place
  const std::vector<Result<BeginAnswer>> answers = store.BeginBatch(reqs);
  ASSERT_EQ(answers.size(), reqs.size());
  std::vector<CompleteRequest> completes;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(answers[i].has_value());
    ASSERT_TRUE(std::holds_alternative<Acquired>(*answers[i])) << i;
    CompleteRequest c;
    c.key = keys[i];
    c.token = std::get<Acquired>(*answers[i]).token;
    c.response = keys[i];
    completes.push_back(c);
  }
  EXPECT_TRUE(std::holds_alternative<Busy>(*answers[100]));
  EXPECT_EQ(answers[101].status().code(), StatusCode::kInvalidArgument);
  completes[5].token += 1;  // not the current token
  const std::vector<Result<WriteAnswer>> written = store.CompleteBatch(completes);
  for (std::size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ(*written[i], i == 5 ? WriteAnswer::kLeaseLost : WriteAnswer::kApplied) << i;
  }
  EXPECT_EQ(store.Get("", "batch-42")->value().response, "batch-42");
}

// ---- concurrency ----

TEST_F(MemoryStoreTest, ConcurrentBeginsAcquireEachKeyExactlyOnce) {
  auto store = Make(/*shards=*/16);
  constexpr int kThreads = 8;
  constexpr int kKeys = 1000;
  std::vector<std::atomic<int>> acquired(kKeys);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < kKeys; ++n) {
        const int i = (n * 7 + t * 131) % kKeys;  // each thread walks the keys differently
        const std::string key = Numbered("key-", i);
        BeginRequest r;
        r.key = key;
        const Result<BeginAnswer> a = store->Begin(r);
        if (!a.has_value()) {
          errors.fetch_add(1);
        } else if (std::holds_alternative<Acquired>(*a)) {
          acquired[i].fetch_add(1);
        } else if (!std::holds_alternative<Busy>(*a)) {
          errors.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  for (int i = 0; i < kKeys; ++i) EXPECT_EQ(acquired[i].load(), 1) << i;
  EXPECT_EQ(store->Stats()->in_progress, static_cast<std::uint64_t>(kKeys));
}

// ---- reclaiming ----

TEST_F(MemoryStoreTest, PurgeCountsAndStatsFollow) {
  auto store = Make(/*shards=*/4);
  for (int i = 0; i < 300; ++i) {
    const std::string key = Numbered("short-", i);
    MustComplete(*store, "", key, MustAcquire(*store, "", key), "r", milliseconds(1000));
  }
  for (int i = 0; i < 200; ++i) {
    const std::string key = Numbered("long-", i);
    MustComplete(*store, "", key, MustAcquire(*store, "", key), "r", milliseconds(100'000));
  }
  for (int i = 0; i < 50; ++i) MustAcquire(*store, "", Numbered("open-", i));
  StoreStats st = *store->Stats();
  EXPECT_EQ(st.completed, 500u);
  EXPECT_EQ(st.in_progress, 50u);
  const std::uint64_t full_bytes = st.bytes;
  EXPECT_GT(full_bytes, 550u * 48);

  EXPECT_EQ(*store->Purge(), 0u);
  clock_.Advance(milliseconds(2000));
  EXPECT_EQ(*store->Purge(), 300u);
  EXPECT_EQ(*store->Purge(), 0u);
  st = *store->Stats();
  EXPECT_EQ(st.completed, 200u);
  EXPECT_EQ(st.in_progress, 50u);
  EXPECT_LT(st.bytes, full_bytes);  // the responses' blobs are gone
  EXPECT_FALSE(store->Get("", "short-1")->has_value());
  EXPECT_TRUE(store->Get("", "long-1")->has_value());
  // Freed slots are reused.
  for (int i = 0; i < 300; ++i) MustAcquire(*store, "", Numbered("again-", i));
  EXPECT_EQ(store->Stats()->in_progress, 350u);
}

TEST_F(MemoryStoreTest, StatsCountSessionsAndEntities) {
  auto store = Make();
  SessionRequest s;
  s.client_id = "client-1";
  ASSERT_TRUE(store->OpenSession(s).has_value());
  s.client_id = "client-2";
  ASSERT_TRUE(store->OpenSession(s).has_value());
  SequencedBeginRequest b;
  b.client_id = "client-1";
  b.seq = 1;
  ASSERT_TRUE(std::holds_alternative<Acquired>(*store->BeginSequenced(b)));
  VersionedBeginRequest v;
  v.entity = "order-1";
  v.version = 3;
  ASSERT_TRUE(std::holds_alternative<Acquired>(*store->BeginVersioned(v)));
  const StoreStats st = *store->Stats();
  EXPECT_EQ(st.sessions, 2u);
  EXPECT_EQ(st.entities, 1u);
  EXPECT_EQ(st.in_progress, 1u);
  EXPECT_GT(st.bytes, 0u);
}

TEST_F(MemoryStoreTest, SessionRecordsOutliveRetentionUntilAcknowledged) {
  auto store = Make();
  SessionRequest s;
  s.client_id = "c";
  s.ttl = std::chrono::hours(1000);
  s.window = 4;
  ASSERT_TRUE(store->OpenSession(s).has_value());
  SequencedBeginRequest b;
  b.client_id = "c";
  for (std::uint64_t seq = 1; seq <= 4; ++seq) {
    b.seq = seq;
    const Acquired a = std::get<Acquired>(*store->BeginSequenced(b));
    const std::string response = Numbered("r", seq);
    SequencedCompleteRequest c;
    c.client_id = "c";
    c.seq = seq;
    c.token = a.token;
    c.response = response;
    ASSERT_EQ(*store->CompleteSequenced(c), WriteAnswer::kApplied);
  }
  b.seq = 5;
  EXPECT_EQ(store->BeginSequenced(b).status().code(), StatusCode::kResourceExhausted);
  clock_.Advance(std::chrono::hours(500));  // far past any record retention
  EXPECT_EQ(*store->Purge(), 0u);
  b.seq = 3;
  const BeginAnswer replay = *store->BeginSequenced(b);
  ASSERT_TRUE(std::holds_alternative<Replay>(replay));
  EXPECT_EQ(std::get<Replay>(replay).response, "r3");
  const SessionInfo info = *store->Acknowledge("", "c", 2);
  EXPECT_EQ(info.low_water, 2u);
  EXPECT_EQ(info.outstanding, 2u);
  b.seq = 2;
  EXPECT_TRUE(std::holds_alternative<Stale>(*store->BeginSequenced(b)));
  clock_.Advance(std::chrono::hours(1001));
  EXPECT_EQ(*store->Purge(), 3u);  // the session and its two records
  b.seq = 5;
  EXPECT_EQ(store->BeginSequenced(b).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(MemoryStoreTest, ReaperReclaimsInTheBackgroundWhileCallersWork) {
  auto store = Make(/*shards=*/8, /*reclaim=*/milliseconds(1));
  constexpr int kExpiring = 5000;
  for (int i = 0; i < kExpiring; ++i) {
    const std::string key = std::to_string(i) + "-expiring-key-with-a-long-name";
    MustComplete(*store, "", key, MustAcquire(*store, "", key), "resp", milliseconds(1000));
  }
  ASSERT_EQ(store->Stats()->completed, static_cast<std::uint64_t>(kExpiring));
  clock_.Advance(milliseconds(1500));

  // Callers keep working on other keys (with a long retention) while the reaper runs.
  std::atomic<bool> done{false};
  std::atomic<int> worked{0};
  std::atomic<int> failures{0};
  std::thread caller([&] {
    for (int i = 0; !done.load() || i < 2000; ++i) {
      const std::string key = Numbered("live-", i);
      BeginRequest r;
      r.key = key;
      const Result<BeginAnswer> a = store->Begin(r);
      if (!a.has_value() || !std::holds_alternative<Acquired>(*a)) {
        failures.fetch_add(1);
        continue;
      }
      CompleteRequest c;
      c.key = key;
      c.token = std::get<Acquired>(*a).token;
      c.retention = std::chrono::hours(1);
      const Result<WriteAnswer> w = store->Complete(c);
      if (!w.has_value() || *w != WriteAnswer::kApplied) failures.fetch_add(1);
      worked.fetch_add(1);
    }
  });
  // Bounded wait on the real clock: the reaper sweeps every millisecond.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::uint64_t completed = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    completed = store->Stats()->completed;
    if (completed <= static_cast<std::uint64_t>(worked.load())) break;
    std::this_thread::yield();
  }
  done.store(true);
  caller.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_FALSE(store->Get("", "7-expiring-key-with-a-long-name")->has_value());
  // Everything left is a live record the caller wrote.
  EXPECT_EQ(store->Stats()->completed, static_cast<std::uint64_t>(worked.load()));
  EXPECT_EQ(*store->Purge(), 0u);
}

TEST_F(MemoryStoreTest, ReaperCoversABigStoreOverSeveralTicks) {
  // More slots than one tick sweeps, so the sweep must resume where it stopped.
  auto store = Make(/*shards=*/8, /*reclaim=*/milliseconds(1));
  constexpr int kRecords = 150'000;
  std::vector<BeginRequest> begins(kRecords);
  std::vector<std::string> keys(kRecords);
  for (int i = 0; i < kRecords; ++i) {
    keys[i] = Numbered("k", i);
    begins[i].key = keys[i];
    begins[i].lease = milliseconds(10);
  }
  for (const auto& a : store->BeginBatch(begins)) ASSERT_TRUE(a.has_value());
  clock_.Advance(MemoryStoreOptions{}.abandoned_retention + milliseconds(11));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (store->Stats()->in_progress != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(store->Stats()->in_progress, 0u);
  EXPECT_EQ(*store->Purge(), 0u);
}

TEST_F(MemoryStoreTest, DestructorStopsTheReaperPromptly) {
  const auto start = std::chrono::steady_clock::now();
  {
    auto store = Make(/*shards=*/0, /*reclaim=*/std::chrono::hours(1));
    MustAcquire(*store, "", "k");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace idem
