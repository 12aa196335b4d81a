// Registry, striped metric cells and the Prometheus text format 0.0.4.
#include "idem/metrics.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>

#include "idem/status.h"

namespace idem {
namespace {

// Every update goes to one of kStripes cache lines, picked once per thread (round robin), so
// threads updating one metric rarely share a line. Readers sum the stripes.
constexpr std::size_t kStripes = 16;
constexpr std::size_t kCacheLine = 64;
constexpr std::uint32_t kNoStripe = std::numeric_limits<std::uint32_t>::max();

std::atomic<std::uint32_t> next_stripe{0};
thread_local std::uint32_t this_thread_stripe = kNoStripe;

std::size_t ThisThreadStripe() {
  std::uint32_t s = this_thread_stripe;
  if (s == kNoStripe) [[unlikely]] {
    s = next_stripe.fetch_add(1, std::memory_order_relaxed) % kStripes;
    this_thread_stripe = s;
  }
  return s;
}

struct alignas(kCacheLine) Cell {
  std::atomic<std::uint64_t> v{0};
};

// A striped unsigned sum. Arithmetic is modulo 2^64, so it also holds two's-complement
// signed values (GaugeImpl) without overflow.
class StripedSum {
 public:
  void Add(std::uint64_t n) {
    cells_[ThisThreadStripe()].v.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t Sum() const {
    std::uint64_t sum = 0;
    for (const Cell& c : cells_) sum += c.v.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  std::array<Cell, kStripes> cells_;
};

class CounterImpl final : public Counter {
 public:
  void Inc(std::uint64_t n) override { cells_.Add(n); }
  std::uint64_t Value() const override { return cells_.Sum(); }

 private:
  StripedSum cells_;
};

class GaugeImpl final : public Gauge {
 public:
  // The value is base_ plus the stripes. Set stores base_ = v - (stripes it read): an Add it
  // summed is overwritten (as if it came first), one it missed is kept (as if it came after),
  // and of two racing Sets the later store wins. No update takes a lock.
  void Set(std::int64_t v) override {
    base_.store(static_cast<std::uint64_t>(v) - cells_.Sum(), std::memory_order_relaxed);
  }
  void Add(std::int64_t d) override { cells_.Add(static_cast<std::uint64_t>(d)); }
  std::int64_t Value() const override {
    return static_cast<std::int64_t>(base_.load(std::memory_order_relaxed) + cells_.Sum());
  }

 private:
  StripedSum cells_;
  std::atomic<std::uint64_t> base_{0};
};

class HistogramImpl final : public Histogram {
 public:
  // `bounds` are finite and strictly increasing; the +Inf bucket is implicit.
  explicit HistogramImpl(std::vector<double> bounds)
      : bounds_(std::move(bounds)),
        stride_((1 + bounds_.size() + 1 + kWordsPerLine - 1) / kWordsPerLine),
        lines_(new Line[kStripes * stride_]()) {}

  void Observe(double value) override {
    // The first bucket whose bound is >= value; NaN goes to +Inf, as in client_golang.
    std::size_t bucket = static_cast<std::size_t>(
        std::partition_point(bounds_.begin(), bounds_.end(),
                             [value](double bound) { return !(value <= bound); }) -
        bounds_.begin());
    std::size_t stripe = ThisThreadStripe();
    Word(stripe, 1 + bucket).fetch_add(1, std::memory_order_relaxed);
    // The stripe is (almost always) this thread's alone, so the CAS succeeds first time.
    std::atomic<std::uint64_t>& sum = Word(stripe, 0);
    std::uint64_t old = sum.load(std::memory_order_relaxed);
    while (!sum.compare_exchange_weak(
        old, std::bit_cast<std::uint64_t>(std::bit_cast<double>(old) + value),
        std::memory_order_relaxed)) {
    }
  }

  std::uint64_t Count() const override {
    std::uint64_t count = 0;
    for (std::size_t s = 0; s < kStripes; ++s) {
      for (std::size_t b = 0; b <= bounds_.size(); ++b) {
        count += Word(s, 1 + b).load(std::memory_order_relaxed);
      }
    }
    return count;
  }

  double Sum() const override {
    double sum = 0;
    for (std::size_t s = 0; s < kStripes; ++s) {
      sum += std::bit_cast<double>(Word(s, 0).load(std::memory_order_relaxed));
    }
    return sum;
  }

  // Cumulative count per bucket, one per bound then +Inf (which is the count).
  std::vector<std::uint64_t> CumulativeCounts() const {
    std::vector<std::uint64_t> counts(bounds_.size() + 1, 0);
    for (std::size_t s = 0; s < kStripes; ++s) {
      for (std::size_t b = 0; b < counts.size(); ++b) {
        counts[b] += Word(s, 1 + b).load(std::memory_order_relaxed);
      }
    }
    for (std::size_t b = 1; b < counts.size(); ++b) counts[b] += counts[b - 1];
    return counts;
  }

  const std::vector<double>& bounds() const { return bounds_; }

 private:
  static constexpr std::size_t kWordsPerLine = kCacheLine / sizeof(std::uint64_t);
  struct alignas(kCacheLine) Line {
    std::array<std::atomic<std::uint64_t>, kWordsPerLine> w;
  };

  // Stripe s owns lines [s * stride_, (s + 1) * stride_). Word 0 holds the sum (the bits of a
  // double), words 1..bounds+1 the per-bucket (not cumulative) counts, the last one +Inf.
  // There is no separate count: it is the sum of the buckets, so in every scrape _count
  // equals the +Inf bucket, and Observe does one atomic add less.
  std::atomic<std::uint64_t>& Word(std::size_t stripe, std::size_t i) const {
    return lines_[stripe * stride_ + i / kWordsPerLine].w[i % kWordsPerLine];
  }

  const std::vector<double> bounds_;
  const std::size_t stride_;  // lines per stripe
  const std::unique_ptr<Line[]> lines_;
};

// ---- Names, labels and the text format ----

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Names beginning with "__" are reserved for Prometheus itself.
bool IsValidLabelName(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

void AppendEscaped(std::string& out, std::string_view s, bool escape_quote) {
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '"':
        if (escape_quote) {
          out += "\\\"";
        } else {
          out += c;
        }
        break;
      default:
        out += c;
    }
  }
}

// `a="x",b="y"` in the given order.
std::string LabelsText(const Labels& labels) {
  std::string out;
  for (const auto& [name, value] : labels) {
    if (!out.empty()) out += ',';
    out += name;
    out += "=\"";
    AppendEscaped(out, value, /*escape_quote=*/true);
    out += '"';
  }
  return out;
}

void AppendUint(std::string& out, std::uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}

void AppendInt(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}

// The shortest text that parses back to `v`: plain decimals for 1e-4 <= |v| < 1e21 (so
// integral values print as integers), exponent form otherwise, and NaN, +Inf, -Inf. This is
// Go's strconv 'g' format (what Prometheus parses with), except Go switches to exponents at
// 1e6 already.
void AppendDouble(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
    return;
  }
  double abs = std::fabs(v);
  std::chars_format format = (abs == 0 || (abs >= 1e-4 && abs < 1e21))
                                 ? std::chars_format::fixed
                                 : std::chars_format::scientific;
  char buf[32];  // the longest output, "-1.2345678901234567e-308", has 24
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, format);
  IDEM_CHECK(ec == std::errc());
  out.append(buf, end);
}

// One sample line: name[suffix]{labels[,extra]} value.
void AppendSeriesName(std::string& out, std::string_view name, std::string_view suffix,
                      std::string_view labels, std::string_view extra_label = {}) {
  out += name;
  out += suffix;
  if (labels.empty() && extra_label.empty()) {
    out += ' ';
    return;
  }
  out += '{';
  out += labels;
  if (!labels.empty() && !extra_label.empty()) out += ',';
  out += extra_label;
  out += "} ";
}

enum class Type { kCounter, kGauge, kHistogram };

std::string_view TypeName(Type type) {
  switch (type) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

constexpr std::array<std::string_view, 3> kHistogramSuffixes = {"_bucket", "_sum", "_count"};

using ReadFn = std::shared_ptr<const std::function<double()>>;

// Exactly one of counter, gauge, histogram, read is set, fixed at registration, except that
// `read` is replaced when a callback gauge is registered again.
struct Series {
  std::string labels_text;  // escaped, in first registration order
  std::unique_ptr<CounterImpl> counter;
  std::unique_ptr<GaugeImpl> gauge;
  std::unique_ptr<HistogramImpl> histogram;
  ReadFn read;  // guarded by Registry::Impl::mu
};

struct Family {
  std::string name;
  std::string help;
  Type type;
  std::vector<double> bounds;                             // histograms only
  std::vector<std::unique_ptr<Series>> series;            // registration order
  std::map<std::string, Series*, std::less<>> by_labels;  // key: LabelsText of sorted labels
};

}  // namespace

struct Registry::Impl {
  mutable std::mutex mu;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families;  // guarded by mu

