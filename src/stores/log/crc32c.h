// CRC-32C (Castagnoli), hardware-accelerated with SSE4.2 where the CPU has it.
#ifndef IDEM_STORES_LOG_CRC32C_H_
#define IDEM_STORES_LOG_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace idem::log {

std::uint32_t Crc32c(std::uint32_t crc, const void* data, std::size_t n);
inline std::uint32_t Crc32c(std::string_view s) { return Crc32c(0, s.data(), s.size()); }

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_CRC32C_H_
