#include "stores/log/batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "stores/log/codec.h"
#include "stores/log/crc32c.h"
#include "stores/log/files.h"

namespace idem::log {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 test vectors.
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  std::string ones(32, '\xFF');
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  // Incremental equals one shot.
  EXPECT_EQ(Crc32c(Crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

// A store's salt, as NewSalt() would choose it.
constexpr std::uint64_t kSalt = 0x5EED5A175A17F00Dull;

// A file of `batches` batches, batch i holding i+1 frames "b<i>f<j>".
std::string MakeFile(int batches, std::vector<std::uint64_t>* batch_offsets = nullptr) {
  std::string file = FileHeader(kSalt);
  BatchBuilder b(kSalt);
  for (int i = 0; i < batches; ++i) {
    b.Clear();
    for (int j = 0; j <= i; ++j) {
      b.Add(1, "b" + std::to_string(i) + "f" + std::to_string(j) + std::string(20, 'x'));
    }
    if (batch_offsets) batch_offsets->push_back(file.size());
    file.append(b.Finish(static_cast<std::uint64_t>(i + 1)));
  }
  return file;
}

std::vector<std::string> Frames(std::string_view file, ScanResult* r) {
  std::vector<std::string> out;
  auto res = ScanLog(file, kSalt, 0, [&](const Frame& f) {
    out.emplace_back(f.payload);
    return OkStatus();
  });
  EXPECT_TRUE(res) << res.error().ToString();
  if (res) *r = *res;
  return out;
}

TEST(Batch, RoundTrip) {
  std::string file = MakeFile(5);
  ASSERT_TRUE(CheckFileHeader(file, "f", kSalt).ok());
  ScanResult r;
  auto frames = Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kClean);
  EXPECT_EQ(r.batches, 5u);
  EXPECT_EQ(r.frames, 15u);
  EXPECT_EQ(r.last_seq, 5u);
  EXPECT_EQ(r.valid_end, file.size());
  ASSERT_EQ(frames.size(), 15u);
  EXPECT_EQ(frames[0].substr(0, 4), "b0f0");
  EXPECT_EQ(frames[14].substr(0, 4), "b4f4");
}

TEST(Batch, HeaderErrorsNameTheFile) {
  Status s = CheckFileHeader("garbage-garbage-garbage", "/data/000001.log", kSalt);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("/data/000001.log offset 0"));
  std::string other = FileHeader(kSalt);
  other[8] = 4;  // version 4, with its checksum fixed up
  std::uint32_t crc = Crc32c(0, other.data(), 20);
  std::memcpy(other.data() + 20, &crc, 4);
  s = CheckFileHeader(other, "f", kSalt);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("version 4"));
  // Version 2 (no sync marks) is read.
  other = FileHeader(kSalt);
  other[8] = 2;
  crc = Crc32c(0, other.data(), 20);
  std::memcpy(other.data() + 20, &crc, 4);
  EXPECT_TRUE(CheckFileHeader(other, "f", kSalt).ok());
  // A bit flipped in the salt: the header's own checksum fails.
  other = FileHeader(kSalt);
  other[kSaltOffset] ^= 0x01;
  EXPECT_EQ(CheckFileHeader(other, "f", kSalt).code(), StatusCode::kDataLoss);
}

TEST(Batch, AVersion1HeaderIsRefusedByVersion) {
  // The unreleased format 1: magic, version, crc32c of those 12 bytes.
  std::string v1 = std::string("IDEMLOG\0", 8) + std::string(8, '\0');
  v1[8] = 1;
  std::uint32_t crc = Crc32c(0, v1.data(), 12);
  std::memcpy(v1.data() + 12, &crc, 4);
  auto s = ReadFileHeader(v1 + std::string(100, 'x'), "/data/000001.log");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.error().message(),
              ::testing::AllOf(HasSubstr("/data/000001.log"), HasSubstr("version 1"),
                               HasSubstr("versions 2 to 3")));
}

