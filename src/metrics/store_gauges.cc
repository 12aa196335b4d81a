#include "idem/store_gauges.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/thread_name.h"
#include "idem/status.h"

namespace idem {

struct StoreGauges::Impl {
  Impl(Store& s, Registry& r, std::chrono::milliseconds every)
      : store(s),
        interval(every),
        in_progress(r.AddGauge("idem_records", "Records in the store, by state.",
                               {{"state", "in_progress"}})),
        completed(r.AddGauge("idem_records", "Records in the store, by state.",
                             {{"state", "completed"}})),
        sessions(r.AddGauge("idem_sessions", "Client sessions in the store.")),
        entities(r.AddGauge("idem_entities", "Versioned entities in the store.")),
        bytes(r.AddGauge("idem_store_bytes",
                         "Memory or disk the store uses for its records (its estimate).")),
        errors(r.AddCounter("idem_store_stats_errors_total",
                            "Refreshes of the store gauges that failed (the last figures stay).")),
        refreshed(r.AddGauge("idem_store_stats_refresh_timestamp_seconds",
                             "Unix time of the last refresh of the store gauges (0: none yet).")) {}

  void Refresh() {
    Result<StoreStats> s = store.Stats();
    if (!s) {
      errors.Inc();
      return;
    }
    in_progress.Set(static_cast<std::int64_t>(s->in_progress));
    completed.Set(static_cast<std::int64_t>(s->completed));
    sessions.Set(static_cast<std::int64_t>(s->sessions));
    entities.Set(static_cast<std::int64_t>(s->entities));
    bytes.Set(static_cast<std::int64_t>(s->bytes));
    refreshed.Set(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
  }

  void Loop() {
    std::unique_lock lock(mu);
    while (!stopping) {
      lock.unlock();
      Refresh();
      lock.lock();
      cv.wait_for(lock, interval, [this] { return stopping; });
    }
  }

  Store& store;
  const std::chrono::milliseconds interval;
  Gauge& in_progress;
  Gauge& completed;
  Gauge& sessions;
  Gauge& entities;
  Gauge& bytes;
  Counter& errors;
  Gauge& refreshed;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;
};

StoreGauges::StoreGauges(Store& store, Registry& registry, std::chrono::milliseconds interval)
    : impl_(std::make_unique<Impl>(store, registry, interval)) {
  IDEM_CHECK_MSG(interval.count() > 0, "StoreGauges: the interval must be positive");
  impl_->thread = std::thread([impl = impl_.get()] {
    core::NameThisThread("idem-gauges");
    impl->Loop();
  });
}

StoreGauges::~StoreGauges() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

}  // namespace idem
