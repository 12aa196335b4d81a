// SHA-256 through OpenSSL (which uses the CPU's SHA extensions where there are some).
#ifndef IDEM_FINGERPRINT_SHA256_H_
#define IDEM_FINGERPRINT_SHA256_H_

#include <array>
#include <cstdint>
#include <string_view>

// OpenSSL's context type, so that this header does not include OpenSSL's.
struct evp_md_ctx_st;

namespace idem::internal {

using Sha256Digest = std::array<std::uint8_t, 32>;

// Incremental SHA-256: Update any number of times, then Finish once. Not thread-safe; each
// thread keeps one OpenSSL context for reuse, so a hasher costs no allocation once warm.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view bytes);
  Sha256Digest Finish();

 private:
  evp_md_ctx_st* ctx_;
};

// SHA-256 of `bytes`.
Sha256Digest Sha256(std::string_view bytes);

// HMAC-SHA-256 (RFC 2104) of `message` under `key`.
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

}  // namespace idem::internal

#endif  // IDEM_FINGERPRINT_SHA256_H_
