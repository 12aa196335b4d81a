// Keys and scopes: what identifies a record (SPEC §1, §3).
#ifndef IDEM_KEY_H_
#define IDEM_KEY_H_

#include <cstddef>
#include <string_view>

#include "idem/status.h"

namespace idem {

inline constexpr std::size_t kDefaultMaxKeyBytes = 255;
inline constexpr std::size_t kMaxScopeBytes = 255;

// ok, or kInvalidArgument naming the problem: "key is empty",
// "key is 300 bytes; the limit is 255".
Status ValidateKey(std::string_view key, std::size_t max_bytes = kDefaultMaxKeyBytes);

// A scope may be empty (the default scope) and holds at most kMaxScopeBytes bytes.
Status ValidateScope(std::string_view scope);

}  // namespace idem

#endif  // IDEM_KEY_H_
