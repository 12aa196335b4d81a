// FingerprintJson (RFC 8785 canonicalisation + SHA-256) against plain SHA-256 of the same bytes
// (FingerprintBytes), on a ~1 KiB payment request. The ratio of the two MB/s figures is the cost
// of canonicalising; the target is JCS+SHA-256 at no less than 0.25x plain SHA-256.
//
// Also, for the gateway's principal scope (context, no target): the per-request cost of hashing
// a 40-byte credential plainly (SHA-256) and under a principal secret (HMAC-SHA-256).
#include <benchmark/benchmark.h>

#include <string>
#include <string_view>

#include "fingerprint/sha256.h"
#include "idem/fingerprint.h"

namespace {

// A payment with a customer, line items, a shipping address and metadata, written the way a
// client might send it: pretty-printed, members in no particular order.
constexpr std::string_view kPayment = R"json({
  "type": "payment.create",
  "amount": 15497,
  "currency": "EUR",
  "customer": {
    "id": "cus_9s6XKzkNRiz8i3",
    "email": "jane.doe@example.com",
    "name": "Jane Doe",
    "locale": "de-DE"
  },
  "line_items": [
    {"sku": "SKU-10023", "description": "Espresso beans, 1 kg", "quantity": 2, "unit_price": 24.5, "tax_rate": 0.07},
    {"sku": "SKU-20417", "description": "Milk frother \u00e0 la carte", "quantity": 1, "unit_price": 89.99, "tax_rate": 0.19},
    {"sku": "SKU-31150", "description": "Descaler (3 pack)", "quantity": 3, "unit_price": 4.99, "tax_rate": 0.19}
  ],
  "shipping": {
    "method": "express",
    "cost": 6.9,
    "address": {"line1": "Hauptstra\u00dfe 12", "line2": null, "city": "M\u00fcnchen",
                "postal_code": "80331", "country": "DE"}
  },
  "payment_method": {"kind": "card", "brand": "visa", "last4": "4242", "exp_month": 12,
                     "exp_year": 2027, "three_d_secure": true},
  "metadata": {"order_id": "ord_2024_000184467", "channel": "web", "campaign": "spring-sale",
               "note": "Leave at the door, \"ring twice\"", "gift": false},
  "created_at": "2024-03-18T09:41:27Z",
  "idempotency_hint": 1710754887123
}
)json";

void BM_FingerprintJson(benchmark::State& state) {
  std::string doc(kPayment);
  for (auto _ : state) {
    auto fp = idem::FingerprintJson(doc);
    benchmark::DoNotOptimize(fp);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(doc.size()));
}
BENCHMARK(BM_FingerprintJson);

// The baseline: SHA-256 alone over the same bytes.
void BM_Sha256Baseline(benchmark::State& state) {
  std::string doc(kPayment);
  for (auto _ : state) {
    auto fp = idem::FingerprintBytes(doc);
    benchmark::DoNotOptimize(fp);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(doc.size()));
}
BENCHMARK(BM_Sha256Baseline);

// Canonicalisation alone (allocates the returned string).
void BM_CanonicalizeJson(benchmark::State& state) {
  std::string doc(kPayment);
  for (auto _ : state) {
    auto canonical = idem::CanonicalizeJson(doc);
    benchmark::DoNotOptimize(canonical);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(doc.size()));
}
BENCHMARK(BM_CanonicalizeJson);

constexpr std::string_view kCredential = "Bearer sk_live_51H8xK2eZvKYlo2C0aB1cD2eF3";

void BM_PrincipalSha256(benchmark::State& state) {
  for (auto _ : state) {
    auto d = idem::internal::Sha256(kCredential);
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_PrincipalSha256);

void BM_PrincipalHmacSha256(benchmark::State& state) {
  const std::string secret = "a principal secret of 32 bytes!!";
  for (auto _ : state) {
    auto d = idem::internal::HmacSha256(secret, kCredential);
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_PrincipalHmacSha256);

}  // namespace

BENCHMARK_MAIN();
