#include "stores/redis/scripts.h"

#include <openssl/sha.h>

#include <array>
#include <cstdio>
#include <utility>

namespace idem::redis {
namespace {

// The helpers the scripts are made of, in the order they must appear. Each script takes only
// the parts it uses: Redis runs a script's whole text on every call, and every `local
// function` it defines is a new closure each time. Values are packed and unpacked with Redis's
// struct library (C), one call a value: Lua loops over bytes cost more than the rest of a call.
//
// Lua 5.1 numbers are doubles: every integer here stays below 2^53 (the store refuses
// sequence numbers and versions above that; tokens and times are far below), and nothing is
// turned into a string with tostring (which would round).
constexpr std::string_view kHead = R"lua(
local key = KEYS[1]
local now = tonumber(ARGV[1])
)lua";
constexpr std::string_view kBase = R"lua(
local pack, unpack, byte, sub = struct.pack, struct.unpack, string.byte, string.sub
local GRACE = 10000
local UNTIL_ACK = 3153600000000
-- Numbers handed to redis.call as exact decimal strings, whatever Redis's own conversion does.
local function int(n) return string.format('%.0f', n) end
)lua";
constexpr std::string_view kToken = R"lua(
-- A token above `old` (the token stored for the key, 0 if none) and, as long as the server's
-- clock does not step back, above every token handed out for the key before.
local function newtoken(old)
  local t = redis.call('TIME')
  local tok = t[1] * 1000000 + t[2]
  if tok <= old then tok = old + 1 end
  return tok
end
)lua";
constexpr std::string_view kServerTime = R"lua(
local function servertime()
  local t = redis.call('TIME')
  return t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
end
)lua";
constexpr std::string_view kRecordDecode = R"lua(
-- Records: {kind = 0 in progress | 1 success | 2 failure, token, attempt, created, expires,
-- lease, fp (32 bytes or nil), resp}. `k` is nil for a session's records (never compact).
local function rdec(k, v)
  local h = byte(v, 1)
  if h < 128 then
    local n = tonumber(v)
    local ttl = n % 268435456
    n = (n - ttl) / 268435456
    local zt = n % 2097152
    n = (n - zt) / 2097152
    local expires = redis.call('PEXPIRETIME', k) - GRACE
    local created = expires - ttl
    local dt = zt / 2
    if zt % 2 == 1 then dt = -(zt + 1) / 2 end
    return {kind = (n - n % 8) / 8 + 1, token = created * 1000 + dt, attempt = n % 8 + 1,
            created = created, expires = expires, lease = 0, resp = ''}
  end
  local r, i = {kind = h % 4, lease = 0, resp = ''}, 0
  local _
  if r.kind == 0 then
    _, r.token, r.attempt, r.created, r.expires, r.lease, i = unpack('<BI7I4i6i6i6', v)
  else
    _, r.token, r.attempt, r.created, r.expires, i = unpack('<BI7I4i6i6', v)
  end
  if h >= 132 then
    r.fp = sub(v, i, i + 31)
    i = i + 32
  end
  if r.kind ~= 0 then r.resp = sub(v, i) end
  return r
end
)lua";
constexpr std::string_view kRecordEncode = R"lua(
local function renc(r)
  local h, fp = 128 + r.kind, r.fp or ''
  if r.fp then h = h + 4 end
  if r.kind == 0 then
    return pack('<BI7I4i6i6i6', h, r.token, r.attempt, r.created, r.expires, r.lease) .. fp
  end
  return pack('<BI7I4i6i6', h, r.token, r.attempt, r.created, r.expires) .. fp .. r.resp
end
)lua";
constexpr std::string_view kRecordPut = R"lua(
-- Stores a record in its own key; Redis drops it GRACE after its logical expiry.
local function rput(r, server)
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
constexpr std::string_view kOwns = R"lua(
local function owns(r, token)
  return r and now < r.expires and r.kind == 0 and r.token == token
end
)lua";
constexpr std::string_view kBeginDecision = R"lua(
-- The Begin decision over a stored value `v` (or nil). `tok` is a fresh token from TIME, or
-- nil to take one only if needed. Returns the reply and the record to store (nil: none).
local function begin(v, k, lease, abandoned, fp, tok)
  local r, old = nil, 0
  if v then
    r = rdec(k, v)
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
  if not tok then
    tok = newtoken(old)
  elseif tok <= old then
    tok = old + 1
  end
  r.token = tok
  r.lease = now + lease
  r.expires = r.lease + abandoned
  return {0, r.token, r.attempt, r.lease}, r
