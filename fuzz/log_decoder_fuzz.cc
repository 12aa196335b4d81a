// Fuzz target for the log store's decoder: what it reads back from disk is untrusted.
// Byte 0 picks the mode:
//   even: bytes 2.. are an entry payload of type byte 1; a decoded entry must re-encode to
//         an entry that decodes to the same fields.
//   odd:  bytes 1.. follow a valid file header; ScanLog and SalvageLog must not crash, and
//         salvage keeps at least what a scan reads.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "stores/log/batch.h"
#include "stores/log/codec.h"

namespace {

bool SameEntry(const idem::log::Entry& a, const idem::log::Entry& b) {
  auto ms = [](idem::Timestamp t) { return t.time_since_epoch().count(); };
  return a.type == b.type && a.scope == b.scope && a.name == b.name && a.seq == b.seq &&
         a.record.state == b.record.state && a.record.outcome == b.record.outcome &&
         a.record.token == b.record.token && a.record.attempt == b.record.attempt &&
         ms(a.record.created) == ms(b.record.created) &&
         ms(a.record.lease_deadline) == ms(b.record.lease_deadline) &&
         ms(a.record.expires) == ms(b.record.expires) && a.fingerprint == b.fingerprint &&
         a.response == b.response && a.session.low_water == b.session.low_water &&
         a.session.window == b.session.window && a.session.ttl == b.session.ttl &&
         ms(a.session.expires) == ms(b.session.expires) && a.entity.applied == b.entity.applied &&
         a.entity.in_progress == b.entity.in_progress && a.entity.token == b.entity.token &&
         a.entity.attempt == b.entity.attempt && a.token_floor == b.token_floor;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if ((data[0] & 1) == 0) {
    idem::log::Entry e;
    if (!idem::log::DecodeEntry(data[1], in.substr(2), &e).ok()) return 0;
    std::string again;
    idem::log::EncodeEntry(e, &again);
    idem::log::Entry e2;
    if (!idem::log::DecodeEntry(data[1], again, &e2).ok() || !SameEntry(e, e2)) std::abort();
    return 0;
  }
  // Salt 0: the checksums are plain CRC-32C, so the saved corpus (written before stores had a
  // salt) still reaches the frame decoder.
  constexpr std::uint64_t kSalt = 0;
  std::string file = idem::log::FileHeader(kSalt);
  file.append(in.substr(1));
  std::uint64_t scanned = 0, salvaged = 0;
  auto scan = idem::log::ScanLog(file, kSalt, 0, [&](const idem::log::Frame&) {
    ++scanned;
    return idem::OkStatus();
  });
  auto salvage = idem::log::SalvageLog(file, kSalt, [&](const idem::log::Frame&) {
    ++salvaged;
    return idem::OkStatus();
  });
  if (!scan || !salvage || salvaged < scanned) std::abort();
  return 0;
}