// The header's checksum is checked before its version is believed: a flipped bit in the version
// field is damage, and a header whose checksum holds names its version, whatever it is.
TEST(Batch, AHeaderIsCheckedBeforeItsVersionIsBelieved) {
  for (const int byte : {8, 9, 10, 11}) {
    std::string h = FileHeader(kSalt);
    h[byte] ^= 0x01;
    auto s = ReadFileHeader(h, "/data/000002.log");
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), StatusCode::kDataLoss) << byte;
    EXPECT_THAT(s.error().message(),
                AllOf(HasSubstr("/data/000002.log offset 0: bad header (its checksum fails)"),
                      Not(HasSubstr("version"))));
  }
  for (const std::uint32_t version : {0u, 1u, 4u, 259u}) {
    std::string h = FileHeader(kSalt);
    std::memcpy(h.data() + 8, &version, 4);
    const std::uint32_t crc = Crc32c(0, h.data(), 20);
    std::memcpy(h.data() + 20, &crc, 4);
    auto s = ReadFileHeader(h, "/data/000002.log");
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().code(), StatusCode::kFailedPrecondition) << version;
    EXPECT_THAT(s.error().message(), AllOf(HasSubstr("/data/000002.log"),
                                           HasSubstr("version " + std::to_string(version)),
                                           HasSubstr("versions 2 to 3")));
  }
  // A damaged magic byte is damage too.
  std::string h = FileHeader(kSalt);
  h[3] ^= 0x20;
  auto s = ReadFileHeader(h, "f");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), StatusCode::kDataLoss);
}

// A damaged header's salt field is the file's salt when the batch after the header checks out
// under it; repair uses it when no file has a good header.
TEST(Batch, TheSaltOfADamagedHeaderIsTakenOnlyWhenItsBatchesCheckOut) {
  std::string file = MakeFile(2);
  file[3] ^= 0x20;
  EXPECT_EQ(SaltOfDamagedHeader(file), kSalt);
  file[kSaltOffset] ^= 0x01;
  EXPECT_EQ(SaltOfDamagedHeader(file), std::nullopt);
  EXPECT_EQ(SaltOfDamagedHeader(FileHeader(kSalt)), std::nullopt);  // no batch to check
}

TEST(Batch, AFileWithAnotherSaltIsDamageNamingTheFile) {
  const std::string file = MakeFile(2);
  auto salt = ReadFileHeader(file, "f");
  ASSERT_TRUE(salt);
  EXPECT_EQ(*salt, kSalt);
  Status s = CheckFileHeader(file, "/data/000002.log", kSalt + 1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("/data/000002.log offset " + std::to_string(kSaltOffset)));
  // Its batches do not verify under another salt either.
  auto r = ScanLog(file, kSalt + 1, 0, [](const Frame&) { return OkStatus(); });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->batches, 0u);
  EXPECT_NE(r->end, ScanResult::End::kClean);
}

TEST(Batch, NewSaltsAreRandomAndNeverPlainCrc) {
  std::uint64_t a = NewSalt(), b = NewSalt();
  EXPECT_NE(a, b);
  EXPECT_NE(ChecksumSeed(a), 0u);
  EXPECT_NE(ChecksumSeed(b), 0u);
}

