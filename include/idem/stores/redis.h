// The Redis store: records in a Redis server (one node) or a Redis Cluster, shared by every
// process that points at it. Link idem::redis (it brings hiredis; idem::idem does not).
//
// Every operation is one Lua script on one Redis key, so it is atomic per (scope, key) and
// touches one cluster slot: a record is one key, a client session (with its sequenced records)
// is one hash, an entity is one key. Redis reclaims what the records' retention says it may
// (PEXPIRE); a record past its logical expiry behaves as absent before Redis drops it.
//
// Time: "now" comes from the store's Clock (the callers' clocks decide leases and retention).
// Tokens come from the Redis server's clock (TIME, in microseconds) and are at least one more
// than the token stored for the key: they grow as long as the master's clock does not step
// back by more than the time between two acquisitions of a key. docs/redis.md says more.
//
// Durability is Redis's: without AOF a restarted Redis forgets every key; with
// `appendfsync everysec`, up to a second of acknowledged answers. After a failover a replica
// may lack the last writes of its master: set `wait_replicas` so that each answer is given only
// once that many replicas have the write (WAIT), or accept that loss.
//
// Fails closed: a node that does not answer within `command_timeout`, a broken connection or
// a reply the store does not expect gives kUnavailable; nothing is guessed. The next call
// reconnects. A call whose command may have run but whose reply was lost is never retried.
// Thread-safe; concurrent callers share a few connections per node, with their commands
// pipelined together.
#ifndef IDEM_STORES_REDIS_H_
#define IDEM_STORES_REDIS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {

struct RedisStoreOptions {
  // "host:port" (or "[v6]:port"). One node, or for a cluster any nodes of it (seeds: the store
  // reads the slot map from the first one that answers).
  std::vector<std::string> nodes{};
  bool cluster = false;
  // Every key the store makes starts with this (short: it is in every key). Several stores may
  // share a Redis by using different prefixes.
  std::string key_prefix = "i:";
  Clock* clock = nullptr;  // nullptr: Clock::System(). Must outlive the store.
  std::size_t max_key_bytes = kDefaultMaxKeyBytes;
  // An IN_PROGRESS record whose lease ran out stays this long (for a takeover with attempt+1).
  std::chrono::milliseconds abandoned_retention{24 * 3600 * 1000};
  std::chrono::milliseconds connect_timeout{1000};
  // How long a node may take to answer a command (a pipelined group of commands).
  std::chrono::milliseconds command_timeout{1000};
  // Connections per node; concurrent callers share them, pipelined.
  std::size_t connections_per_node = 2;
  // > 0: after every write, WAIT for this many replicas to have it (at most wait_timeout); an
  // answer is given only then, else kUnavailable. This is what keeps acknowledged keys across
  // a failover.
  int wait_replicas = 0;
  std::chrono::milliseconds wait_timeout{1000};
  // AUTH on every connection when set (with `user` too for Redis 6 ACL users).
  std::string user{};
  std::string password{};
  // Single node only: the database number (SELECT).
  int database = 0;
  // Every record has a TTL, so a Redis whose maxmemory-policy evicts (volatile-*, allkeys-*)
  // may drop completed keys under memory pressure, and their next delivery runs again. Open
  // refuses such a node (kFailedPrecondition) unless this is set.
  bool allow_eviction = false;
};

// redis://[[user]:password@]host[:port][/db][?opt=value&...]
// redis+cluster://[[user]:password@]host[:port],host[:port],...[?opt=value&...]
// Options: prefix, connect_timeout_ms, timeout_ms, connections, wait_replicas,
// wait_timeout_ms, abandoned_retention_ms, max_key_bytes, allow_eviction (0 or 1). The port
// defaults to 6379.
// kInvalidArgument naming the part that is wrong.
Result<RedisStoreOptions> ParseRedisStoreUrl(std::string_view url);

// Connects (for a cluster: reads the slot map). kUnavailable naming the addresses when no
// node answers; kInvalidArgument for bad options (or a database the server refuses);
// kFailedPrecondition for a node whose maxmemory-policy evicts (see allow_eviction).
Result<std::unique_ptr<Store>> OpenRedisStore(const RedisStoreOptions& options);

}  // namespace idem

#endif  // IDEM_STORES_REDIS_H_