end
)lua";
constexpr std::string_view kSession = R"lua(
-- Sessions: {low, window, ttl, expires} in field 'h' of the session's hash.
local function sload()
  local h = redis.call('HGET', key, 'h')
  if not h then return nil end
  local s = {}
  local _
  s.low, s.window, s.ttl, s.expires = unpack('<I7I4I7i6', h)
  s.live = now < s.expires
  return s
end
local function ssave(s)
  redis.call('HSET', key, 'h', pack('<I7I4I7i6', s.low, s.window, s.ttl, s.expires))
  redis.call('PEXPIRE', key, int(s.expires - now + GRACE))
end
local function sdrop(through)
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if f ~= 'h' and tonumber(f) <= through then redis.call('HDEL', key, f) end
  end
end
)lua";
constexpr std::string_view kEntity = R"lua(
-- Entities: {applied, inprog, token, attempt, lease, expires}.
local function edec(v)
  local e = {}
  local _
  _, e.applied, e.inprog, e.token, e.attempt, e.lease, e.expires = unpack('<BI7I7I7I4i6i6', v)
  return e
end
local function eput(e)
  redis.call('SET', key, pack('<BI7I7I7I4i6i6', 128, e.applied, e.inprog, e.token, e.attempt,
                              e.lease, e.expires), 'PX', int(e.expires - now + GRACE))
end
)lua";

enum Part : unsigned {
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

// A script is kHead, its fast path (straight-line code for the common case, no closures or
// tables: it runs on nearly every call), kBase and the helper parts it uses (created only when
// the fast path does not return), then the rest of its text.
struct Body {
  ScriptId id;
  std::string_view name;
  std::string_view fast;
  unsigned parts;
  std::string_view text;
};

constexpr unsigned kRecordRead = kNeedsRecordDecode;
constexpr unsigned kRecordWrite = kRecordRead | kNeedsRecordEncode | kNeedsRecordPut | kNeedsOwns;

// Replies: Begin-like answers are {0, token, attempt, lease deadline} Acquired,
// {1, lease deadline} Busy, {2, outcome, attempt, response} Replay, {3} Conflict, {4} Stale,
// {-1} unknown session, {-2, low water, window} past the window. Writes answer 0 (applied),
// 1 (lease lost) or -1 (unknown session).
// ARGV: now, lease, abandoned retention, fingerprint ('' for none). Most keys are new: write
// the new record if the key is absent, in the same call that reads what it holds otherwise
// (TIME and SET: two calls into Redis, not three).
constexpr std::string_view kBeginFast = R"lua(
local lease, abandoned, fp = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local t = redis.call('TIME')
local tok = t[1] * 1000000 + t[2]
local deadline = now + lease
local h = 128
if fp == '' then fp = nil else h = 132 end
local v = redis.call('SET', key,
                     struct.pack('<BI7I4i6i6i6', h, tok, 1, now, deadline + abandoned, deadline) ..
                       (fp or ''),
                     'NX', 'PX', string.format('%.0f', deadline + abandoned - now + 10000), 'GET')
if not v then return {0, tok, 1, deadline} end
)lua";

// ARGV: now, token, outcome (0 success, 1 failure), retention, response. Only an in-progress
// record (header 0x80, or 0x84 with a fingerprint) can be completed.
constexpr std::string_view kCompleteFast = R"lua(
local v = redis.call('GET', key)
if not v then return 1 end
local h = string.byte(v, 1)
if h ~= 128 and h ~= 132 then return 1 end
local _, tok, attempt, created, expires, lease, i = struct.unpack('<BI7I4i6i6i6', v)
if now >= expires or tok ~= tonumber(ARGV[2]) then return 1 end
local kind, resp = 1 + tonumber(ARGV[3]), ARGV[5]
expires = now + tonumber(ARGV[4])
if h == 132 or resp ~= '' or attempt > 8 then
  local fp = ''
  if h == 132 then fp = string.sub(v, i, i + 31) end
  redis.call('SET', key, struct.pack('<BI7I4i6i6', h + kind, tok, attempt, created, expires) ..
                           fp .. resp, 'PX', string.format('%.0f', expires - now + 10000))
  return 0