// A frame's payload (a stored response) holding a whole batch built without the store's salt,
// as a client could send it: when a crash tears the batch around it, the scan must not take
// it for an intact batch (that would make the torn tail look like damage), and salvage must
// not keep its frames.
TEST(Batch, ABatchInsideAPayloadNeverVerifies) {
  for (std::uint64_t forger_salt : {std::uint64_t{0}, kSalt + 1}) {
    SCOPED_TRACE(forger_salt);
    BatchBuilder forger(forger_salt);
    forger.Add(1, "forged-frame" + std::string(40, 'f'));
    const std::string forged(forger.Finish(4));  // the seq the next batch would have
    std::vector<std::uint64_t> offsets;
    std::string file = MakeFile(3, &offsets);
    BatchBuilder b(kSalt);
    b.Add(1, "x" + forged + "tail of the response" + std::string(600, 'r'));
    const std::size_t last = file.size();
    file.append(b.Finish(4));
    // Torn by a crash just after the embedded batch.
    const std::size_t cut = file.find(forged) + forged.size();
    ASSERT_LT(cut, file.size());
    const std::string torn = file.substr(0, cut);
    ScanResult r;
    auto frames = Frames(torn, &r);
    EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
    EXPECT_EQ(r.valid_end, last);
    EXPECT_EQ(r.batches, 3u);
    EXPECT_THAT(frames, ::testing::Not(::testing::Contains(HasSubstr("forged"))));
    std::vector<std::string> kept;
    auto salvaged = SalvageLog(torn, kSalt, [&](const Frame& f) {
      kept.emplace_back(f.payload);
      return OkStatus();
    });
    ASSERT_TRUE(salvaged);
    EXPECT_EQ(salvaged->frames_kept, 6u);
    EXPECT_THAT(kept, ::testing::Not(::testing::Contains(HasSubstr("forged"))));
  }
}

TEST(Batch, EveryTruncationIsATornTailThatKeepsWholeBatches) {
  std::vector<std::uint64_t> offsets;
  std::string file = MakeFile(6, &offsets);
  for (std::size_t cut = kFileHeaderSize; cut < file.size(); ++cut) {
    ScanResult r;
    auto frames = Frames(std::string_view(file).substr(0, cut), &r);
    // Whole batches before the cut survive; the partial one is a torn tail.
    std::size_t whole = 0;
    while (whole < offsets.size() &&
           (whole + 1 == offsets.size() ? file.size() : offsets[whole + 1]) <= cut)
      ++whole;
    EXPECT_EQ(r.batches, whole) << cut;
    bool at_boundary = cut == offsets[whole];
    EXPECT_EQ(r.end, at_boundary ? ScanResult::End::kClean : ScanResult::End::kTornTail) << cut;
    EXPECT_EQ(r.valid_end, offsets[whole]) << cut;
  }
}

TEST(Batch, DamageBeforeIntactDataIsNotATornTail) {
  std::vector<std::uint64_t> offsets;
  std::string file = MakeFile(6, &offsets);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string damaged = file;
    // Flip one byte anywhere before the last batch.
    SCOPED_TRACE(trial);
    std::uniform_int_distribution<std::size_t> pos(kFileHeaderSize, offsets.back() - 1);
    std::size_t at = pos(rng);
    damaged[at] = static_cast<char>(damaged[at] ^ (1 + rng() % 255));
    ScanResult r;
    Frames(damaged, &r);
    EXPECT_EQ(r.end, ScanResult::End::kDamaged) << at;
    EXPECT_LE(r.damage_offset, at);
    EXPECT_GT(r.resume_offset, at);
    EXPECT_FALSE(r.detail.empty());
  }
}

TEST(Batch, ACompleteLastBatchWithABadChecksumIsDamageNotATornTail) {
  std::vector<std::uint64_t> offsets;
  std::string file = MakeFile(3, &offsets);
  std::string flipped = file;
  flipped[file.size() - 3] ^= 0x10;
  ScanResult r;
  Frames(flipped, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged);
  EXPECT_EQ(r.damage_offset, offsets[2]);
  EXPECT_EQ(r.batches, 2u);
  // Zeros where the last batch's blocks should be: a crash, not damage.
  std::string zeroed = file;
  std::fill(zeroed.begin() + static_cast<std::ptrdiff_t>(offsets[2] + kBatchHeaderSize + 5),
            zeroed.end(), '\0');
  Frames(zeroed, &r);
  EXPECT_EQ(r.end, ScanResult::End::kTornTail);
  EXPECT_EQ(r.valid_end, offsets[2]);
  // A zero-filled header too.
  std::string zero_header = file.substr(0, offsets[2]) + std::string(100, '\0');
  Frames(zero_header, &r);
  EXPECT_EQ(r.end, ScanResult::End::kTornTail);
}

