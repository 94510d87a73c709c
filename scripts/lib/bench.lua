-- scripts/lib/bench.lua - wrk script of scripts/bench.
--
--   wrk ... -s bench.lua URL -- MODE TOKEN TAG
--
-- MODE create  POST /v1/workflows, a new Idempotency-Key on every request:
--              TAG-<thread>-<random>-<counter>
--      replay  POST /v1/workflows with the one key TAG (created beforehand)
--      get     GET of the URL's path, no headers (GET /healthz)
-- TOKEN  bearer token (create, replay)
--
-- done() prints one line "BENCH_JSON {...}" with the request count, the
-- errors and latency percentiles in microseconds, for scripts/lib/bench.py.

local BODY = '{"type":"order-flow","input":{"order":42}}'

local nthreads = 0

function setup(thread)
	nthreads = nthreads + 1
	thread:set("tid", nthreads)
end

local mode, token, tag
local prefix
local counter = 0

function init(args)
	mode = args[1] or "get"
	token = args[2] or ""
	tag = args[3] or "b"
	local t = tid or 1
	-- wrk gives every thread its own Lua state; seed each one differently.
	math.randomseed(os.time() * 1000 + t * 7919 + math.floor(os.clock() * 1e6))
	prefix = string.format("%s-%d-%08x-", tag, t, math.random(0, 0x7fffffff))
	if mode == "create" or mode == "replay" then
		wrk.method = "POST"
		wrk.path = "/v1/workflows"
		wrk.body = BODY
		wrk.headers["Content-Type"] = "application/json"
		wrk.headers["Authorization"] = "Bearer " .. token
		if mode == "replay" then
			wrk.headers["Idempotency-Key"] = tag
		end
	else
		wrk.method = "GET"
	end
	-- Only create needs a new request each time. Without a request()
	-- function wrk formats the request once and sends the same bytes
	-- again, so replays and GET /healthz cost the load generator alike.
	if mode ~= "create" then
		request = nil
	end
end

function request()
	if mode == "create" then
		counter = counter + 1
		wrk.headers["Idempotency-Key"] = prefix .. counter
	end
	return wrk.format()
end

function done(summary, latency, requests)
	local e = summary.errors
	io.write(string.format(
		'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
		'"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
		'"latency_us":{"mean":%.1f,"stdev":%.1f,"min":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d}}\n',
		summary.requests, summary.duration, summary.bytes,
		e.connect, e.read, e.write, e.status, e.timeout,
		latency.mean, latency.stdev, latency.min,
		latency:percentile(50), latency:percentile(90), latency:percentile(99),
		latency:percentile(99.9), latency.max))
end
