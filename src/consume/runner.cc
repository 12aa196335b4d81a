#include "consume/runner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/store_url.h"
#include "consume/http_handler.h"
#include "core/stop_signals.h"
#include "core/thread_name.h"
#include "core/url_text.h"
#include "gateway/admin.h"
#include "idem/consumers/kafka.h"
#include "idem/consumers/nats.h"
#include "idem/consumers/redis_streams.h"
#include "idem/store_gauges.h"

namespace idem::consume {
namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

int LevelOf(std::string_view name) {
  if (name == "debug") return 0;
  if (name == "info") return 1;
  if (name == "warn") return 2;
  return 3;
}

// One line per event on stderr: "TIME level=L consumer=NAME event=... detail".
class Log {
 public:
  explicit Log(std::string_view level) : min_(LevelOf(level)) {}
  void Write(std::string_view level, std::string_view line) {
    if (LevelOf(level) < min_) return;
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    std::lock_guard lock(mu_);
    std::cerr << stamp << " level=" << level << " " << line << "\n";
  }

 private:
  int min_;
  std::mutex mu_;
};

// A consumer with everything it owns.
struct Running {
  ConsumerConfig config;
  std::unique_ptr<Broker> broker;
  std::unique_ptr<HttpHandler> handler;
  std::unique_ptr<Consumer> consumer;
  std::thread thread;
};

void RunLoop(Running& r, Log& log) {
  std::uint32_t failures = 0;
  std::string last_error;
  while (!r.consumer->stopping()) {
    auto n = r.consumer->RunOnce();
    if (n) {
      // A round that polled nothing touched neither the store nor the handler: it says
      // nothing about what failed before (logging "recovered" then made a store that was
      // still down flap between failed and recovered, with no backoff).
      if (*n == 0) continue;
      if (failures > 0) log.Write("info", "consumer=" + r.config.name + " event=recovered");
      failures = 0;
      last_error.clear();
      continue;
    }
    const std::string error = n.error().ToString();
    if (error != last_error) {
      std::string line = "consumer=" + r.config.name + " event=round_failed error=";
      core::AppendLogQuoted(line, error);
      log.Write("warn", line + " (nothing unsettled was acknowledged; retrying)");
      last_error = error;
    }
    ++failures;
    const auto delay = std::min<std::int64_t>(5'000, 50LL << std::min<std::uint32_t>(failures, 7));
    for (std::int64_t waited = 0; waited < delay && !r.consumer->stopping(); waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace

Result<std::unique_ptr<Broker>> OpenBroker(const ConsumerConfig& c) {
  switch (c.broker) {
    case BrokerKind::kKafka:
      return kafka::OpenKafkaConsumer({.brokers = c.url,
                                       .group = c.group,
                                       .topics = c.topics,
                                       .dlq_topic = c.dlq,
                                       .client_id = "idemd-" + c.name,
                                       .session_timeout = c.session_timeout,
                                       .properties = c.properties});
    case BrokerKind::kNats: {
      nats::NatsConsumerConfig n;
      n.url = c.url;
      n.stream = c.stream;
      n.subjects = c.topics;
      n.durable = c.group;
      n.dlq_subject = c.dlq;
      n.dlq_stream = c.dlq_stream;
      n.ack_wait = c.ack_wait;
      // No more unacknowledged messages out than the consumer holds: one batch, or three
      // pipelined (one completing, one begun, one just polled). After a crash the restarted
      // adapter gathers them and hands them out in stream order before anything newer
      // (docs/nats.md), so each subject's order of effects holds across restarts.
      n.max_ack_pending = static_cast<int>(c.batch * (c.pipeline ? 3 : 1));
      n.connection_name = "idemd-" + c.name;
      return nats::OpenNatsConsumer(n);
    }
    case BrokerKind::kRedis:
      return redis_streams::OpenRedisStreamsConsumer({.url = c.url,
                                                      .streams = c.topics,
                                                      .group = c.group,
                                                      .consumer = c.consumer_name,
                                                      .dlq_stream = c.dlq,
                                                      .payload_field = c.payload_field,
                                                      .claim_idle = c.claim_idle});
  }
  return InvalidArgumentError("unknown broker");
}

ConsumerOptions CoreOptions(const ConsumerConfig& c, Registry* registry) {
  ConsumerOptions o;
  o.name = c.name;
  o.scope = c.scope;
  o.key_source = c.key;
  o.fingerprint = c.fingerprint;
  if (c.entity && c.version)
    o.versions = VersionSources{.entity = *c.entity, .version = *c.version};
  o.batch_size = c.batch;
  o.poll_wait = c.poll_wait;
  o.lease = c.lease;
  o.retention = c.retention;
  o.failure_retention = c.failure_retention;
  o.max_attempts = c.max_attempts;
  o.backoff = c.backoff;
  o.max_backoff = c.max_backoff;
  o.busy_timeout = c.busy_timeout;
  o.pipeline = c.pipeline;
  o.registry = registry;
  return o;
}

int RunConsume(int argc, char** argv) {
  auto parsed = ParseConsumeCommandLine(argc, argv);
  if (!parsed) {
    std::cerr << "idemd consume: " << parsed.error().message() << "\nRun 'idemd consume --help'.\n";
    return kExitUsage;
  }
  if (!*parsed) {
    std::cout << ConsumeHelpText();
    return 0;
  }
  const ConsumeConfig& config = **parsed;
  auto store_config = ParseStoreUrl(config.store);
  if (!store_config) {
    std::cerr << "idemd consume: store: " << store_config.error().message() << "\n";
    return kExitUsage;
  }

  // Before any thread starts: they all inherit the mask, and only the main thread takes them.
  const core::StopSignals stop_signals;

  Log log(config.log_level);
  auto store = OpenStore(*store_config);
  if (!store) {
    std::cerr << "idemd consume: cannot open the store '" << core::RedactUrlPassword(config.store)
              << "': " << store.error().ToString() << "\n";
    return store.error().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitRuntime;
  }
  Registry registry;
  std::vector<std::unique_ptr<Running>> running;
  for (const ConsumerConfig& c : config.consumers) {
    auto r = std::make_unique<Running>();
    r->config = c;
    auto broker = OpenBroker(c);
    if (!broker) {
      std::cerr << "idemd consume: " << c.defined_at << ": consumer " << c.name
                << ": cannot open the " << BrokerKindName(c.broker) << " broker '"
                << core::RedactUrlPassword(c.url) << "': " << broker.error().ToString() << "\n";
      return broker.error().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitRuntime;
    }
    r->broker = std::move(*broker);
    auto handler = HttpHandler::Open(c);
    if (!handler) {
      std::cerr << "idemd consume: " << c.defined_at << ": consumer " << c.name << ": "
                << handler.error().message() << "\n";
      return kExitUsage;
    }
    r->handler = std::move(*handler);
    HttpHandler* h = r->handler.get();
    r->consumer = std::make_unique<Consumer>(
        **store, *r->broker,
        [h](const HandlerContext& ctx, const BrokerMessage& m) { return h->Handle(ctx, m); },
        CoreOptions(c, &registry));
    running.push_back(std::move(r));
  }

  // SPEC §7's gauges of the store's contents, read off the store by a thread of their own.
  const StoreGauges gauges(**store, registry);
  auto admin = gateway::AdminServer::Start(
      config.admin, registry,
      [&]() -> Status {
        IDEM_RETURN_IF_ERROR(gateway::StoreReady(**store));
        for (const auto& r : running) {
          if (Status s = r->broker->Health(); !s.ok()) {
            return UnavailableError("consumer " + r->config.name +
                                    ": broker unavailable: " + s.ToString());
          }
        }
        return OkStatus();
      },
      [&] { return (*store)->Broken(); });
  if (!admin) {
    std::cerr << "idemd consume: admin: " << admin.error().message() << "\n";
    return kExitRuntime;
  }
  for (auto& r : running) {
    Running* raw = r.get();
    r->thread = std::thread([raw, &log] {
      core::NameThisThread(("consume-" + raw->config.name).c_str());
      RunLoop(*raw, log);
    });
    log.Write(
        "info", "consumer=" + r->config.name +
                    " event=started broker=" + std::string(BrokerKindName(r->config.broker)) +
                    " store=" + std::string((*store)->Name()) + " store_url=" + [&] {
                      std::string url;
                      core::AppendLogQuoted(url, core::RedactUrlPassword(config.store));
                      return url;
                    }());
  }
  const auto at = (*admin)->bound();
  std::printf("idemd consume running %zu consumer(s) admin %s:%u\n", running.size(),
              at.host.c_str(), at.port);
  std::fflush(stdout);

  stop_signals.Wait();
  log.Write("info", "event=stopping");
  for (auto& r : running) r->consumer->Stop();
  for (auto& r : running) {
    if (r->thread.joinable()) r->thread.join();
  }
  (*admin)->Stop();
  for (const auto& r : running) {
    const ConsumerCounts n = r->consumer->counts();
    log.Write("info", "consumer=" + r->config.name + " event=stopped received=" +
                          std::to_string(n.received) + " executed=" + std::to_string(n.executed) +
                          " replayed=" + std::to_string(n.replayed) +
                          " dead_lettered=" + std::to_string(n.dead_lettered));
  }
  return 0;
}

}  // namespace idem::consume