  // The series for name + labels, created empty (all members null) if new. Checks the name,
  // labels, type, help and (histograms) bounds. Requires mu.
  Series& Find(std::string_view name, std::string_view help, Type type, const Labels& labels,
               const std::vector<double>* bounds) {
    IDEM_CHECK_MSG(IsValidMetricName(name), std::string("bad metric name: ") += name);
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const std::string& label = labels[i].first;
      IDEM_CHECK_MSG(IsValidLabelName(label), "bad label name: " + label);
      IDEM_CHECK_MSG(!(type == Type::kHistogram && label == "le"),
                     "histogram label named le: " + label);
      for (std::size_t j = 0; j < i; ++j) {
        IDEM_CHECK_MSG(labels[j].first != label, "duplicate label name: " + label);
      }
    }

    auto it = families.find(name);
    if (it == families.end()) {
      CheckNoClash(name, type);
      auto family = std::make_unique<Family>();
      family->name = std::string(name);
      family->help = std::string(help);
      family->type = type;
      if (bounds != nullptr) family->bounds = *bounds;
      it = families.emplace(family->name, std::move(family)).first;
    }
    Family& family = *it->second;
    IDEM_CHECK_MSG(family.type == type,
                   std::string("metric registered with another type: ") += name);
    IDEM_CHECK_MSG(family.help == help,
                   std::string("metric registered with another help text: ") += name);
    // All series of a histogram share bounds, so `sum by (le)` works across them.
    IDEM_CHECK_MSG(bounds == nullptr || family.bounds == *bounds,
                   std::string("histogram registered with other bounds: ") += name);