end
)lua";

// Batches on one node: KEYS are the records, ARGV now, abandoned retention, the lease when
// every key of the call has the same one ('' otherwise), then per key its fingerprint (same
// lease) or its lease and fingerprint. One TIME for the batch. New keys are taken in the first
// pass, one SET each; keys that hold something are decided in a second pass, in batch order,
// each on a fresh read (an earlier entry of the batch may have changed it). With one lease the
// value and expiry of a new key are the same for every key without a fingerprint, and so is
// the answer: made once, not once a key (Redis's CPU is what a batch is short of). Then a key
// acquired in the first pass answers just 0, and the token and lease deadline follow the
// answers, once.
constexpr std::string_view kBeginManyFast = R"lua(
local abandoned, ulease = tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local tok = t[1] * 1000000 + t[2]
local out, slow = {}, {}
if ulease then
  local deadline = now + ulease
  local px = string.format('%.0f', ulease + abandoned + 10000)
  local plain = struct.pack('<BI7I4i6i6i6', 128, tok, 1, now, deadline + abandoned, deadline)
  local withfp = struct.pack('<BI7I4i6i6i6', 132, tok, 1, now, deadline + abandoned, deadline)
  for i = 1, #KEYS do
    local fp, v = ARGV[3 + i], nil
    if fp == '' then
      v = redis.call('SET', KEYS[i], plain, 'NX', 'PX', px, 'GET')
    else
      v = redis.call('SET', KEYS[i], withfp .. fp, 'NX', 'PX', px, 'GET')
    end
    if v then
      slow[#slow + 1] = i
    else
      out[i] = 0
    end
  end
  out[#KEYS + 1] = tok
  out[#KEYS + 2] = deadline
else
  for i = 1, #KEYS do
    local deadline, fp = now + tonumber(ARGV[2 * i + 2]), ARGV[2 * i + 3]
    local h = 128
    if fp ~= '' then h = 132 end
    local v = redis.call('SET', KEYS[i],
                         struct.pack('<BI7I4i6i6i6', h, tok, 1, now, deadline + abandoned,
                                     deadline) .. fp,
                         'NX', 'PX', string.format('%.0f', deadline + abandoned - now + 10000),
                         'GET')
    if v then
      slow[#slow + 1] = i
    else
      out[i] = {0, tok, 1, deadline}
    end
  end
end
if #slow == 0 then return out end
)lua";

// KEYS are the records; ARGV now, '1' if no key appears twice in the call ('' otherwise), the
// outcome and retention when every key of the call has the same ones ('' and '' otherwise),
// then per key its token and response (same outcome and retention) or its token, outcome,
// retention and response. Distinct keys are read with one MGET for the call rather than a GET
// each (each redis.call costs Redis about as much again as the command); a key that appears
// twice is read where its entry is, since an earlier entry may have completed it.
constexpr std::string_view kCompleteManyFast = R"lua(
local out, server, values = {}, nil, nil
if ARGV[2] == '1' then values = redis.call('MGET', unpack(KEYS)) end
local ukind, uretention = tonumber(ARGV[3]), tonumber(ARGV[4])
local upx
if ukind then
  ukind = ukind + 1
  upx = string.format('%.0f', uretention + 10000)
end
for i = 1, #KEYS do
  local k = KEYS[i]
  local v
  if values then v = values[i] else v = redis.call('GET', k) end
  out[i] = 1
  local h = v and string.byte(v, 1)
  if h == 128 or h == 132 then
    local token, kind, retention, px, resp
    if ukind then
      token, kind, retention, px, resp = ARGV[2 * i + 3], ukind, uretention, upx, ARGV[2 * i + 4]
    else
      local b = 4 * i
      token, kind, retention, resp =
        ARGV[b + 1], 1 + tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4]
    end
    local _, tok, attempt, created, expires, lease, j = struct.unpack('<BI7I4i6i6i6', v)
    if now < expires and tok == tonumber(token) then
      expires = now + retention
      local n
      if h == 128 and resp == '' and attempt <= 8 then
        if not server then
          local t = redis.call('TIME')
          server = t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
        end
        local dt = tok - created * 1000
        local zt = dt * 2
        if dt < 0 then zt = -dt * 2 - 1 end
        local ttl = expires - created
        if math.abs(server - now) <= 1000 and ttl > 0 and ttl < 268435456 and zt < 2097152 then
          n = (((kind - 1) * 8 + attempt - 1) * 2097152 + zt) * 268435456 + ttl
        end
      end
      if n then
        redis.call('SET', k, string.format('%.0f', n), 'PXAT', string.format('%.0f', expires + 10000))
      else
        local fp = ''
        if h == 132 then fp = string.sub(v, j, j + 31) end
        redis.call('SET', k, struct.pack('<BI7I4i6i6', h + kind, tok, attempt, created, expires) ..
                               fp .. resp, 'PX', px or string.format('%.0f', retention + 10000))
      end
      out[i] = 0
    end
  end
end
do return out end
)lua";

constexpr Body kBodies[] = {
    {ScriptId::kBegin, "begin", kBeginFast, kRecordWrite | kNeedsToken | kNeedsBeginDecision,
     R"lua(
-- The key holds something: decide over it, with the token taken above.
local reply, taken = begin(v, key, lease, abandoned, fp, tok)
if taken then rput(taken) end
return reply
)lua"},
    {ScriptId::kComplete, "complete", kCompleteFast, kRecordWrite | kNeedsServerTime, R"lua(
-- Reached only for a compact-form candidate (no fingerprint, no response, attempt <= 8).
rput({kind = kind, token = tok, attempt = attempt, created = created, expires = expires,
      resp = ''}, servertime())
return 0
)lua"},
    {ScriptId::kRelease, "release", "", kRecordRead | kNeedsOwns, R"lua(
-- ARGV: now, token
local v = redis.call('GET', key)
if not v or not owns(rdec(key, v), tonumber(ARGV[2])) then return 1 end
redis.call('DEL', key)
return 0
)lua"},
    {ScriptId::kExtend, "extend", "", kRecordWrite, R"lua(
-- ARGV: now, token, lease, abandoned retention
local v = redis.call('GET', key)
if not v then return 1 end
local r = rdec(key, v)
if not owns(r, tonumber(ARGV[2])) then return 1 end
r.lease = now + tonumber(ARGV[3])
r.expires = r.lease + tonumber(ARGV[4])
rput(r)
return 0
)lua"},
    {ScriptId::kErase, "erase", "", kRecordRead, R"lua(
-- ARGV: now. 1 if a live record was removed.
local v = redis.call('GET', key)
if not v then return 0 end
local live = now < rdec(key, v).expires
redis.call('DEL', key)
if live then return 1 end
return 0
)lua"},
    {ScriptId::kGet, "get", "", 0, R"lua(
-- The stored value and, for the compact form, the key's expiry: {value, pexpiretime}.
local v = redis.call('GET', key)
if not v then return false end
if byte(v, 1) < 128 then return {v, redis.call('PEXPIRETIME', key)} end
return {v, -1}
)lua"},
    {ScriptId::kPurge, "purge", "", kRecordRead | kNeedsSession | kNeedsEntity, R"lua(
-- ARGV: now, what the key holds ('r' record, 's' session, 'e' entity). How many were
-- reclaimed (a session counts with its records).
local what = ARGV[2]
if what == 's' then
  local s = sload()
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
    {ScriptId::kOpenSession, "open_session", "", kNeedsSession, R"lua(
-- ARGV: now, ttl, window. {low water, window, outstanding, expires}
local s = sload()
local low = 0
if s and s.live then
  low = s.low
elseif s then
  redis.call('DEL', key)
end
s = {low = low, window = tonumber(ARGV[3]), ttl = tonumber(ARGV[2])}
s.expires = now + s.ttl
ssave(s)
return {s.low, s.window, redis.call('HLEN', key) - 1, s.expires}
)lua"},
    {ScriptId::kBeginSequenced, "begin_sequenced", "",
     kRecordWrite | kNeedsToken | kNeedsBeginDecision | kNeedsSession, R"lua(
-- ARGV: now, seq, ack, lease, abandoned retention, fingerprint ('' for none)
local s = sload()
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
ssave(s)
if drop > 0 then sdrop(drop) end
if seq <= low then return {4} end
local fp = ARGV[6]
if fp == '' then fp = nil end
local reply, r = begin(redis.call('HGET', key, ARGV[2]), nil, tonumber(ARGV[4]),
                       tonumber(ARGV[5]), fp)
if r then redis.call('HSET', key, ARGV[2], renc(r)) end
return reply
)lua"},
    {ScriptId::kCompleteSequenced, "complete_sequenced", "", kRecordWrite | kNeedsSession, R"lua(
-- ARGV: now, seq, token, outcome, response
local s = sload()
if not s or not s.live then return -1 end
local v = redis.call('HGET', key, ARGV[2])
if not v then return 1 end
local r = rdec(nil, v)
if not owns(r, tonumber(ARGV[3])) then return 1 end
r.kind = 1 + tonumber(ARGV[4])
r.expires = now + UNTIL_ACK
r.resp = ARGV[5]
redis.call('HSET', key, ARGV[2], renc(r))
s.expires = now + s.ttl
ssave(s)
return 0
)lua"},
    {ScriptId::kReleaseSequenced, "release_sequenced", "", kRecordRead | kNeedsOwns | kNeedsSession,
     R"lua(
-- ARGV: now, seq, token
local s = sload()
if not s or not s.live then return -1 end
local v = redis.call('HGET', key, ARGV[2])
if not v or not owns(rdec(nil, v), tonumber(ARGV[3])) then return 1 end
redis.call('HDEL', key, ARGV[2])
s.expires = now + s.ttl
ssave(s)
return 0
)lua"},
    {ScriptId::kAcknowledge, "acknowledge", "", kNeedsSession, R"lua(
-- ARGV: now, ack. {low water, window, outstanding, expires} or {-1}
local s = sload()
if not s or not s.live then return {-1} end
local ack, drop = tonumber(ARGV[2]), 0
if ack > s.low then
  s.low = ack
  drop = ack
end
s.expires = now + s.ttl
ssave(s)
if drop > 0 then sdrop(drop) end
return {s.low, s.window, redis.call('HLEN', key) - 1, s.expires}
)lua"},
    {ScriptId::kBeginVersioned, "begin_versioned", "", kNeedsToken | kNeedsEntity, R"lua(
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
eput(e)
return {0, e.token, e.attempt, e.lease, takeover and 1 or 0}
)lua"},
    {ScriptId::kCompleteVersioned, "complete_versioned", "", kNeedsEntity, R"lua(
-- ARGV: now, token, retention
local v = redis.call('GET', key)
if not v then return 1 end
local e = edec(v)
if now >= e.expires or e.inprog == 0 or e.token ~= tonumber(ARGV[2]) then return 1 end
e.applied = e.inprog
e.inprog = 0
e.expires = now + tonumber(ARGV[3])
eput(e)
return 0
)lua"},
    {ScriptId::kBeginMany, "begin_many", kBeginManyFast,
     kRecordWrite | kNeedsToken | kNeedsBeginDecision, R"lua(
for _, i in ipairs(slow) do
  key = KEYS[i]
  local lease, fp = ulease, nil
  if lease then
    fp = ARGV[3 + i]
  else
    lease, fp = tonumber(ARGV[2 * i + 2]), ARGV[2 * i + 3]
  end
  if fp == '' then fp = nil end
  local reply, taken = begin(redis.call('GET', key), key, lease, abandoned, fp, tok)
  if taken then rput(taken) end
  out[i] = reply
end
return out
)lua"},
    {ScriptId::kCompleteMany, "complete_many", kCompleteManyFast, 0, ""},
    {ScriptId::kReleaseVersioned, "release_versioned", "", kNeedsEntity, R"lua(
-- ARGV: now, token
local v = redis.call('GET', key)
if not v then return 1 end
local e = edec(v)
if now >= e.expires or e.inprog == 0 or e.token ~= tonumber(ARGV[2]) then return 1 end
e.inprog = 0
eput(e)
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
    s.body = std::string(kHead);
    s.body += b.fast;
    s.body += kBase;
    const std::pair<unsigned, std::string_view> parts[] = {
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
