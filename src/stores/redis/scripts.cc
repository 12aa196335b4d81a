#include "stores/redis/scripts.h"

#include <openssl/sha.h>

#include <array>
#include <cstdio>
#include <utility>

namespace idem::redis {
namespace {

// The helpers the scripts are made of, in the order they must appear. Each script takes only
// the parts it uses: Redis runs a script's whole text on every call, and every `local
// function` it defines is a new closure each time.
//
// Lua 5.1 numbers are doubles: every integer here stays below 2^53 (the store refuses
// sequence numbers and versions above that; tokens and times are far below), and nothing is
// turned into a string with tostring (which would round).
constexpr std::string_view kBase = R"lua(
local byte, char, sub, concat = string.byte, string.char, string.sub, table.concat
local GRACE = 10000
local UNTIL_ACK = 3153600000000
)lua";
constexpr std::string_view kVarint = R"lua(local function put(t, v)
  while v >= 128 do
    local b = v % 128
    t[#t + 1] = char(128 + b)
    v = (v - b) / 128
  end
  t[#t + 1] = char(v)
end
-- Numbers handed to redis.call as exact decimal strings, whatever Redis's own conversion does.
local function int(n) return string.format('%.0f', n) end
local function putz(t, v)
  if v >= 0 then put(t, v * 2) else put(t, -v * 2 - 1) end
end
local function get(s, i)
  local v, m = 0, 1
  while true do
    local b = byte(s, i)
    i = i + 1
    if b < 128 then return v + b * m, i end
    v = v + (b - 128) * m
    m = m * 128
  end
end
local function getz(s, i)
  local v
  v, i = get(s, i)
  if v % 2 == 0 then return v / 2, i end
  return -(v + 1) / 2, i
end
)lua";
constexpr std::string_view kToken =
    R"lua(-- A token above `old` (the token stored for the key, 0 if none) and, as long as the server's
-- clock does not step back, above every token handed out for the key before.
local function newtoken(old)
  local t = redis.call('TIME')
  local tok = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if tok <= old then tok = old + 1 end
  return tok
end
)lua";
constexpr std::string_view kServerTime = R"lua(local function servertime()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + (tonumber(t[2]) - tonumber(t[2]) % 1000) / 1000
end
)lua";
constexpr std::string_view kRecordDecode =
    R"lua(-- Records: {kind = 0 in progress | 1 success | 2 failure, token, attempt, created, expires,
-- lease, fp (32 bytes or nil), resp}. `key` is nil for a session's records (never compact).
local function rdec(key, v)
  local h = byte(v, 1)
  if h < 128 then
    local n = tonumber(v)
    local ttl = n % 268435456
    n = (n - ttl) / 268435456
    local zt = n % 2097152
    n = (n - zt) / 2097152
    local expires = redis.call('PEXPIRETIME', key) - GRACE
    local created = expires - ttl
    local dt = zt / 2
    if zt % 2 == 1 then dt = -(zt + 1) / 2 end
    return {kind = (n - n % 8) / 8 + 1, token = created * 1000 + dt, attempt = n % 8 + 1,
            created = created, expires = expires, lease = 0, resp = ''}
  end
  h = h - 128
  local r = {kind = h % 4, lease = 0}
  local i, d = 2, 0
  r.token, i = get(v, i)
  r.attempt, i = get(v, i)
  r.created, i = getz(v, i)
  d, i = getz(v, i)
  r.expires = r.created + d
  if r.kind == 0 then
    d, i = getz(v, i)
    r.lease = r.created + d
  end
  if h % 8 >= 4 then
    r.fp = sub(v, i, i + 31)
    i = i + 32
  end
  r.resp = sub(v, i)
  return r