TEST(Batch, SalvageKeepsEveryIntactFrame) {
  std::vector<std::uint64_t> offsets;
  const std::string file = MakeFile(6, &offsets);
  // The 3rd frame of batch 4 (5 frames), and where it ends.
  std::size_t frame_at = offsets[4] + kBatchHeaderSize;
  std::uint32_t len = 0;
  for (int j = 0; j < 3; ++j) {
    if (j > 0) frame_at += kFrameHeaderSize + len;
    std::memcpy(&len, file.data() + frame_at + 4, 4);
  }
  const std::size_t frame_end = frame_at + kFrameHeaderSize + len;
  auto salvage = [](std::string_view damaged, std::vector<std::string>* kept) {
    return SalvageLog(damaged, kSalt, [kept](const Frame& f) {
      kept->emplace_back(f.payload.substr(0, 4));
      return OkStatus();
    });
  };
  // Its payload damaged, its length intact: only it is dropped; the later frames of the
  // batch check out and are kept.
  std::string damaged = file;
  damaged[frame_at + kFrameHeaderSize + 1] ^= 0x40;
  std::vector<std::string> kept;
  auto r = salvage(damaged, &kept);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->frames_kept, 21u - 1u);
  EXPECT_EQ(r->bytes_dropped, frame_end - frame_at);
  ASSERT_EQ(r->damage.size(), 1u);
  EXPECT_EQ(r->damage[0].batch, offsets[4]);
  EXPECT_EQ(r->damage[0].begin, frame_at);
  EXPECT_EQ(r->damage[0].end, frame_end);
  EXPECT_THAT(r->damage[0].what, HasSubstr("frame 2 at offset " + std::to_string(frame_at)));
  EXPECT_FALSE(r->torn_tail);
  EXPECT_THAT(kept, ::testing::Contains("b4f1"));
  EXPECT_THAT(kept, ::testing::Not(::testing::Contains("b4f2")));
  EXPECT_THAT(kept, ::testing::Contains("b4f3"));
  EXPECT_THAT(kept, ::testing::Contains("b4f4"));
  EXPECT_THAT(kept, ::testing::Contains("b5f5"));
  // The last frame of a batch, its payload damaged: the next batch follows where its length
  // says.
  damaged = file;
  damaged[offsets[5] - 2] ^= 0x40;
  kept.clear();
  r = salvage(damaged, &kept);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->frames_kept, 21u - 1u);
  EXPECT_THAT(kept, ::testing::Not(::testing::Contains("b4f4")));
  EXPECT_THAT(kept, ::testing::Contains("b5f0"));
  // Its length damaged, nothing else: the frame checks out at its true length, so it and the
  // rest of the batch are kept, and the place is listed with nothing dropped.
  for (const std::uint32_t flip : {0x40u, 0x01u, 0x80000000u}) {
    damaged = file;
    std::uint32_t bad_len = len ^ flip;
    std::memcpy(damaged.data() + frame_at + 4, &bad_len, 4);
    kept.clear();
    r = salvage(damaged, &kept);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->frames_kept, 21u) << flip;
    EXPECT_EQ(r->bytes_dropped, 0u);
    ASSERT_EQ(r->damage.size(), 1u);
    EXPECT_EQ(r->damage[0].begin, frame_at);
    EXPECT_EQ(r->damage[0].end, frame_at);
    EXPECT_THAT(r->damage[0].what, HasSubstr("length field is damaged"));
    EXPECT_THAT(kept, ::testing::Contains("b4f2"));
    EXPECT_THAT(kept, ::testing::Contains("b4f3"));
  }
  // Its length and its payload damaged: nothing in the batch after it can be found, so the rest
  // of the batch is dropped up to the next batch header.
  damaged = file;
  damaged[frame_at + 4] ^= 0x40;
  damaged[frame_at + kFrameHeaderSize + 1] ^= 0x40;
  kept.clear();
  r = salvage(damaged, &kept);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->frames_kept, 21u - 3u);
  ASSERT_EQ(r->damage.size(), 1u);
  EXPECT_EQ(r->damage[0].begin, frame_at);
  EXPECT_EQ(r->damage[0].end, offsets[5]);
  EXPECT_THAT(r->damage[0].what, HasSubstr("its length cannot be trusted"));
  EXPECT_THAT(kept, ::testing::Contains("b4f1"));
  EXPECT_THAT(kept, ::testing::Not(::testing::Contains("b4f3")));
  EXPECT_THAT(kept, ::testing::Contains("b5f5"));
}

