#include "idem/metrics.h"

#include "idem/store_gauges.h"
#include "idem/stores/memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace idem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(RegistryTest, RendersExactText) {
  Registry r;
  const char* help = "Requests by path.\nA \\ and a \"quote\".";
  r.AddCounter("requests_total", help, {{"path", "/a"}, {"code", "200"}}).Inc(3);
  r.AddCounter("requests_total", help, {{"path", "/b\"q\"\\\n"}, {"code", "500"}}).Inc();
  r.AddGauge("in_flight", "In flight.").Set(-2);
  Histogram& h = r.AddHistogram("latency_seconds", "Latency.", {{"op", "get"}}, {0.25, 0.5, 2});
  for (double v : {0.125, 0.25, 0.375, 4.0}) h.Observe(v);
  r.AddHistogram("plain_seconds", "No bounds.", {}, {});
  r.AddGaugeCallback("store_bytes", "Store size.", {{"store", "memory"}}, [] { return 1234.5; });
  r.AddCounter("a_total", "First by name.");

  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP a_total First by name.\n"
            "# TYPE a_total counter\n"
            "a_total 0\n"
            "# HELP in_flight In flight.\n"
            "# TYPE in_flight gauge\n"
            "in_flight -2\n"
            "# HELP latency_seconds Latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{op=\"get\",le=\"0.25\"} 2\n"
            "latency_seconds_bucket{op=\"get\",le=\"0.5\"} 3\n"
            "latency_seconds_bucket{op=\"get\",le=\"2\"} 3\n"
            "latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 4\n"
            "latency_seconds_sum{op=\"get\"} 4.75\n"
            "latency_seconds_count{op=\"get\"} 4\n"
            "# HELP plain_seconds No bounds.\n"
            "# TYPE plain_seconds histogram\n"
            "plain_seconds_bucket{le=\"+Inf\"} 0\n"
            "plain_seconds_sum 0\n"
            "plain_seconds_count 0\n"
            "# HELP requests_total Requests by path.\\nA \\\\ and a \"quote\".\n"
            "# TYPE requests_total counter\n"
            "requests_total{path=\"/a\",code=\"200\"} 3\n"
            "requests_total{path=\"/b\\\"q\\\"\\\\\\n\",code=\"500\"} 1\n"
            "# HELP store_bytes Store size.\n"
            "# TYPE store_bytes gauge\n"
            "store_bytes{store=\"memory\"} 1234.5\n");
}

TEST(RegistryTest, FormatsNumbersSoPrometheusParsesThem) {
  Registry r;
  auto gauge = [&](const char* name, double v) {
    r.AddGaugeCallback("v", "Values.", {{"n", name}}, [v] { return v; });
  };
  gauge("half", 0.5);
  gauge("integral", 42.0);
  gauge("negative", -3.0);
  gauge("big_integral", 123456789012.0);
  gauge("tenth", 1e-4);
  gauge("small", 1e-5);
  gauge("huge", 1e21);
  gauge("round_trip", 0.1 + 0.2);
  gauge("nan", std::numeric_limits<double>::quiet_NaN());
  gauge("inf", std::numeric_limits<double>::infinity());
  gauge("minus_inf", -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.RenderPrometheus(),
            "# HELP v Values.\n"
            "# TYPE v gauge\n"
            "v{n=\"half\"} 0.5\n"
            "v{n=\"integral\"} 42\n"
            "v{n=\"negative\"} -3\n"
            "v{n=\"big_integral\"} 123456789012\n"
            "v{n=\"tenth\"} 0.0001\n"
            "v{n=\"small\"} 1e-05\n"
            "v{n=\"huge\"} 1e+21\n"
            "v{n=\"round_trip\"} 0.30000000000000004\n"
            "v{n=\"nan\"} NaN\n"
            "v{n=\"inf\"} +Inf\n"
            "v{n=\"minus_inf\"} -Inf\n");
}

