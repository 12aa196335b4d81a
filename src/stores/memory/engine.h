// The memory store's engine, for stores built on it: the embedded log store journals every
// change the engine makes (core::Journal), replays its log into the engine on open (Apply),
// and compacts by writing the engine's live state out (Snapshot).
#ifndef IDEM_STORES_MEMORY_ENGINE_H_
#define IDEM_STORES_MEMORY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "core/journal.h"
#include "idem/store.h"
#include "idem/stores/memory.h"

namespace idem::memory_internal {

class Engine : public Store {
 public:
  // `journal` (may be null) hears every change and must outlive the engine. With a journal,
  // every answer waits until the change behind it, or the state it read, is durable, and a
  // failed journal makes every call fail closed.
  static std::unique_ptr<Engine> Create(const MemoryStoreOptions& options, core::Journal* journal);

  // Recovery, before the engine serves callers: applies one change image without journaling
  // it. Applying a log's images in order gives the state they describe; what is expired by the
  // clock may stay (a session image is kept even if expired, since a later image of the same
  // session may refresh it) and behaves as absent, so call Purge() once every image is applied
  // to reclaim it. Not thread-safe with other calls.
  virtual Status Apply(const core::Change& change) = 0;
  // Every token handed out from now on is above `floor`.
  virtual void RaiseTokenFloor(std::uint64_t floor) = 0;
  // Above every token handed out or restored so far.
  virtual std::uint64_t MaxToken() = 0;
  // Calls `sink` with an image of every live record, session (then its records) and entity.
  // Shard locks are held only to copy a slice out, never while `sink` runs; changes made
  // meanwhile may or may not be seen (a journal records them anyway).
  virtual Status Snapshot(const std::function<Status(const core::Change&)>& sink) = 0;
};

// What Store::StartBatch answers, computed with the blocking calls: the completions, then the
// begins (a begin of a key completed in the same call replays it).
inline BatchAnswers CompleteThenBegin(Store& store, std::span<const BeginRequest> begins,
                                      std::span<const CompleteRequest> completes) {
  BatchAnswers answers;
  if (!completes.empty()) answers.completes = store.CompleteBatch(completes);
  if (!begins.empty()) answers.begins = store.BeginBatch(begins);
  return answers;
}

}  // namespace idem::memory_internal

#endif  // IDEM_STORES_MEMORY_ENGINE_H_
