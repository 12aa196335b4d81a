// The store contract suite (store_contract_suite.cc) on the stores that need no server: the
// memory store and the embedded log store in each durability mode. Redis and PostgreSQL run it
// in binaries of their own (their tests carry their own labels and need their servers).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "idem/status.h"
#include "idem/stores/log.h"
#include "idem/stores/memory.h"
#include "stores/store_contract.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

const StoreUnderTest kMemory{
    .name = "memory",
    .make =
        [](Clock& clock, std::size_t max_key_bytes) {
          MemoryStoreOptions o;
          o.clock = &clock;
          o.max_key_bytes = max_key_bytes;
          o.reclaim_interval = milliseconds(0);
          return NewMemoryStore(o);
        },
    .reopen = {},  // records die with the store
    .abandoned_retention = MemoryStoreOptions{}.abandoned_retention,
};

// The embedded log store in each durability mode: a fresh directory per `make`, and `reopen`
// opens the directory of the last store made.
StoreUnderTest LogStore(std::string name, SyncMode sync) {
  auto dir = std::make_shared<std::string>();
  auto open = [sync, dir](Clock& clock, std::size_t max_key_bytes) {
    LogStoreOptions o;
    o.dir = *dir;
    o.sync = sync;
    o.sync_interval = milliseconds(5);
    o.clock = &clock;
    o.max_key_bytes = max_key_bytes;
    o.reclaim_interval = milliseconds(0);
    auto store = OpenLogStore(o);
    IDEM_CHECK_MSG(store.has_value(), store.error().ToString());
    return std::move(*store);
  };
  return StoreUnderTest{
      .name = std::move(name),
      .make =
          [open, dir](Clock& clock, std::size_t max_key_bytes) {
            static std::atomic<int> counter{0};
            *dir = ::testing::TempDir() + "idem-contract-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter++);
            std::filesystem::remove_all(*dir);
            return open(clock, max_key_bytes);
          },
      .reopen = open,
      .abandoned_retention = LogStoreOptions{}.abandoned_retention,
  };
}

const StoreUnderTest kLogAlways = LogStore("log_sync_always", SyncMode::kAlways);
const StoreUnderTest kLogInterval = LogStore("log_sync_interval", SyncMode::kInterval);
const StoreUnderTest kLogNone = LogStore("log_sync_none", SyncMode::kNone);

INSTANTIATE_TEST_SUITE_P(Memory, StoreContractTest, ::testing::Values(kMemory), StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Memory, StoreCountsTest, ::testing::Values(kMemory), StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Log, StoreContractTest,
                         ::testing::Values(kLogAlways, kLogInterval, kLogNone), StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Log, StoreCountsTest,
                         ::testing::Values(kLogAlways, kLogInterval, kLogNone), StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Log, StoreReopenTest,
                         ::testing::Values(kLogAlways, kLogInterval, kLogNone), StoreUnderTestName);

}  // namespace
}  // namespace idem