TEST(RegistryTest, DefaultBucketsRenderAsShortDecimals) {
  std::vector<double> bounds = DefaultLatencyBuckets();
  ASSERT_EQ(bounds.size(), 19u);
  EXPECT_EQ(bounds.front(), 1e-5);
  EXPECT_EQ(bounds.back(), 10.0);
  Registry r;
  r.AddHistogram("h_seconds", "H.");
  std::string text = r.RenderPrometheus();
  for (const char* le : {"1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.001", "0.025", "1",
                         "2.5", "10", "+Inf"}) {
    EXPECT_THAT(text, HasSubstr("h_seconds_bucket{le=\"" + std::string(le) + "\"} 0\n"));
  }
  EXPECT_EQ(CountOf(text, "h_seconds_bucket"), 20);
}

TEST(RegistryTest, SameNameAndLabelsIsTheSameMetric) {
  Registry r;
  Counter& a = r.AddCounter("x_total", "X.", {{"a", "1"}, {"b", "2"}});
  EXPECT_EQ(&a, &r.AddCounter("x_total", "X.", {{"a", "1"}, {"b", "2"}}));
  EXPECT_EQ(&a, &r.AddCounter("x_total", "X.", {{"b", "2"}, {"a", "1"}}));
  EXPECT_NE(&a, &r.AddCounter("x_total", "X.", {{"a", "1"}, {"b", "3"}}));
  EXPECT_NE(&a, &r.AddCounter("x_total", "X."));
  Gauge& g = r.AddGauge("g", "G.");
  EXPECT_EQ(&g, &r.AddGauge("g", "G."));
  Histogram& h = r.AddHistogram("h", "H.", {{"op", "x"}}, {1, 2});
  EXPECT_EQ(&h, &r.AddHistogram("h", "H.", {{"op", "x"}}, {1, 2}));
  EXPECT_EQ(&h, &r.AddHistogram("h", "H.", {{"op", "x"}},
                                {1, 2, std::numeric_limits<double>::infinity()}));

  a.Inc(2);
  std::string text = r.RenderPrometheus();
  EXPECT_EQ(CountOf(text, "# HELP x_total"), 1);
  EXPECT_EQ(CountOf(text, "x_total{"), 2);  // the labelled series, in first registration order
  EXPECT_THAT(text,
              HasSubstr("x_total{a=\"1\",b=\"2\"} 2\nx_total{a=\"1\",b=\"3\"} 0\nx_total 0\n"));
}

TEST(RegistryTest, RegisteringACallbackAgainReplacesIt) {
  Registry r;
  r.AddGaugeCallback("c", "C.", {}, [] { return 1.0; });
  r.AddGaugeCallback("c", "C.", {}, [] { return 2.0; });
  EXPECT_EQ(r.RenderPrometheus(), "# HELP c C.\n# TYPE c gauge\nc 2\n");
}

TEST(RegistryTest, CallbackMayRegisterMetrics) {
  Registry r;
  r.AddGaugeCallback("c", "C.", {}, [&r] {
    r.AddCounter("from_callback_total", "Registered during a scrape.").Inc();
    return 7.0;
  });
  // The first scrape's snapshot predates the counter; the second one sees it after this
  // scrape's callback ("c" sorts first) counted again.
  std::string first = r.RenderPrometheus();
  EXPECT_THAT(first, HasSubstr("c 7\n"));
  EXPECT_THAT(first, Not(HasSubstr("from_callback_total")));
  EXPECT_THAT(r.RenderPrometheus(), HasSubstr("from_callback_total 2\n"));
}

