// SHA-256 through OpenSSL (which uses the CPU's SHA extensions where there are some).
#ifndef IDEM_FINGERPRINT_SHA256_H_
#define IDEM_FINGERPRINT_SHA256_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

namespace idem::internal {

using Sha256Digest = std::array<std::uint8_t, 32>;

// SHA-256 of `bytes`.
Sha256Digest Sha256(std::string_view bytes);

// Incremental SHA-256. Update any number of times, then Finish once.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view bytes);
  Sha256Digest Finish();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

}  // namespace idem::internal

#endif  // IDEM_FINGERPRINT_SHA256_H_
