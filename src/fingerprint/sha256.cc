#include "fingerprint/sha256.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <limits>
#include <memory>

#include "idem/status.h"

namespace idem::internal {
namespace {

// Fetched once. OpenSSL 3's one-shot SHA256() fetches the algorithm and allocates a context on
// every call, which costs about as much as hashing 300 bytes.
const EVP_MD* Sha256Md() {
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  IDEM_CHECK_MSG(md != nullptr, "OpenSSL has no SHA256");
  return md;
}

struct CtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

// The thread's spare context: a hasher takes it (or makes a new one) and gives it back.
thread_local std::unique_ptr<EVP_MD_CTX, CtxFree> spare_ctx;

}  // namespace

Sha256Hasher::Sha256Hasher() : ctx_(spare_ctx ? spare_ctx.release() : EVP_MD_CTX_new()) {
  IDEM_CHECK(ctx_ != nullptr);
  IDEM_CHECK(EVP_DigestInit_ex2(ctx_, Sha256Md(), nullptr) == 1);
}

Sha256Hasher::~Sha256Hasher() {
  if (spare_ctx == nullptr) {
    spare_ctx.reset(ctx_);
  } else {
    EVP_MD_CTX_free(ctx_);
  }
}

void Sha256Hasher::Update(std::string_view bytes) {
  IDEM_CHECK(EVP_DigestUpdate(ctx_, bytes.data(), bytes.size()) == 1);
}

Sha256Digest Sha256Hasher::Finish() {
  Sha256Digest digest;
  unsigned int size = 0;
  IDEM_CHECK(EVP_DigestFinal_ex(ctx_, digest.data(), &size) == 1);
  IDEM_CHECK(size == digest.size());
  return digest;
}

Sha256Digest Sha256(std::string_view bytes) {
  Sha256Hasher hasher;
  hasher.Update(bytes);
  return hasher.Finish();
}

Sha256Digest HmacSha256(std::string_view key, std::string_view message) {
  Sha256Digest mac;
  unsigned int size = 0;
  IDEM_CHECK(key.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()));
  IDEM_CHECK(HMAC(Sha256Md(), key.data(), static_cast<int>(key.size()),
                  reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                  mac.data(), &size) != nullptr);
  IDEM_CHECK(size == mac.size());
  return mac;
}

}  // namespace idem::internal