TEST(RegistryTest, HistogramBuckets) {
  Registry r;
  Histogram& h = r.AddHistogram("h", "H.", {}, {1, 2});
  h.Observe(-5);  // below every bound: first bucket
  h.Observe(1);   // on a bound: that bucket (le is <=)
  h.Observe(1.5);
  h.Observe(std::numeric_limits<double>::infinity());
  h.Observe(std::numeric_limits<double>::quiet_NaN());  // +Inf bucket, as in client_golang
  EXPECT_EQ(h.Count(), 5u);
  EXPECT_TRUE(std::isnan(h.Sum()));
  std::string text = r.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr("h_bucket{le=\"1\"} 2\n"
                              "h_bucket{le=\"2\"} 3\n"
                              "h_bucket{le=\"+Inf\"} 5\n"
                              "h_sum NaN\n"
                              "h_count 5\n"));

  Histogram& d = r.AddHistogram("d_seconds", "D.");
  d.ObserveDuration(std::chrono::milliseconds(3));
  EXPECT_EQ(d.Count(), 1u);
  EXPECT_DOUBLE_EQ(d.Sum(), 0.003);
  EXPECT_THAT(r.RenderPrometheus(), HasSubstr("d_seconds_bucket{le=\"0.0025\"} 0\n"
                                              "d_seconds_bucket{le=\"0.005\"} 1\n"));
}

TEST(RegistryTest, GaugeSetAndAdd) {
  Registry r;
  Gauge& g = r.AddGauge("g", "G.");
  std::thread([&g] { g.Add(5); }).join();  // lands in another stripe
  g.Add(1);
  EXPECT_EQ(g.Value(), 6);
  g.Set(3);
  EXPECT_EQ(g.Value(), 3);
  g.Add(-10);
  EXPECT_EQ(g.Value(), -7);
  std::thread([&g] { g.Set(std::numeric_limits<std::int64_t>::min()); }).join();
  EXPECT_EQ(g.Value(), std::numeric_limits<std::int64_t>::min());
  g.Add(1);
  EXPECT_EQ(g.Value(), std::numeric_limits<std::int64_t>::min() + 1);
}

