// StoreGauges: the gauges of SPEC §7 that describe a store's contents, in a Registry:
//
//   idem_records{state="in_progress"|"completed"}   records by state
//   idem_sessions, idem_entities                     client sessions, versioned entities
//   idem_store_bytes                                 memory or disk the store uses (its estimate)
//   idem_store_stats_refresh_timestamp_seconds       when they were last read (Unix time)
//
// They come from Store::Stats(), called by a thread of their own every `interval`, never by
// a scrape: a scrape must not wait on the store (the Redis store's Stats reads every key; the
// PostgreSQL store's counts the table). A refresh that fails keeps the last figures (the
// timestamp stays too: alert on time() - it) and counts idem_store_stats_errors_total. The
// registry may outlive this object: it only holds plain gauges.
//
//   idem::StoreGauges gauges(*store, registry);   // refreshes until destroyed
#ifndef IDEM_STORE_GAUGES_H_
#define IDEM_STORE_GAUGES_H_

#include <chrono>
#include <memory>

#include "idem/metrics.h"
#include "idem/store.h"

namespace idem {

class StoreGauges {
 public:
  // The first refresh runs at once (on the thread); `interval` must be positive.
  StoreGauges(Store& store, Registry& registry,
              std::chrono::milliseconds interval = std::chrono::seconds(30));
  ~StoreGauges();  // stops and joins the thread
  StoreGauges(const StoreGauges&) = delete;
  StoreGauges& operator=(const StoreGauges&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem

#endif  // IDEM_STORE_GAUGES_H_
