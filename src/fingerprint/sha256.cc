#include "fingerprint/sha256.h"

#include <openssl/evp.h>

#include <array>
#include <cstring>
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

// RFC 2104 over the hasher (whose context is reused), not OpenSSL's one-shot HMAC(), which
// sets up a fresh MAC context per call: 1.18 us a call here, against 0.26 us for this
// (fingerprint_bench).
Sha256Digest HmacSha256(std::string_view key, std::string_view message) {
  constexpr std::size_t kBlock = 64;
  std::array<char, kBlock> pad{};
  if (key.size() > kBlock) {
    const Sha256Digest short_key = Sha256(key);
    std::memcpy(pad.data(), short_key.data(), short_key.size());
  } else {
    std::memcpy(pad.data(), key.data(), key.size());
  }
  for (char& c : pad) c = static_cast<char>(c ^ 0x36);
  Sha256Digest inner_digest;
  {
    // Gone before `outer` is made, so both take the thread's spare context in turn.
    Sha256Hasher inner;
    inner.Update(std::string_view(pad.data(), pad.size()));
    inner.Update(message);
    inner_digest = inner.Finish();
  }
  for (char& c : pad) c = static_cast<char>(c ^ 0x36 ^ 0x5c);
  Sha256Hasher outer;
  outer.Update(std::string_view(pad.data(), pad.size()));
  outer.Update(
      std::string_view(reinterpret_cast<const char*>(inner_digest.data()), inner_digest.size()));
  return outer.Finish();
}

}  // namespace idem::internal