TEST(Batch, SeqGapIsDamage) {
  std::string file = FileHeader(kSalt);
  BatchBuilder b(kSalt);
  for (std::uint64_t seq : {1, 2, 4}) {
    b.Clear();
    b.Add(1, "x");
    file.append(b.Finish(seq));
  }
  ScanResult r;
  Frames(file, &r);
  EXPECT_EQ(r.batches, 2u);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged);
  EXPECT_THAT(r.detail, HasSubstr("seq 4 after 2"));
}

// MakeFile(3), then batch 4 of ten 1500-byte frames (four pages) at `*last`, ending at `*end`.
std::string FileWithABigLastBatch(std::size_t* last, std::size_t* end) {
  std::string file = MakeFile(3);
  BatchBuilder b(kSalt);
  for (int j = 0; j < 10; ++j) b.Add(1, std::string(1500, static_cast<char>('a' + j)));
  *last = file.size();
  file.append(b.Finish(4));
  *end = file.size();
  return file;
}

TEST(Batch, APageLostInsideTheLastBatchBeforeReservedZerosIsATornTail) {
  std::size_t last = 0, end = 0;
  std::string file = FileWithABigLastBatch(&last, &end);
  file.append(64 << 10, '\0');  // reserved ahead of the log
  // The pages of one write reach the disk in any order: the second one did not.
  const std::size_t page = (last + 4096) / 4096 * 4096;
  ASSERT_LT(page + 4096, end);
  std::fill_n(file.begin() + static_cast<std::ptrdiff_t>(page), 4096, '\0');
  ScanResult r;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
  EXPECT_EQ(r.valid_end, last);
  EXPECT_EQ(r.batches, 3u);
  // One lost sector (512 bytes) is enough, and so is a last batch without zeros after it.
  file = FileWithABigLastBatch(&last, &end);
  std::fill_n(file.begin() + static_cast<std::ptrdiff_t>(page + 1024), 512, '\0');
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
  EXPECT_EQ(r.valid_end, last);
}

// The page holding the last batch's header is the one that did not reach the disk: its later
// pages did. That batch's write never finished, so it was never acknowledged: a torn tail,
// whether the header starts its sector or straddles two.
TEST(Batch, ALostHeaderPageOfTheLastBatchIsATornTail) {
  std::size_t last = 0, end = 0;
  const std::string whole = FileWithABigLastBatch(&last, &end);
  std::string file = whole + std::string(4096, '\0');
  const std::size_t page = last / 4096 * 4096;
  std::fill_n(file.begin() + static_cast<std::ptrdiff_t>(last), page + 4096 - last, '\0');
  ScanResult r;
  EXPECT_EQ(Frames(file, &r).size(), 6u);  // batches 1 to 3
  EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
  EXPECT_EQ(r.valid_end, last);

  // A header across a sector boundary whose second sector was lost: its first bytes (the
  // magic, the checksum) are there, the rest reads as zeros.
  file = MakeFile(3);
  // Frames of batch 4 sized so that batch 5's header starts 12 bytes before a sector's end.
  BatchBuilder b(kSalt);
  const std::size_t at = file.size() + kBatchHeaderSize + kFrameHeaderSize;
  const std::size_t target = (at / 512 + 2) * 512 - 12;
  b.Add(1, std::string(target - at, 'y'));
  file.append(b.Finish(4));
  ASSERT_EQ(file.size() % 512, 500u);
  const std::size_t fifth = file.size();
  b.Clear();
  for (int j = 0; j < 4; ++j) b.Add(1, std::string(900, static_cast<char>('k' + j)));
  file.append(b.Finish(5));
  file.append(4096, '\0');
  std::fill_n(file.begin() + static_cast<std::ptrdiff_t>(fifth + 12), 512, '\0');
  EXPECT_EQ(Frames(file, &r).size(), 7u);  // batches 1 to 4
  EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
  EXPECT_EQ(r.valid_end, fifth);

  // A header flipped, not lost, is damage still.
  file = whole + std::string(4096, '\0');
  file[last + 2] ^= 0x10;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged);
  EXPECT_EQ(r.damage_offset, last);
}

