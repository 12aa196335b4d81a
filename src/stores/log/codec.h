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

namespace idem::log {

using EntryType = core::ChangeType;
using Entry = core::Change;

// Appends the payload of `e` (fields not used by its type are ignored).
void EncodeEntry(const Entry& e, std::string* out);

// kDataLoss with a description when the payload is not a well-formed entry of that type.
Status DecodeEntry(std::uint8_t type, std::string_view payload, Entry* out);

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_CODEC_H_
