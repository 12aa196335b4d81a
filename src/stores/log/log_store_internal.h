// What tests need beyond the public log store API: opening and repairing over another
// FileSystem (to inject faults).
#ifndef IDEM_STORES_LOG_LOG_STORE_INTERNAL_H_
#define IDEM_STORES_LOG_LOG_STORE_INTERNAL_H_

#include <memory>

#include "idem/stores/log.h"
#include "stores/log/file_system.h"

namespace idem::log {

Result<std::unique_ptr<Store>> OpenLogStoreWith(const LogStoreOptions& options, FileSystem& fs);
Result<LogRepairReport> RepairLogStoreWith(const std::string& dir, FileSystem& fs,
                                           const Progress& progress = {});

}  // namespace idem::log

#endif  // IDEM_STORES_LOG_LOG_STORE_INTERNAL_H_