TEST(Batch, ALostPageIsDamageWhenDataFollowsTheBatch) {
  std::size_t last = 0, end = 0;
  const std::string whole = FileWithABigLastBatch(&last, &end);
  const std::size_t page = (last + 4096) / 4096 * 4096;
  // An intact batch after it.
  std::string file = whole;
  BatchBuilder b(kSalt);
  b.Add(1, "later");
  file.append(b.Finish(5));
  std::fill_n(file.begin() + static_cast<std::ptrdiff_t>(page), 4096, '\0');
  ScanResult r;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged);
  EXPECT_EQ(r.damage_offset, last);
  EXPECT_EQ(r.resume_offset, end);
  // Non-zero bytes past the batch's declared length, where only reserved zeros can be.
  file = whole + std::string(4096, '\0');
  file[end + 100] = 'x';
  std::fill_n(file.begin() + static_cast<std::ptrdiff_t>(page), 4096, '\0');
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged);
  // A flipped bit, not a lost sector, inside the last batch, before reserved zeros.
  file = whole + std::string(4096, '\0');
  file[page + 100] ^= 0x04;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged);
  EXPECT_EQ(r.damage_offset, last);
}

// Batches as a writer under sync=interval writes them: three 5000-byte frames each,
// batch i ending in a sync mark at the end of the first synced[i] batches (the file header
// alone for 0). `*offsets` gets where each batch starts, and the file's end last.
std::string FileWithSyncMarks(const std::vector<int>& synced, std::vector<std::size_t>* offsets) {
  std::string file = FileHeader(kSalt);
  offsets->clear();
  BatchBuilder b(kSalt);
  for (std::size_t i = 0; i < synced.size(); ++i) {
    b.Clear();
    for (int j = 0; j < 3; ++j) b.Add(1, "b" + std::to_string(i) + std::string(5000, 'x'));
    offsets->push_back(file.size());
    const std::size_t mark = synced[i] == 0 ? kFileHeaderSize : (*offsets)[synced[i]];
    file.append(b.Finish(i + 1, mark));
  }
  offsets->push_back(file.size());
  return file;
}

// What a power failure leaves of the page holding `at`: zeros where it held bytes written
// since the last sync, which began at `synced`.
void LosePage(std::string& file, std::size_t at, std::size_t synced) {
  const std::size_t from = std::max(at / 4096 * 4096, synced);
  const std::size_t to = std::min(at / 4096 * 4096 + 4096, file.size());
  std::fill(file.begin() + static_cast<std::ptrdiff_t>(from),
            file.begin() + static_cast<std::ptrdiff_t>(to), '\0');
}

