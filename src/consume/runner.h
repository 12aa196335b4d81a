// `idemd consume`: opens the store, one broker and one HTTP handler per [[consumer]], runs each
// consumer on its own thread, serves the admin endpoint, and stops cleanly on SIGTERM/SIGINT.
#ifndef IDEM_CONSUME_RUNNER_H_
#define IDEM_CONSUME_RUNNER_H_

#include <memory>

#include "consume/config.h"
#include "idem/consumer.h"
#include "idem/metrics.h"
#include "idem/status.h"

namespace idem::consume {

// The broker adapter a consumer config names. kInvalidArgument for a bad setting,
// kUnavailable when the broker cannot be reached.
Result<std::unique_ptr<Broker>> OpenBroker(const ConsumerConfig& config);

// The consumer core's options for a config.
ConsumerOptions CoreOptions(const ConsumerConfig& config, Registry* registry);

// idemd consume's main: argv[0] is "consume". Exit status as ConsumeHelpText() says.
int RunConsume(int argc, char** argv);

}  // namespace idem::consume

#endif  // IDEM_CONSUME_RUNNER_H_
