// Journal: how a durable store hears about every change the in-memory engine makes.
//
// The memory store's engine calls Record() with the record's shard lock held, right after a
// decision changed the in-memory state, and Wait() after releasing the lock and before giving
// the caller its answer. An answer that changed nothing (Busy, Replay, a read) waits for
// Last(), so no caller ever sees state that is not yet durable. The embedded log store is a
// Journal over its log writer; the plain memory store has none.
#ifndef IDEM_CORE_JOURNAL_H_
#define IDEM_CORE_JOURNAL_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/machine.h"
#include "idem/fingerprint.h"
#include "idem/status.h"

namespace idem::core {

enum class ChangeType : std::uint8_t {
  kRecordPut = 1,      // scope, name=key, record (+ fingerprint, response)
  kRecordDelete = 2,   // scope, name=key
  kSessionPut = 3,     // scope, name=client, session; its records at or below low water are gone
  kSessionDelete = 4,  // scope, name=client
  kSeqPut = 5,         // scope, name=client, seq, record
  kSeqDelete = 6,      // scope, name=client, seq
  kEntityPut = 7,      // scope, name=entity, entity
  kEntityDelete = 8,   // scope, name=entity
  kTokenFloor = 9,     // every token handed out from now on is above token_floor
};

// A full image of one thing (or its removal), so replaying changes in order rebuilds the
// state and replaying one twice changes nothing. string_views are borrowed.
struct Change {
  ChangeType type = ChangeType::kRecordPut;
  std::string_view scope;
  std::string_view name;
  std::uint64_t seq = 0;
  RecordHead record;
  std::optional<Fingerprint> fingerprint;
  std::string_view response;
  SessionHead session;
  EntityHead entity;
  std::uint64_t token_floor = 0;
};

class Journal {
 public:
  virtual ~Journal() = default;
  // Must not block on I/O: called under a shard lock. Returns a ticket to Wait() on. Changes
  // recorded with the same `lane` (the engine passes its shard's number) keep their order on
  // replay; changes in different lanes may be replayed in either order, so all changes of one
  // thing (a record, a session and its records, an entity) must go through one lane.
  virtual std::uint64_t Record(const Change& change, std::uint32_t lane) = 0;
  // The ticket of the newest change recorded (0: none).
  virtual std::uint64_t Last() = 0;
  // Blocks until `ticket` is durable. Non-ok: the answer must not be given (fail closed).
  virtual Status Wait(std::uint64_t ticket) = 0;
  // Non-ok once the journal failed; the store then refuses every call.
  virtual Status health() = 0;
  // A batch: the changes this thread records until EndGroup() go to durability together
  // (the log store does not start a sync for the first of them alone). Every BeginGroup() is
  // followed by an EndGroup() before the thread Waits.
  virtual void BeginGroup() {}
  virtual void EndGroup() {}
};

}  // namespace idem::core

#endif  // IDEM_CORE_JOURNAL_H_