end
)lua";
constexpr std::string_view kRecordEncode = R"lua(local function renc(r)
  local h = 128 + r.kind
  if r.fp then h = h + 4 end
  local t = {char(h)}
  put(t, r.token)
  put(t, r.attempt)
  putz(t, r.created)
  putz(t, r.expires - r.created)
  if r.kind == 0 then putz(t, r.lease - r.created) end
  if r.fp then t[#t + 1] = r.fp end
  if r.kind ~= 0 then t[#t + 1] = r.resp end
  return concat(t)
end
)lua";
constexpr std::string_view kRecordPut =
    R"lua(-- Stores a record in its own key; Redis drops it GRACE after its logical expiry.
local function rput(key, r, now, server)
  if server and r.kind ~= 0 and not r.fp and r.resp == '' and r.attempt <= 8 and
     math.abs(server - now) <= 1000 then
    local ttl = r.expires - r.created
    local dt = r.token - r.created * 1000
    local zt = dt * 2
    if dt < 0 then zt = -dt * 2 - 1 end
    if ttl > 0 and ttl < 268435456 and zt < 2097152 then
      local n = (((r.kind - 1) * 8 + r.attempt - 1) * 2097152 + zt) * 268435456 + ttl
      redis.call('SET', key, int(n), 'PXAT', int(r.expires + GRACE))
      return
    end
  end
  redis.call('SET', key, renc(r), 'PX', int(r.expires - now + GRACE))
end
)lua";
constexpr std::string_view kOwns = R"lua(local function owns(r, now, token)
  return r and now < r.expires and r.kind == 0 and r.token == token
end
)lua";
constexpr std::string_view kBeginDecision =
    R"lua(-- The Begin decision over a stored value `v` (or nil). Returns the reply and the record to
-- store (nil: store nothing).
local function begin(v, key, now, lease, abandoned, fp)
  local r, old = nil, 0
  if v then
    r = rdec(key, v)
    old = r.token
    if now >= r.expires then r = nil end
  end
  if r then
    if r.fp and fp and r.fp ~= fp then return {3} end
    if r.kind ~= 0 then return {2, r.kind - 1, r.attempt, r.resp} end
    if now < r.lease then return {1, r.lease} end
    if r.attempt < 4294967295 then r.attempt = r.attempt + 1 end
  else
    r = {kind = 0, attempt = 1, created = now, fp = fp, resp = ''}
  end
  r.token = newtoken(old)
  r.lease = now + lease
  r.expires = r.lease + abandoned
  return {0, r.token, r.attempt, r.lease}, r
end
)lua";
constexpr std::string_view kSession =
    R"lua(-- Sessions: {low, window, ttl, expires} in field 'h' of the session's hash.
local function sload(key, now)
  local h = redis.call('HGET', key, 'h')
  if not h then return nil end
  local s, i = {}, 1
  s.low, i = get(h, i)
  s.window, i = get(h, i)
  s.ttl, i = get(h, i)
  s.expires, i = getz(h, i)
  s.live = now < s.expires
  return s
end
local function ssave(key, s, now)
  local t = {}
  put(t, s.low)
  put(t, s.window)
  put(t, s.ttl)
  putz(t, s.expires)
  redis.call('HSET', key, 'h', concat(t))
  redis.call('PEXPIRE', key, int(s.expires - now + GRACE))
end
local function sdrop(key, through)
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if f ~= 'h' and tonumber(f) <= through then redis.call('HDEL', key, f) end
  end
end
)lua";
constexpr std::string_view kEntity =
    R"lua(-- Entities: {applied, inprog, token, attempt, lease, expires}.
local function edec(v)
  local e, i = {}, 2
  e.applied, i = get(v, i)
  e.inprog, i = get(v, i)
  e.token, i = get(v, i)
  e.attempt, i = get(v, i)
  e.lease, i = getz(v, i)
  e.expires, i = getz(v, i)
  return e
end
local function eput(key, e, now)
  local t = {char(128)}
  put(t, e.applied)
  put(t, e.inprog)
  put(t, e.token)
  put(t, e.attempt)
  putz(t, e.lease)
  putz(t, e.expires)
  redis.call('SET', key, concat(t), 'PX', int(e.expires - now + GRACE))
