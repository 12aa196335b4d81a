// The child of the kill -9 test (transactional_test.cc): receives one message through a
// TransactionalReceiver whose handler writes a row to TABLE, prints "written attempt N" and then
// waits, its transaction open, to be killed before the commit.
//
//   postgres_transactional_child STORE_URL KEY TABLE
#include <unistd.h>

#include <cstdio>
#include <string>

#include "idem/stores/postgres.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s STORE_URL KEY TABLE\n", argv[0]);
    return 2;
  }
  auto options = idem::ParsePostgresStoreUrl(argv[1]);
  if (!options) {
    std::fprintf(stderr, "%s\n", options.error().ToString().c_str());
    return 2;
  }
  options->reclaim_interval = std::chrono::milliseconds(0);
  auto store = idem::OpenPostgresStore(*options);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.error().ToString().c_str());
    return 1;
  }
  const std::string table = argv[3];
  idem::TransactionalReceiver receiver(**store, {.scope = "tx", .lease = std::chrono::seconds(30)});
  auto r = receiver.Receive(
      {.key = argv[2]}, [&](const idem::HandlerContext& c, idem::PgTransaction& tx) {
        const std::string attempt = std::to_string(c.attempt);
        auto written =
            tx.Exec("INSERT INTO " + table + " (key, attempt) VALUES ($1, $2)", {c.key, attempt});
        if (!written) {
          std::fprintf(stderr, "write failed: %s\n", written.error().ToString().c_str());
          _exit(3);
        }
        std::printf("written attempt %u\n", c.attempt);
        std::fflush(stdout);
        for (;;) pause();  // until SIGKILL
        return idem::HandlerResult{};
      });
  std::fprintf(
      stderr, "unexpected return: %s\n",
      r ? std::string(idem::DeliveryName(r->delivery)).c_str() : r.error().ToString().c_str());
  return 1;
}
