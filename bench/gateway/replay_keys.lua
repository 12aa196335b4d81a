-- wrk script: every request reuses one of a fixed set of keys, "replay-1" .. "replay-N", with
-- the same body, so once the keys are completed idemd answers from its store (the replay path,
-- no upstream call).
--
--   BENCH_REPLAY_KEYS   N, default 1000
--   BENCH_WARM=1        the warm-up pass: send each key once, in order, then stop sending (wrk
--                       still waits out its -d). Run it with -t1 -c1 so no two requests with one
--                       key overlap (they would get 409). It prints "warm: ok" when all N keys
--                       answered 2xx, "warm: incomplete" if -d was too short (run it again:
--                       completed keys replay), "warm: failed" if any answer was not 2xx.
--   BENCH_BODY          overrides the JSON body (must match between the passes).

local threads = {}
local next_thread_id = 0

function setup(thread)
  next_thread_id = next_thread_id + 1
  thread:set("thread_id", next_thread_id)
  table.insert(threads, thread)
end

local keys = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "1000")
local warm = os.getenv("BENCH_WARM") == "1"
local counter = 0
bad = 0
local headers

function init(args)
  wrk.method = "POST"
  wrk.body = os.getenv("BENCH_BODY") or '{"account":"acc-bench","amount":1250}'
  headers = {}
  for name, value in pairs(wrk.headers) do headers[name] = value end
  headers["Content-Type"] = "application/json"
  -- Threads start at different places in the cycle.
  counter = ((thread_id or 1) - 1) * 997
end

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = "replay-" .. (((counter - 1) % keys) + 1)
  return wrk.format(nil, nil, headers)
end

if warm then
  answered = 0

  function response(status, response_headers, body)
    answered = answered + 1
    if status < 200 or status > 299 then
      bad = bad + 1
    end
    if answered >= keys then
      wrk.thread:stop()
    end
  end

  function done(summary, latency, requests)
    local total_answered, total_bad = 0, 0
    for _, thread in ipairs(threads) do
      total_answered = total_answered + (thread:get("answered") or 0)
      total_bad = total_bad + (thread:get("bad") or 0)
    end
    io.write(string.format("warm: %d answered, %d not 2xx\n", total_answered, total_bad))
    if total_bad > 0 then
      io.write("warm: failed\n")
    elseif total_answered < keys then
      io.write("warm: incomplete\n")
    else
      io.write("warm: ok\n")
    end
  end
end