end
)lua";
constexpr std::string_view kArgs = R"lua(local key = KEYS[1]
local now = tonumber(ARGV[1])
)lua";

enum Part : unsigned {
  kNeedsVarint = 1u << 0,
  kNeedsToken = 1u << 1,
  kNeedsServerTime = 1u << 2,
  kNeedsRecordDecode = 1u << 3,
  kNeedsRecordEncode = 1u << 4,
  kNeedsRecordPut = 1u << 5,
  kNeedsOwns = 1u << 6,
  kNeedsBeginDecision = 1u << 7,
  kNeedsSession = 1u << 8,
  kNeedsEntity = 1u << 9,
};

struct Body {
  ScriptId id;
  std::string_view name;
  unsigned parts;
  std::string_view text;
};

constexpr unsigned kRecordRead = kNeedsVarint | kNeedsRecordDecode;
constexpr unsigned kRecordWrite =
    kRecordRead | kNeedsRecordEncode | kNeedsRecordPut | kNeedsServerTime | kNeedsOwns;

// Replies: Begin-like answers are {0, token, attempt, lease deadline} Acquired,
// {1, lease deadline} Busy, {2, outcome, attempt, response} Replay, {3} Conflict, {4} Stale,
// {-1} unknown session, {-2, low water, window} past the window. Writes answer 0 (applied),
// 1 (lease lost) or -1 (unknown session).
constexpr Body kBodies[] = {
    {ScriptId::kBegin, "begin", kRecordWrite | kNeedsToken | kNeedsBeginDecision, R"lua(
-- ARGV: now, lease, abandoned retention, fingerprint ('' for none)
local fp = ARGV[4]
if fp == '' then fp = nil end
local reply, r = begin(redis.call('GET', key), key, now, tonumber(ARGV[2]), tonumber(ARGV[3]), fp)
if r then rput(key, r, now) end
return reply
)lua"},
    {ScriptId::kComplete, "complete", kRecordWrite, R"lua(
-- ARGV: now, token, outcome (0 success, 1 failure), retention, response
local v = redis.call('GET', key)
if not v then return 1 end
local r = rdec(key, v)
if not owns(r, now, tonumber(ARGV[2])) then return 1 end
r.kind = 1 + tonumber(ARGV[3])
r.expires = now + tonumber(ARGV[4])
r.resp = ARGV[5]
local server
if not r.fp and r.resp == '' and r.attempt <= 8 then server = servertime() end
rput(key, r, now, server)
return 0
)lua"},
    {ScriptId::kRelease, "release", kRecordRead | kNeedsOwns, R"lua(
-- ARGV: now, token
local v = redis.call('GET', key)
if not v or not owns(rdec(key, v), now, tonumber(ARGV[2])) then return 1 end
redis.call('DEL', key)
return 0
)lua"},
    {ScriptId::kExtend, "extend", kRecordWrite, R"lua(
-- ARGV: now, token, lease, abandoned retention
local v = redis.call('GET', key)
if not v then return 1 end
local r = rdec(key, v)
if not owns(r, now, tonumber(ARGV[2])) then return 1 end
r.lease = now + tonumber(ARGV[3])
r.expires = r.lease + tonumber(ARGV[4])
rput(key, r, now)
return 0
)lua"},
    {ScriptId::kErase, "erase", kRecordRead, R"lua(
-- ARGV: now. 1 if a live record was removed.
local v = redis.call('GET', key)
if not v then return 0 end
local live = now < rdec(key, v).expires
redis.call('DEL', key)
if live then return 1 end
return 0
)lua"},
    {ScriptId::kGet, "get", 0, R"lua(
-- The stored value and, for the compact form, the key's expiry: {value, pexpiretime}.
local v = redis.call('GET', key)
if not v then return false end
if byte(v, 1) < 128 then return {v, redis.call('PEXPIRETIME', key)} end
return {v, -1}
)lua"},
    {ScriptId::kPurge, "purge", kRecordRead | kNeedsSession | kNeedsEntity, R"lua(
-- ARGV: now, what the key holds ('r' record, 's' session, 'e' entity). How many were
-- reclaimed (a session counts with its records).
local what = ARGV[2]
if what == 's' then
  local s = sload(key, now)
  if not s or s.live then return 0 end
  local n = redis.call('HLEN', key)
  redis.call('DEL', key)
  return n
end
local v = redis.call('GET', key)
if not v then return 0 end
local expires
if what == 'e' then expires = edec(v).expires else expires = rdec(key, v).expires end
if now < expires then return 0 end
redis.call('DEL', key)
return 1
)lua"},
    {ScriptId::kOpenSession, "open_session", kNeedsVarint | kNeedsSession, R"lua(
-- ARGV: now, ttl, window. {low water, window, outstanding, expires}
local s = sload(key, now)
local low = 0
if s and s.live then
  low = s.low
elseif s then
  redis.call('DEL', key)
end
s = {low = low, window = tonumber(ARGV[3]), ttl = tonumber(ARGV[2])}
s.expires = now + s.ttl
ssave(key, s, now)
return {s.low, s.window, redis.call('HLEN', key) - 1, s.expires}
)lua"},
    {ScriptId::kBeginSequenced, "begin_sequenced",
     kRecordWrite | kNeedsToken | kNeedsBeginDecision | kNeedsSession, R"lua(
-- ARGV: now, seq, ack, lease, abandoned retention, fingerprint ('' for none)
local s = sload(key, now)
if not s or not s.live then return {-1} end
local seq, ack = tonumber(ARGV[2]), tonumber(ARGV[3])
local low, drop = s.low, 0
if ack > low then
  low = ack
  drop = ack
end
if seq > low and seq - low > s.window then return {-2, s.low, s.window} end
s.low = low
s.expires = now + s.ttl
ssave(key, s, now)
if drop > 0 then sdrop(key, drop) end
if seq <= low then return {4} end
local fp = ARGV[6]
if fp == '' then fp = nil end
local reply, r = begin(redis.call('HGET', key, ARGV[2]), nil, now, tonumber(ARGV[4]),
                       tonumber(ARGV[5]), fp)
if r then redis.call('HSET', key, ARGV[2], renc(r)) end
return reply
)lua"},
    {ScriptId::kCompleteSequenced, "complete_sequenced", kRecordWrite | kNeedsSession, R"lua(
-- ARGV: now, seq, token, outcome, response
local s = sload(key, now)
if not s or not s.live then return -1 end
local v = redis.call('HGET', key, ARGV[2])
if not v then return 1 end
local r = rdec(nil, v)
if not owns(r, now, tonumber(ARGV[3])) then return 1 end
r.kind = 1 + tonumber(ARGV[4])
r.expires = now + UNTIL_ACK
r.resp = ARGV[5]
redis.call('HSET', key, ARGV[2], renc(r))
s.expires = now + s.ttl
ssave(key, s, now)
return 0
)lua"},
    {ScriptId::kReleaseSequenced, "release_sequenced", kRecordRead | kNeedsOwns | kNeedsSession,
     R"lua(
-- ARGV: now, seq, token
local s = sload(key, now)
if not s or not s.live then return -1 end
local v = redis.call('HGET', key, ARGV[2])
if not v or not owns(rdec(nil, v), now, tonumber(ARGV[3])) then return 1 end
redis.call('HDEL', key, ARGV[2])
s.expires = now + s.ttl
ssave(key, s, now)
return 0
)lua"},
    {ScriptId::kAcknowledge, "acknowledge", kNeedsVarint | kNeedsSession, R"lua(
-- ARGV: now, ack. {low water, window, outstanding, expires} or {-1}
local s = sload(key, now)
if not s or not s.live then return {-1} end
local ack, drop = tonumber(ARGV[2]), 0
if ack > s.low then
  s.low = ack
  drop = ack
end
s.expires = now + s.ttl
ssave(key, s, now)
if drop > 0 then sdrop(key, drop) end
return {s.low, s.window, redis.call('HLEN', key) - 1, s.expires}
)lua"},
    {ScriptId::kBeginVersioned, "begin_versioned", kNeedsVarint | kNeedsToken | kNeedsEntity, R"lua(
-- ARGV: now, version, lease, abandoned retention
local version = tonumber(ARGV[2])
local v = redis.call('GET', key)
local e, old = nil, 0
if v then
  e = edec(v)
  old = e.token
  if now >= e.expires then e = nil end
end
if not e then e = {applied = 0, inprog = 0, token = 0, attempt = 0, lease = 0, expires = 0} end
if version <= e.applied then return {4} end
local takeover = false
if e.inprog ~= 0 then
  if now < e.lease then return {1, e.lease} end
  takeover = true
end
if takeover and e.inprog == version then
  if e.attempt < 4294967295 then e.attempt = e.attempt + 1 end
else
  e.attempt = 1
end
e.inprog = version
e.token = newtoken(old)
e.lease = now + tonumber(ARGV[3])
local hold = e.lease + tonumber(ARGV[4])
if e.expires < hold then e.expires = hold end
eput(key, e, now)
return {0, e.token, e.attempt, e.lease}
)lua"},
    {ScriptId::kCompleteVersioned, "complete_versioned", kNeedsVarint | kNeedsEntity, R"lua(
-- ARGV: now, token, retention
local v = redis.call('GET', key)
if not v then return 1 end
local e = edec(v)
if now >= e.expires or e.inprog == 0 or e.token ~= tonumber(ARGV[2]) then return 1 end
e.applied = e.inprog
e.inprog = 0
e.expires = now + tonumber(ARGV[3])
eput(key, e, now)
return 0
)lua"},
    {ScriptId::kReleaseVersioned, "release_versioned", kNeedsVarint | kNeedsEntity, R"lua(
-- ARGV: now, token
local v = redis.call('GET', key)
if not v then return 1 end
local e = edec(v)
if now >= e.expires or e.inprog == 0 or e.token ~= tonumber(ARGV[2]) then return 1 end
e.inprog = 0
eput(key, e, now)
return 0
)lua"},
};

