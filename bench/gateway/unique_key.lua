-- wrk script: every request is a POST with a key never used before, so idemd forwards each one
-- to the upstream (the "new key" path). Key = <random prefix>-<thread id>-<counter>.
--
--   wrk -s bench/gateway/unique_key.lua -c64 -t1 -d10s --latency http://127.0.0.1:PORT/ping
--
-- BENCH_BODY (env) overrides the JSON body.

local threads = {}
local next_thread_id = 0

function setup(thread)
  next_thread_id = next_thread_id + 1
  thread:set("thread_id", next_thread_id)
  table.insert(threads, thread)
end

local counter = 0
local prefix
local headers

function init(args)
  -- Seeded per thread and per run: two runs against one store never share keys.
  math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919 + math.floor(os.clock() * 1e6))
  prefix = string.format("%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
  wrk.method = "POST"
  wrk.body = os.getenv("BENCH_BODY") or '{"account":"acc-bench","amount":1250}'
  -- wrk.format replaces wrk.headers with the table it is given, so carry the fixed ones.
  headers = {}
  for name, value in pairs(wrk.headers) do headers[name] = value end
  headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = prefix .. "-" .. (thread_id or 0) .. "-" .. counter
  return wrk.format(nil, nil, headers)
end