// Under sync=interval a power failure lost a page of batch 3 but kept batch 5, both written
// after the last sync (which covered batches 1 and 2): the file is cut at batch 3, not refused
// as damaged, and the marks never reach the sink. The page may be the one with batch 3's
// header, one in its middle, or its last (then batch 4's header went with it).
TEST(Batch, ABatchLostBeforeAnySyncIsCutWithTheUnsyncedBatchesAfterIt) {
  std::vector<std::size_t> at;
  const std::string whole = FileWithSyncMarks({0, 1, 2, 2, 2}, &at);
  for (const std::size_t lost : {at[2], at[2] + 2000, at[3] - 1}) {
    std::string file = whole;
    LosePage(file, lost, at[2]);
    ScanResult r;
    const auto frames = Frames(file, &r);
    EXPECT_EQ(r.end, ScanResult::End::kTornTail) << lost << ": " << r.detail;
    EXPECT_TRUE(r.unsynced);
    EXPECT_EQ(r.unsynced_batches, lost == at[3] - 1 ? 1u : 2u);
    EXPECT_EQ(r.valid_end, at[2]);
    EXPECT_EQ(r.damage_offset, at[2]);
    EXPECT_EQ(r.last_seq, 2u);
    EXPECT_EQ(frames.size(), 6u);
    for (const auto& f : frames) EXPECT_EQ(f.size(), 5002u);  // no mark frame among them
  }
}

// Every batch after the lost one lost a page too, so no mark after it can be read: batch 2's
// mark shows the file is a marking writer's, and the zeros show writes that never reached
// the disk, so the cut stands. A byte changed (not lost) in batch 3's header is damage.
TEST(Batch, LostPagesInEveryBatchAfterTheLastSyncAreCut) {
  std::vector<std::size_t> at;
  const std::string whole = FileWithSyncMarks({0, 1, 2, 2, 2}, &at);
  std::string file = whole;
  for (int i = 2; i < 5; ++i) LosePage(file, at[i] + 6000, at[2]);
  LosePage(file, at[5] - 1, at[2]);  // batch 5's mark too
  ScanResult r;
  EXPECT_EQ(Frames(file, &r).size(), 6u);
  EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
  EXPECT_TRUE(r.unsynced);
  EXPECT_EQ(r.valid_end, at[2]);
  // The file's end did not reach the disk either: batch 5 is cut short.
  std::string cut = file.substr(0, at[5] - 3000);
  Frames(cut, &r);
  EXPECT_EQ(r.end, ScanResult::End::kTornTail) << r.detail;
  EXPECT_EQ(r.valid_end, at[2]);
  file[at[2] + 10] ^= 0x01;  // in batch 3's header
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged) << r.detail;
}

TEST(Batch, ALostBatchIsDamageWhenASyncCoveredIt) {
  std::vector<std::size_t> at;
  // Batch 5 was written after a sync that covered batches 1 to 4.
  std::string file = FileWithSyncMarks({0, 1, 2, 2, 4}, &at);
  LosePage(file, at[2] + 6000, at[2]);
  ScanResult r;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged) << r.detail;
  EXPECT_FALSE(r.unsynced);
}

// The entries' bytes are the log's format: every store written by an earlier build must read the
// same. Each entry type's encoding, byte for byte (written by the encoder before it was
// rewritten to fill one buffer; the same bytes since), then decoded back.
std::string Hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

