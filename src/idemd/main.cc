// idemd: the Idempotency-Key gateway in front of one upstream HTTP API (SPEC §6), or, as
// `idemd consume`, a deduplicating consumer of Kafka, NATS JetStream or Redis Streams
// (src/consume/runner.h).
//
//   idemd --config idemd.toml
//   idemd --upstream http://127.0.0.1:9000 --store log:/var/lib/idemd --listen 0.0.0.0:8080
//   idemd consume --config consume.toml
//
// When both listeners are bound it prints one line to stdout,
//   idemd listening on HOST:PORT admin HOST:PORT
// and serves until SIGTERM or SIGINT, then shuts down gracefully (server.h).
// Exit status: 0 after a clean stop, 1 when the store or a listener cannot be opened, 2 for a
// bad command line or configuration.

#include <cstdio>
#include <iostream>
#include <string_view>
#include <variant>

#include "cli/store_url.h"
#include "consume/runner.h"
#include "core/stop_signals.h"
#include "core/url_text.h"
#include "gateway/config.h"
#include "gateway/server.h"
#include "idem/metrics.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

int Run(int argc, char** argv) {
  auto command_line = idem::gateway::ParseCommandLine(argc, argv);
  if (!command_line) {
    std::cerr << "idemd: " << command_line.error().message() << "\nRun 'idemd --help'.\n";
    return kExitUsage;
  }
  if (!command_line->config) {
    std::cout << idem::gateway::HelpText();
    return 0;
  }
  const idem::gateway::Config& config = *command_line->config;
  auto store_config = idem::ParseStoreUrl(config.store);
  if (!store_config) {
    std::cerr << "idemd: store: " << store_config.error().message() << "\n";
    return kExitUsage;
  }

  // Before any thread starts: they all inherit the mask, and only the main thread takes them.
  const idem::core::StopSignals stop_signals;

  // The gateway's I/O threads serve many connections each: none of them should wait ~5 ms for
  // a huge page of a growing memory or log store to be cleared (MemoryStoreOptions).
  if (auto* memory = std::get_if<idem::MemoryStoreOptions>(&*store_config)) {
    memory->prepare_on_own_thread = true;
  } else if (auto* log = std::get_if<idem::LogStoreOptions>(&*store_config)) {
    log->prepare_on_own_thread = true;
  }
  auto store = idem::OpenStore(*store_config);
  if (!store) {
    std::cerr << "idemd: cannot open the store '" << idem::core::RedactUrlPassword(config.store)
              << "': " << store.error().ToString() << "\n";
    // Options only the open could check (a database the server refuses, a cluster node given
    // as redis://, libpq's own values) are the configuration's fault.
    return store.error().code() == idem::StatusCode::kInvalidArgument ? kExitUsage : kExitRuntime;
  }
  idem::Registry registry;
  auto server = idem::gateway::Server::Start(config, **store, registry);
  if (!server) {
    std::cerr << "idemd: " << server.error().message() << "\n";
    return server.error().code() == idem::StatusCode::kInvalidArgument ? kExitUsage : kExitRuntime;
  }
  const auto listen = (*server)->listening();
  const auto admin = (*server)->admin();
  // An IPv6 address in brackets, as it is written in --listen: "[::1]:8080".
  const auto host = [](const std::string& h) {
    return h.find(':') != std::string::npos ? "[" + h + "]" : h;
  };
  std::printf("idemd listening on %s:%u admin %s:%u\n", host(listen.host).c_str(), listen.port,
              host(admin.host).c_str(), admin.port);
  std::fflush(stdout);

  stop_signals.Wait();
  (*server)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "consume") {
    return idem::consume::RunConsume(argc - 1, argv + 1);
  }
  return Run(argc, argv);
}
