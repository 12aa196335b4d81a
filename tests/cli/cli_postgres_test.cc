// `idem store init` and the operator commands on a PostgreSQL store, run as the built program
// against the test server (IDEM_TEST_POSTGRES; scripts/servers.sh start).
#include <chrono>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "idem/stores/postgres.h"
#include "stores/postgres/testing.h"
#include "tests/support/process.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct IdemRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const IdemRun& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

IdemRun RunIdem(const std::vector<std::string>& args) {
  IdemRun run;
  auto child = testing::ChildProcess::Spawn(IDEM_CLI_PATH, args);
  EXPECT_TRUE(child.has_value()) << child.error().ToString();
  if (!child) return run;
  auto code = child->Wait(60s);
  EXPECT_TRUE(code.has_value()) << code.error().ToString();
  run.exit_code = code.value_or(-1);
  run.out = child->Stdout();
  run.err = child->Stderr();
  return run;
}

class PostgresCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto conninfo = pg::testing::TestConninfo();
    ASSERT_TRUE(conninfo.has_value()) << conninfo.error().ToString();
    schema_ = pg::testing::FreshSchemaName();
    url_ = *conninfo + (conninfo->find('?') == std::string::npos ? "?" : "&") + "schema=" + schema_;
  }
  std::string schema_;
  std::string url_;
};

TEST_F(PostgresCliTest, StoreInitCreatesTheSchemaThenKeepsIt) {
  IdemRun r = RunIdem({"store", "init", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("created schema \"" + schema_ + "\""),
                           HasSubstr("version " + std::to_string(kPostgresSchemaVersion))));
  EXPECT_THAT(r.err, IsEmpty());

  // The store opens and works; a second init keeps its rows.
  auto options = ParsePostgresStoreUrl(url_);
  ASSERT_TRUE(options.has_value()) << options.error().ToString();
  options->reclaim_interval = 0ms;
  {
    auto store = OpenPostgresStore(*options);
    ASSERT_TRUE(store.has_value()) << store.error().ToString();
    auto a = (*store)->Begin({.scope = "orders", .key = "o-1"});
    ASSERT_TRUE(a.has_value() && std::holds_alternative<Acquired>(*a));
  }
  r = RunIdem({"store", "init", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("was already at version"));

  r = RunIdem({"stats", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("postgres"), HasSubstr("in_progress  1")));
  r = RunIdem({"get", url_, "orders", "o-1"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("in_progress"));
  r = RunIdem({"list", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("o-1"));
  r = RunIdem({"erase", url_, "orders", "o-1"});
  EXPECT_EQ(r.exit_code, 0) << r;
  r = RunIdem({"purge", url_});
  EXPECT_EQ(r.exit_code, 0) << r;
}

TEST_F(PostgresCliTest, CommandsOnAMissingSchemaSayToRunInit) {
  IdemRun r = RunIdem({"stats", url_});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("\"" + schema_ + "\""), HasSubstr("idem store init")));
}

TEST_F(PostgresCliTest, StoreInitRefusesOtherVersionsAndOtherStores) {
  ASSERT_EQ(RunIdem({"store", "init", url_}).exit_code, 0);
  auto conninfo = pg::testing::TestConninfo();
  ASSERT_TRUE(conninfo.has_value());
  ASSERT_TRUE(pg::testing::Sql(*conninfo, "UPDATE \"" + schema_ +
                                              "\".meta SET value = '9' WHERE name = "
                                              "'schema_version'")
                  .has_value());
  IdemRun r = RunIdem({"store", "init", url_});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, AllOf(HasSubstr("version 9"), HasSubstr("version 1")));

  r = RunIdem({"store", "init", "log:/tmp/idem-no-such-store"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("store init is for postgres://"));
  r = RunIdem({"store", "init", "postgres://h/db?schema=Bad-Name"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("schema name"));
  r = RunIdem({"store", "init", "postgres://postgres@127.0.0.1:1/none"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("UNAVAILABLE"));
}

TEST_F(PostgresCliTest, StoreInitHelp) {
  IdemRun r = RunIdem({"store", "init", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, AllOf(HasSubstr("usage: idem store init URL"), HasSubstr("schema=NAME")));
  r = RunIdem({"--help"});
  EXPECT_THAT(r.out, HasSubstr("store init"));
}

}  // namespace
}  // namespace idem