std::string Sha1Hex(std::string_view body) {
  std::array<unsigned char, SHA_DIGEST_LENGTH> digest{};
  SHA1(reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest.data());
  std::string hex;
  for (unsigned char b : digest) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex.append(buf, 2);
  }
  return hex;
}

std::array<Script, static_cast<std::size_t>(ScriptId::kCount)> MakeScripts() {
  std::array<Script, static_cast<std::size_t>(ScriptId::kCount)> scripts;
  for (const Body& b : kBodies) {
    Script& s = scripts[static_cast<std::size_t>(b.id)];
    s.name = b.name;
    s.body = std::string(kBase);
    const std::pair<unsigned, std::string_view> parts[] = {
        {kNeedsVarint, kVarint},
        {kNeedsToken, kToken},
        {kNeedsServerTime, kServerTime},
        {kNeedsRecordDecode, kRecordDecode},
        {kNeedsRecordEncode, kRecordEncode},
        {kNeedsRecordPut, kRecordPut},
        {kNeedsOwns, kOwns},
        {kNeedsBeginDecision, kBeginDecision},
        {kNeedsSession, kSession},
        {kNeedsEntity, kEntity},
    };
    for (const auto& [part, text] : parts) {
      if ((b.parts & part) != 0) s.body += text;
    }
    s.body += kArgs;
    s.body += b.text;
    s.sha = Sha1Hex(s.body);
  }
  return scripts;
}

}  // namespace

const Script& GetScript(ScriptId id) {
  static const auto* scripts =
      new std::array<Script, static_cast<std::size_t>(ScriptId::kCount)>(MakeScripts());
  return (*scripts)[static_cast<std::size_t>(id)];
}

}  // namespace idem::redis
