// Log entries: the payloads of the log's frames. Every entry is a full image (or a removal)
// of one thing, so replaying the log in order rebuilds the state, and replaying an entry twice
// changes nothing. No I/O here; DecodeEntry is fuzzed (fuzz/log_decoder_fuzz.cc).
#ifndef IDEM_STORES_LOG_CODEC_H_
#define IDEM_STORES_LOG_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/journal.h"
#include "idem/fingerprint.h"
#include "idem/status.h"
#include "stores/log/batch.h"

namespace idem::log {

using EntryType = core::ChangeType;
using Entry = core::Change;

// The longest scope, key, client id or entity name an entry holds.
inline constexpr std::size_t kMaxNameBytes = 65535;
// What a record entry holds besides its response, at most: scope and name (each a varint
// length and up to kMaxNameBytes), a sequence number, flags, three times, token and attempt, a
// fingerprint, and the response's varint length.
inline constexpr std::size_t kMaxRecordOverhead =
    2 * (10 + kMaxNameBytes) + 10 + 1 + 3 * 10 + 10 + 5 + 32 + 10;
// The longest response the log stores: with any scope and name it still fits in one frame, so
// every record written can be read back. The store refuses longer ones before changing
// anything.
inline constexpr std::size_t kMaxResponseBytes = kMaxFrameBytes - kMaxRecordOverhead;

// Appends the payload of `e` (fields not used by its type are ignored).
void EncodeEntry(const Entry& e, std::string* out);

// kDataLoss with a description when the payload is not a well-formed entry of that type.
Status DecodeEntry(std::uint8_t type, std::string_view payload, Entry* out);

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_CODEC_H_