TEST(EntryCodec, EachEntryTypeEncodesAsTheFormatSays) {
  using std::chrono::milliseconds;
  std::vector<Entry> entries;
  Entry record;
  record.type = EntryType::kRecordPut;
  record.scope = "payments";
  record.name = "pay-123";
  record.record.state = RecordState::kCompleted;
  record.record.outcome = Outcome::kFailure;
  record.record.created = Timestamp(milliseconds(1795847250123));
  record.record.lease_deadline = record.record.created + milliseconds(30000);
  record.record.expires = record.record.created - milliseconds(5);  // a negative offset
  record.record.token = 1795847250123456;
  record.record.attempt = 3;
  Fingerprint fp;
  for (int i = 0; i < 32; ++i)
    fp.bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 7);
  record.fingerprint = fp;
  record.response = "{\"ok\":true}";
  entries.push_back(record);
  Entry seq = record;
  seq.type = EntryType::kSeqPut;
  seq.seq = 300;
  seq.fingerprint.reset();
  seq.response = "";
  seq.record.state = RecordState::kInProgress;
  seq.record.outcome = Outcome::kSuccess;
  entries.push_back(seq);
  Entry session;
  session.type = EntryType::kSessionPut;
  session.scope = "s";
  session.name = "client-9";
  session.session.low_water = 129;
  session.session.window = 64;
  session.session.ttl = milliseconds(86400000);
  session.session.expires = Timestamp(milliseconds(1795847250123));
  entries.push_back(session);
  Entry entity;
  entity.type = EntryType::kEntityPut;
  entity.scope = "s";
  entity.name = "acct";
  entity.entity.applied = 7;
  entity.entity.in_progress = 8;
  entity.entity.token = 99;
  entity.entity.attempt = 2;
  entity.entity.lease_deadline = Timestamp(milliseconds(1000));
  entity.entity.expires = Timestamp(milliseconds(-3));
  entries.push_back(entity);
  Entry seq_delete;
  seq_delete.type = EntryType::kSeqDelete;
  seq_delete.name = "c";
  seq_delete.seq = std::uint64_t{1} << 63;  // a ten-byte varint
  entries.push_back(seq_delete);
  Entry floor;
  floor.type = EntryType::kTokenFloor;
  floor.token_floor = 123456789012345;
  entries.push_back(floor);
  Entry removal;
  removal.type = EntryType::kRecordDelete;
  removal.scope = "x";
  removal.name = std::string_view("k\0y", 3);
  entries.push_back(removal);

  const std::vector<std::string> expected = {
      "087061796d656e7473077061792d313233079683b38dc468e0d40309c0b5a8ab84aa98030300070e151c232a31"
      "383f464d545b626970777e858c939aa1a8afb6bdc4cbd2d90b7b226f6b223a747275657d",
      "087061796d656e7473077061792d313233ac02009683b38dc468e0d40309c0b5a8ab84aa98030300",
      "017308636c69656e742d3981014080f0b2529683b38dc468",
      "0173046163637407086302d00f05",
      "00016380808080808080808001",
      "f9beb7b088891c",
      "0178036b0079",
  };
  ASSERT_EQ(entries.size(), expected.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    SCOPED_TRACE(i);
    std::string out = "kept";  // the encoder appends
    EncodeEntry(entries[i], &out);
    ASSERT_EQ(out.substr(0, 4), "kept");
    const std::string payload = out.substr(4);
    EXPECT_EQ(Hex(payload), expected[i]);
    Entry back;
    ASSERT_TRUE(DecodeEntry(static_cast<std::uint8_t>(entries[i].type), payload, &back).ok());
    std::string again;
    EncodeEntry(back, &again);
    EXPECT_EQ(again, payload);
  }
}

TEST(Batch, AFlippedByteBeforeAnySyncIsDamage) {
  std::vector<std::size_t> at;
  std::string file = FileWithSyncMarks({0, 1, 2, 2, 2}, &at);
  file[at[2] + 2000] ^= 0x01;  // changed, not lost: a disk does not do this
  ScanResult r;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged) << r.detail;
}

// Version 2 batches carry no marks: a lost batch with intact ones after it stays damage.
TEST(Batch, ALostBatchAmongBatchesWithoutMarksIsDamage) {
  std::vector<std::uint64_t> at;
  std::string file = MakeFile(6, &at);
  std::fill(file.begin() + static_cast<std::ptrdiff_t>(at[3]),
            file.begin() + static_cast<std::ptrdiff_t>(at[4]), '\0');
  ScanResult r;
  Frames(file, &r);
  EXPECT_EQ(r.end, ScanResult::End::kDamaged) << r.detail;
}

TEST(Batch, SalvageLeavesSyncMarksOut) {
  std::vector<std::size_t> at;
  const std::string file = FileWithSyncMarks({0, 1, 2}, &at);
  std::uint64_t frames = 0;
  auto r = SalvageLog(file, kSalt, [&](const Frame& f) {
    EXPECT_NE(f.type, kSyncMarkFrame);
    ++frames;
    return OkStatus();
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(frames, 9u);
  EXPECT_EQ(r->frames_kept, 9u);
}

}  // namespace
}  // namespace idem::log
