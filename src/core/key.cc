#include "idem/key.h"

#include <string>

namespace idem {

Status ValidateKey(std::string_view key, std::size_t max_bytes) {
  if (key.empty()) return InvalidArgumentError("key is empty");
  if (key.size() > max_bytes) {
    return InvalidArgumentError("key is " + std::to_string(key.size()) + " bytes; the limit is " +
                                std::to_string(max_bytes));
  }
  return OkStatus();
}

Status ValidateScope(std::string_view scope) {
  if (scope.size() > kMaxScopeBytes) {
    return InvalidArgumentError("scope is " + std::to_string(scope.size()) +
                                " bytes; the limit is " + std::to_string(kMaxScopeBytes));
  }
  return OkStatus();
}

}  // namespace idem
