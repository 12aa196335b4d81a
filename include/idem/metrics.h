// Metrics (SPEC §7) in the Prometheus text format.
//
// A Registry owns metrics; registration takes a lock, updates never do: Counter, Gauge and
// Histogram updates are relaxed atomic operations on per-thread-striped cells, so the
// receiver and stores update them on the hot path without contention. Rendering reads the
// cells without stopping writers (a scrape may see an update half-way between two metrics,
// never a torn value).
#ifndef IDEM_METRICS_H_
#define IDEM_METRICS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  virtual ~Counter() = default;
  virtual void Inc(std::uint64_t n = 1) = 0;
  virtual std::uint64_t Value() const = 0;
};

class Gauge {
 public:
  virtual ~Gauge() = default;
  virtual void Set(std::int64_t v) = 0;
  virtual void Add(std::int64_t d) = 0;
  virtual std::int64_t Value() const = 0;
};

class Histogram {
 public:
  virtual ~Histogram() = default;
  virtual void Observe(double value) = 0;
  void ObserveDuration(std::chrono::nanoseconds d) {
    Observe(static_cast<double>(d.count()) / 1e9);
  }
  virtual std::uint64_t Count() const = 0;
  virtual double Sum() const = 0;
};

// Latency buckets in seconds, 10 µs .. 10 s.
std::vector<double> DefaultLatencyBuckets();

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registering the same name and labels twice returns the same metric. Names must match
  // [a-zA-Z_:][a-zA-Z0-9_:]*; one name has one type and one help text (IDEM_CHECK).
  // The returned references live as long as the registry.
  Counter& AddCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& AddGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& AddHistogram(std::string_view name, std::string_view help, const Labels& labels = {},
                          std::vector<double> bounds = DefaultLatencyBuckets());
  // A gauge computed at scrape time (e.g. records by state from Store::Stats).
  void AddGaugeCallback(std::string_view name, std::string_view help, const Labels& labels,
                        std::function<double()> read);

  // Every metric in the Prometheus text exposition format 0.0.4, families sorted by name.
  std::string RenderPrometheus() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The standard idem metrics of SPEC §7, registered under `idem_*` with a `scope` label.
// Members are never null. Cheap to copy (pointers into the registry).
//
// How the front doors count (the receiver, the consumer, the gateway):
// - idem_begin_total: one answer per delivery, the one it ended with. A delivery that polls a
//   busy key (BusyPolicy::kWait, the consumer's busy wait, the gateway's wait) counts only its
//   final answer: busy once if it gave up, else what the store answered last. A duplicate
//   answered in-process without a Begin of its own (BusyPolicy::kCoalesce's followers, a
//   key's later copies in one consumer batch) counts idem_coalesced_total instead, unless it
//   ends Busy (counted busy) or is a conflict (counted conflict). The duplicate rate is
//   (replay + coalesced) / (all begin answers + coalesced).
// - idem_store_errors_total: one per store call (or batch answer) that failed, each try of a
//   retried write included; not an input the store refused (kInvalidArgument).
// - idem_store_op_seconds: one observation per store call (a batch is one call), without the
//   pauses between retries.
struct Metrics {
  Metrics(Registry& registry, std::string_view scope);

  Counter* begin_acquired;     // idem_begin_total{answer="acquired"}
  Counter* begin_replay;       // idem_begin_total{answer="replay"}
  Counter* begin_busy;         // idem_begin_total{answer="busy"}
  Counter* begin_conflict;     // idem_begin_total{answer="conflict"}
  Counter* begin_stale;        // idem_begin_total{answer="stale"}
  Counter* complete_success;   // idem_complete_total{outcome="success"}
  Counter* complete_failure;   // idem_complete_total{outcome="failure"}
  Counter* releases;           // idem_release_total
  Counter* takeovers;          // idem_lease_takeover_total
  Counter* lease_lost;         // idem_lease_lost_total
  Counter* store_errors;       // idem_store_errors_total
  Counter* dlq_sends;          // idem_dlq_total
  Counter* coalesced;          // idem_coalesced_total: duplicates answered by an in-process wait
  Histogram* handler_seconds;  // idem_handler_seconds
  Histogram* store_begin_seconds;     // idem_store_op_seconds{op="begin"}
  Histogram* store_complete_seconds;  // idem_store_op_seconds{op="complete"}
  Histogram* store_release_seconds;   // idem_store_op_seconds{op="release"}
  Histogram* store_extend_seconds;    // idem_store_op_seconds{op="extend"}
};

}  // namespace idem

#endif  // IDEM_METRICS_H_
