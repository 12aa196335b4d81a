// The store contract suite (src/stores/store_contract_suite.cc) against PostgreSQL, on the
// server IDEM_TEST_POSTGRES names: every `make` is a store over a fresh schema, and `reopen` a
// new store over the schema of the last one.
#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "idem/stores/postgres.h"
#include "stores/postgres/testing.h"
#include "stores/store_contract.h"

namespace idem {
namespace {

// The server is read lazily, in `make`: INSTANTIATE runs before main.
StoreUnderTest Postgres() {
  auto last = std::make_shared<PostgresStoreOptions>();
  auto open = [last](Clock& clock, std::size_t max_key_bytes) -> std::unique_ptr<Store> {
    PostgresStoreOptions o = *last;
    o.clock = &clock;
    o.max_key_bytes = max_key_bytes;
    auto store = OpenPostgresStore(o);
    if (!store) {
      ADD_FAILURE() << "cannot open the PostgreSQL store: " << store.error().ToString();
      return nullptr;
    }
    return std::move(*store);
  };
  return StoreUnderTest{
      .name = "postgres",
      .make = [last, open](Clock& clock, std::size_t max_key_bytes) -> std::unique_ptr<Store> {
        auto o = pg::testing::FreshStoreOptions();
        if (!o) {
          ADD_FAILURE() << o.error().ToString();
          return nullptr;
        }
        // Small pools: ctest runs many of these processes side by side on one server.
        o->pool_size = 2;
        o->max_transactions = 2;
        *last = *o;
        return open(clock, max_key_bytes);
      },
      .reopen = open,
      .abandoned_retention = PostgresStoreOptions{}.abandoned_retention,
  };
}

const StoreUnderTest kPostgres = Postgres();

INSTANTIATE_TEST_SUITE_P(Postgres, StoreContractTest, ::testing::Values(kPostgres),
                         StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Postgres, StoreCountsTest, ::testing::Values(kPostgres),
                         StoreUnderTestName);
INSTANTIATE_TEST_SUITE_P(Postgres, StoreReopenTest, ::testing::Values(kPostgres),
                         StoreUnderTestName);

}  // namespace
}  // namespace idem