TEST(MetricsTest, RegistersTheStandardSet) {
  Registry r;
  Metrics a(r, "orders");
  Metrics b(r, "orders");
  Metrics c(r, "payments");
  for (Counter* p : {a.begin_acquired, a.begin_replay, a.begin_busy, a.begin_conflict,
                     a.begin_stale, a.complete_success, a.complete_failure, a.releases, a.takeovers,
                     a.lease_lost, a.store_errors, a.dlq_sends, a.coalesced}) {
    ASSERT_NE(p, nullptr);
  }
  ASSERT_NE(a.handler_seconds, nullptr);
  ASSERT_NE(a.store_begin_seconds, nullptr);
  ASSERT_NE(a.store_complete_seconds, nullptr);
  ASSERT_NE(a.store_release_seconds, nullptr);
  ASSERT_NE(a.store_extend_seconds, nullptr);

  EXPECT_EQ(a.begin_replay, b.begin_replay);
  EXPECT_EQ(a.coalesced, b.coalesced);
  EXPECT_EQ(a.store_complete_seconds, b.store_complete_seconds);
  EXPECT_NE(a.begin_replay, c.begin_replay);
  EXPECT_NE(a.begin_replay, a.begin_acquired);
  EXPECT_NE(a.store_begin_seconds, a.store_complete_seconds);
  EXPECT_NE(a.handler_seconds, c.handler_seconds);

  a.begin_replay->Inc();
  b.begin_replay->Inc();
  a.store_begin_seconds->Observe(0.002);
  std::string text = r.RenderPrometheus();
  for (const char* family :
       {"idem_begin_total counter", "idem_complete_total counter", "idem_release_total counter",
        "idem_lease_takeover_total counter", "idem_lease_lost_total counter",
        "idem_store_errors_total counter", "idem_dlq_total counter", "idem_coalesced_total counter",
        "idem_handler_seconds histogram", "idem_store_op_seconds histogram"}) {
    EXPECT_EQ(CountOf(text, std::string("# TYPE ") + family + "\n"), 1) << family;
  }
  EXPECT_EQ(CountOf(text, "# HELP "), 10);
  EXPECT_THAT(text, HasSubstr("idem_begin_total{scope=\"orders\",answer=\"replay\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("idem_begin_total{scope=\"payments\",answer=\"replay\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("idem_complete_total{scope=\"orders\",outcome=\"failure\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("idem_release_total{scope=\"payments\"} 0\n"));
  EXPECT_THAT(
      text,
      HasSubstr("idem_store_op_seconds_bucket{scope=\"orders\",op=\"begin\",le=\"0.0025\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("idem_store_op_seconds_count{scope=\"orders\",op=\"complete\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("idem_handler_seconds_count{scope=\"payments\"} 0\n"));
  for (const char* op : {"begin", "complete", "release", "extend"}) {
    EXPECT_EQ(CountOf(text, std::string("idem_store_op_seconds_count{scope=\"payments\",op=\"") +
                                op + "\"}"),
              1)
        << op;
  }
  EXPECT_EQ(CountOf(text, "idem_begin_total{"), 10);
}

TEST(RegistryTest, ConcurrentUpdatesRenderingAndRegistration) {
  constexpr int kThreads = 8;
  constexpr int kOps = 100'000;
  Registry r;
  Counter& counter = r.AddCounter("ops_total", "Ops.");
  Gauge& gauge = r.AddGauge("level", "Level.");
  Histogram& histogram = r.AddHistogram("op_seconds", "Op time.", {}, {0.5, 1, 2});
  Gauge& set_gauge = r.AddGauge("set_level", "Set and added.");
  std::atomic<bool> done{false};
  std::atomic<int> renders{0};
  std::thread renderer([&] {
    while (!done.load()) {
      std::string text = r.RenderPrometheus();
      EXPECT_THAT(text, HasSubstr("# TYPE ops_total counter\n"));
      renders.fetch_add(1);
    }
  });
  std::thread registrar([&] {
    for (int i = 0; i < 200 && !done.load(); ++i) {
      r.AddCounter("dynamic_total", "Registered while scraping.", {{"i", std::to_string(i)}}).Inc();
      r.AddGaugeCallback("dynamic_gauge", "Callbacks.", {{"i", std::to_string(i % 10)}},
                         [i] { return static_cast<double>(i); });
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < kOps; ++i) {
        counter.Inc();
        gauge.Add(i % 2 == 0 ? 3 : -1);
        histogram.Observe(i % 2 == 0 ? 0.25 : 1.5);
        if (i % 100 == 0) set_gauge.Set(i);
        set_gauge.Add(1);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  registrar.join();
  done.store(true);
  renderer.join();
  EXPECT_GT(renders.load(), 0);

  constexpr std::uint64_t kTotal = std::uint64_t{kThreads} * kOps;
  EXPECT_EQ(counter.Value(), kTotal);
  EXPECT_EQ(gauge.Value(), static_cast<std::int64_t>(kTotal));  // (3 - 1) per two ops
  EXPECT_EQ(histogram.Count(), kTotal);
  // The last Set is some thread's Set(kOps - 100), followed by that thread's 100 Adds.
  EXPECT_GE(set_gauge.Value(), kOps);
  set_gauge.Set(5);
  EXPECT_EQ(set_gauge.Value(), 5);
  EXPECT_EQ(histogram.Sum(), (0.25 + 1.5) * static_cast<double>(kTotal / 2));  // exact in binary
  std::string text = r.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr("ops_total 800000\n"));
  EXPECT_THAT(text, HasSubstr("op_seconds_bucket{le=\"0.5\"} 400000\n"
                              "op_seconds_bucket{le=\"1\"} 400000\n"
                              "op_seconds_bucket{le=\"2\"} 800000\n"
                              "op_seconds_bucket{le=\"+Inf\"} 800000\n"
                              "op_seconds_sum 700000\n"
                              "op_seconds_count 800000\n"));
  EXPECT_EQ(CountOf(text, "dynamic_total{"), 200);
  EXPECT_EQ(CountOf(text, "dynamic_gauge{"), 10);
}

using RegistryDeathTest = ::testing::Test;

TEST_F(RegistryDeathTest, ChecksNamesTypesAndHelp) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  Registry r;
  r.AddCounter("c_total", "C.");
  r.AddHistogram("h_seconds", "H.", {}, {1, 2});
  EXPECT_DEATH(r.AddCounter("", "X."), "bad metric name");
  EXPECT_DEATH(r.AddCounter("1abc", "X."), "bad metric name");
  EXPECT_DEATH(r.AddCounter("a-b", "X."), "bad metric name");
  EXPECT_DEATH(r.AddCounter("ok", "X.", {{"bad-label", "v"}}), "bad label name");
  EXPECT_DEATH(r.AddCounter("ok", "X.", {{"__reserved", "v"}}), "bad label name");
  EXPECT_DEATH(r.AddCounter("ok", "X.", {{"1a", "v"}}), "bad label name");
  EXPECT_DEATH(r.AddCounter("ok", "X.", {{"a", "1"}, {"a", "2"}}), "duplicate label");
  EXPECT_DEATH(r.AddHistogram("ok", "X.", {{"le", "1"}}), "label named le");
  EXPECT_DEATH(r.AddGauge("c_total", "C."), "another type");
  EXPECT_DEATH(r.AddCounter("c_total", "Other help."), "another help");
  EXPECT_DEATH(r.AddHistogram("h_seconds", "H.", {}, {1, 3}), "other bounds");
  EXPECT_DEATH(r.AddHistogram("bad", "X.", {}, {2, 1}), "not increasing");
  EXPECT_DEATH(r.AddHistogram("bad", "X.", {}, {1, 1}), "not increasing");
  EXPECT_DEATH(r.AddHistogram("bad", "X.", {}, {std::nan("")}), "not finite");
  EXPECT_DEATH(r.AddCounter("h_seconds_count", "X."), "clashes with a histogram");
  r.AddCounter("q_count", "Q.");
  EXPECT_DEATH(r.AddHistogram("q", "X."), "clashes with q_count");
  EXPECT_DEATH(r.AddGaugeCallback("g", "X.", {}, nullptr), "empty gauge callback");
  r.AddGauge("g", "G.");
  EXPECT_DEATH(r.AddGaugeCallback("g", "G.", {}, [] { return 1.0; }), "registered as a gauge");
}

// The store's contents as gauges (SPEC §7), read by StoreGauges' own thread.
TEST(StoreGaugesTest, ShowTheStoresRecordsByStateAndItsSize) {
  MemoryStoreOptions o;
  o.reclaim_interval = std::chrono::milliseconds(0);
  auto store = NewMemoryStore(o);
  auto a = store->Begin({"s", "held", std::nullopt, std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(a && std::holds_alternative<Acquired>(*a));
  for (const char* key : {"one", "two"}) {
    auto b = store->Begin({"s", key, std::nullopt, std::chrono::milliseconds(60'000)});
    ASSERT_TRUE(b && std::holds_alternative<Acquired>(*b));
    ASSERT_TRUE(store->Complete({"s", key, std::get<Acquired>(*b).token, Outcome::kSuccess, "r",
                                 std::chrono::milliseconds(60'000)}));
  }
  Registry r;
  StoreGauges gauges(*store, r, std::chrono::milliseconds(10));
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text = r.RenderPrometheus();
    if (text.find("idem_records{state=\"completed\"} 2") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(text, HasSubstr("idem_records{state=\"completed\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("idem_records{state=\"in_progress\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE idem_store_bytes gauge\n"));
  EXPECT_THAT(text, Not(HasSubstr("idem_store_bytes 0\n")));
  EXPECT_THAT(text, Not(HasSubstr("idem_store_stats_refresh_timestamp_seconds 0\n")));
  EXPECT_THAT(text, HasSubstr("idem_store_stats_errors_total 0\n"));

  // Then the figures follow the store.
  auto c = store->Begin({"s", "three", std::nullopt, std::chrono::milliseconds(60'000)});
  ASSERT_TRUE(c && std::holds_alternative<Acquired>(*c));
  for (int i = 0; i < 500; ++i) {
    text = r.RenderPrometheus();
    if (text.find("idem_records{state=\"in_progress\"} 2") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(text, HasSubstr("idem_records{state=\"in_progress\"} 2\n"));
}

}  // namespace
}  // namespace idem