    Labels sorted = labels;
    std::sort(sorted.begin(), sorted.end());
    std::string key = LabelsText(sorted);
    auto series_it = family.by_labels.find(key);
    if (series_it != family.by_labels.end()) return *series_it->second;
    family.series.push_back(std::make_unique<Series>());
    Series& series = *family.series.back();
    series.labels_text = LabelsText(labels);
    family.by_labels.emplace(std::move(key), &series);
    return series;
  }

  // A histogram `h` writes h_bucket, h_sum and h_count: no other family may use those names.
  void CheckNoClash(std::string_view name, Type type) const {
    for (std::string_view suffix : kHistogramSuffixes) {
      if (type == Type::kHistogram) {
        IDEM_CHECK_MSG(!families.contains(std::string(name) += suffix),
                       std::string("histogram name clashes with ") += std::string(name) += suffix);
      }
      if (name.ends_with(suffix)) {
        auto base = families.find(name.substr(0, name.size() - suffix.size()));
        IDEM_CHECK_MSG(base == families.end() || base->second->type != Type::kHistogram,
                       std::string("metric name clashes with a histogram: ") += name);
      }
    }
  }
};

std::vector<double> DefaultLatencyBuckets() {
  return {1e-5,  2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
          0.025, 0.05,   0.1,  0.25, 0.5,    1,    2.5,  5,      10};
}

Registry::Registry() : impl_(std::make_unique<Impl>()) {}
Registry::~Registry() = default;

Counter& Registry::AddCounter(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Series& series = impl_->Find(name, help, Type::kCounter, labels, nullptr);
  if (series.counter == nullptr) series.counter = std::make_unique<CounterImpl>();
  return *series.counter;
}

Gauge& Registry::AddGauge(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Series& series = impl_->Find(name, help, Type::kGauge, labels, nullptr);
  IDEM_CHECK_MSG(series.read == nullptr,
                 std::string("gauge already registered as a callback: ") += name);
  if (series.gauge == nullptr) series.gauge = std::make_unique<GaugeImpl>();
  return *series.gauge;
}

Histogram& Registry::AddHistogram(std::string_view name, std::string_view help,
                                  const Labels& labels, std::vector<double> bounds) {
  // A trailing +Inf is implicit; every other bound is finite and above the one before.
  if (!bounds.empty() && bounds.back() == std::numeric_limits<double>::infinity()) {
    bounds.pop_back();
  }
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    IDEM_CHECK_MSG(std::isfinite(bounds[i]), "histogram bound is not finite");
    IDEM_CHECK_MSG(i == 0 || bounds[i - 1] < bounds[i], "histogram bounds not increasing");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  Series& series = impl_->Find(name, help, Type::kHistogram, labels, &bounds);
  if (series.histogram == nullptr) series.histogram = std::make_unique<HistogramImpl>(bounds);
  return *series.histogram;
}

void Registry::AddGaugeCallback(std::string_view name, std::string_view help, const Labels& labels,
                                std::function<double()> read) {
  IDEM_CHECK_MSG(read != nullptr, "empty gauge callback");
  auto fn = std::make_shared<const std::function<double()>>(std::move(read));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Series& series = impl_->Find(name, help, Type::kGauge, labels, nullptr);
  IDEM_CHECK_MSG(series.gauge == nullptr,
                 std::string("callback gauge already registered as a gauge: ") += name);
  // Registering again replaces the callback (e.g. a store was reopened).
  series.read = std::move(fn);
}

