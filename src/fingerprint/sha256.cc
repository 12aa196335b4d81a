#include "fingerprint/sha256.h"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include "idem/status.h"

namespace idem::internal {
namespace {

// Fetched once: an implicit fetch on every call costs more than hashing a small message.
const EVP_MD* Sha256Md() {
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  IDEM_CHECK_MSG(md != nullptr, "OpenSSL has no SHA256");
  return md;
}

}  // namespace

Sha256Digest Sha256(std::string_view bytes) {
  Sha256Digest digest;
  // The one-shot call hashes in place without creating an EVP context.
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data());
  return digest;
}

struct Sha256Hasher::Context {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Context() { EVP_MD_CTX_free(ctx); }
};

Sha256Hasher::Sha256Hasher() : context_(std::make_unique<Context>()) {
  IDEM_CHECK(context_->ctx != nullptr);
  IDEM_CHECK(EVP_DigestInit_ex2(context_->ctx, Sha256Md(), nullptr) == 1);
}

Sha256Hasher::~Sha256Hasher() = default;

void Sha256Hasher::Update(std::string_view bytes) {
  IDEM_CHECK(EVP_DigestUpdate(context_->ctx, bytes.data(), bytes.size()) == 1);
}

Sha256Digest Sha256Hasher::Finish() {
  Sha256Digest digest;
  unsigned int size = 0;
  IDEM_CHECK(EVP_DigestFinal_ex(context_->ctx, digest.data(), &size) == 1);
  IDEM_CHECK(size == digest.size());
  return digest;
}

}  // namespace idem::internal