std::string Registry::RenderPrometheus() const {
  // Snapshot the families under the lock, then read values and call callbacks without it:
  // a callback may be slow or register metrics itself. Families, series and metrics are
  // never destroyed before the registry, and their fields other than `read` never change.
  struct SeriesView {
    const Series* series;
    ReadFn read;
  };
  struct FamilyView {
    const Family* family;
    std::vector<SeriesView> series;
  };
  std::vector<FamilyView> views;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    views.reserve(impl_->families.size());
    for (const auto& [name, family] : impl_->families) {
      FamilyView& view = views.emplace_back(FamilyView{family.get(), {}});
      view.series.reserve(family->series.size());
      for (const auto& series : family->series) view.series.push_back({series.get(), series->read});
    }
  }

  std::string out;
  std::string le;
  for (const FamilyView& view : views) {
    const Family& family = *view.family;
    out += "# HELP ";
    out += family.name;
    out += ' ';
    AppendEscaped(out, family.help, /*escape_quote=*/false);
    out += "\n# TYPE ";
    out += family.name;
    out += ' ';
    out += TypeName(family.type);
    out += '\n';
    for (const SeriesView& sv : view.series) {
      const Series& s = *sv.series;
      if (s.counter != nullptr) {
        AppendSeriesName(out, family.name, "", s.labels_text);
        AppendUint(out, s.counter->Value());
      } else if (s.gauge != nullptr) {
        AppendSeriesName(out, family.name, "", s.labels_text);
        AppendInt(out, s.gauge->Value());
      } else if (sv.read != nullptr) {
        AppendSeriesName(out, family.name, "", s.labels_text);
        AppendDouble(out, (*sv.read)());
      } else {
        const HistogramImpl& h = *s.histogram;
        // _sum may miss or include an Observe racing this scrape that the buckets do not;
        // _count is the +Inf bucket by construction.
        std::vector<std::uint64_t> counts = h.CumulativeCounts();
        double sum = h.Sum();
        for (std::size_t b = 0; b < counts.size(); ++b) {
          le = "le=\"";
          if (b < h.bounds().size()) {
            AppendDouble(le, h.bounds()[b]);
          } else {
            le += "+Inf";
          }
          le += '"';
          AppendSeriesName(out, family.name, "_bucket", s.labels_text, le);
          AppendUint(out, counts[b]);
          out += '\n';
        }
        AppendSeriesName(out, family.name, "_sum", s.labels_text);
        AppendDouble(out, sum);
        out += '\n';
        AppendSeriesName(out, family.name, "_count", s.labels_text);
        AppendUint(out, counts.back());
      }
      out += '\n';
    }
  }
  return out;
}

// ---- The standard set ----

namespace {
constexpr std::string_view kBeginHelp = "Begin calls by answer.";
constexpr std::string_view kCompleteHelp = "Completions by outcome.";
constexpr std::string_view kStoreOpHelp = "Store operation time in seconds, by operation.";
}  // namespace

Metrics::Metrics(Registry& registry, std::string_view scope) {
  const std::string s(scope);
  auto begin = [&](const char* answer) {
    return &registry.AddCounter("idem_begin_total", kBeginHelp, {{"scope", s}, {"answer", answer}});
  };
  auto complete = [&](const char* outcome) {
    return &registry.AddCounter("idem_complete_total", kCompleteHelp,
                                {{"scope", s}, {"outcome", outcome}});
  };
  auto counter = [&](std::string_view name, std::string_view help) {
    return &registry.AddCounter(name, help, {{"scope", s}});
  };
  auto store_op = [&](const char* op) {
    return &registry.AddHistogram("idem_store_op_seconds", kStoreOpHelp,
                                  {{"scope", s}, {"op", op}});
  };
  begin_acquired = begin("acquired");
  begin_replay = begin("replay");
  begin_busy = begin("busy");
  begin_conflict = begin("conflict");
  begin_stale = begin("stale");
  complete_success = complete("success");
  complete_failure = complete("failure");
  releases = counter("idem_release_total", "Keys released so that a retry runs again.");
  takeovers = counter("idem_lease_takeover_total", "Acquires that took over an expired lease.");
  lease_lost = counter("idem_lease_lost_total", "Writes refused because the lease was lost.");
  store_errors = counter("idem_store_errors_total", "Store calls that returned an error.");
  dlq_sends = counter("idem_dlq_total", "Messages sent to the dead-letter queue.");
  coalesced = counter("idem_coalesced_total", "Duplicates answered by an in-process wait.");
  handler_seconds =
      &registry.AddHistogram("idem_handler_seconds", "Handler time in seconds.", {{"scope", s}});
  store_begin_seconds = store_op("begin");
  store_complete_seconds = store_op("complete");
  store_release_seconds = store_op("release");
  store_extend_seconds = store_op("extend");
}

}  // namespace idem
