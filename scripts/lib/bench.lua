-- scripts/lib/bench.lua - wrk script of scripts/bench.
--
--   wrk ... -s bench.lua URL -- MODE TOKEN TAG
--
-- MODE create  POST /v1/workflows, a new Idempotency-Key on every request:
--              TAG-<thread>-<random>-<counter>
--      scatter the same, the key <16 random hex digits>-<thread>-<counter>-TAG:
--              keys spread over the whole key index, as random client keys
--              do, instead of all going to one place in it
--      replay  POST /v1/workflows with the one key TAG (created beforehand)
--      mix     a mix that fills a worker's per-key memory: 20% creates
--              (new keys, as create), 50% replays and 30% reuse conflicts
--              (409) of the keys SEED-1 .. SEED-N, chosen at random,
--              created beforehand with the body {"type":"order-flow",
--              "input":{"pad":"<PAD x's>"}}; extra arguments SEED N PAD
--      get     GET of the URL's path, no headers (GET /healthz)
-- TOKEN  bearer token (create, replay, mix)
--
-- done() prints one line "BENCH_JSON {...}" with the request count, the
-- errors and latency percentiles in microseconds, for scripts/lib/bench.py;
-- "sent" is the number of requests written (create, scatter, mix: the
-- difference to "requests" are those still unanswered when wrk stopped),
-- and in mode mix "status" counts the answers by status.

local BODY = '{"type":"order-flow","input":{"order":42}}'

local nthreads = 0
local threads = {}

function setup(thread)
	nthreads = nthreads + 1
	thread:set("tid", nthreads)
	threads[nthreads] = thread
end

local mode, token, tag
local prefix
local seed, nseed, seedbody
-- Globals, read by done() through thread:get().
counter = 0
statuses = {}

function init(args)
	mode = args[1] or "get"
	token = args[2] or ""
	tag = args[3] or "b"
	local t = tid or 1
	-- wrk gives every thread its own Lua state; seed each one differently.
	math.randomseed(os.time() * 1000 + t * 7919 + math.floor(os.clock() * 1e6))
	prefix = string.format("%s-%d-%08x-", tag, t, math.random(0, 0x7fffffff))
	if mode == "mix" then
		seed = args[4]
		nseed = tonumber(args[5])
		seedbody = '{"type":"order-flow","input":{"pad":"' .. string.rep("x", tonumber(args[6])) .. '"}}'
	end
	if mode ~= "get" then
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
	if mode ~= "create" and mode ~= "scatter" and mode ~= "mix" then
		request = nil
	end
	-- Parsing answers costs the load generator: only mix counts them.
	if mode ~= "mix" then
		response = nil
	end
end

function request()
	counter = counter + 1
	if mode == "create" then
		wrk.headers["Idempotency-Key"] = prefix .. counter
	elseif mode == "scatter" then
		wrk.headers["Idempotency-Key"] = string.format("%08x%08x-%d-%d-%s",
			math.random(0, 0x7fffffff), math.random(0, 0x7fffffff), tid or 1, counter, tag)
	else -- mix
		local r = math.random()
		if r < 0.2 then
			wrk.headers["Idempotency-Key"] = prefix .. counter
			return wrk.format(nil, nil, nil, BODY)
		end
		wrk.headers["Idempotency-Key"] = seed .. "-" .. math.random(1, nseed)
		return wrk.format(nil, nil, nil, r < 0.7 and seedbody or BODY)
	end
	return wrk.format()
end

function response(status, headers, body)
	statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
	local e = summary.errors
	local sent, st = 0, {}
	for _, t in ipairs(threads) do
		sent = sent + (t:get("counter") or 0)
		for k, v in pairs(t:get("statuses") or {}) do
			st[k] = (st[k] or 0) + v
		end
	end
	local parts = {}
	for k, v in pairs(st) do
		parts[#parts + 1] = string.format('"%d":%d', k, v)
	end
	io.write(string.format(
		'BENCH_JSON {"requests":%d,"sent":%d,"status":{%s},"duration_us":%d,"bytes":%d,' ..
		'"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
		'"latency_us":{"mean":%.1f,"stdev":%.1f,"min":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d}}\n',
		summary.requests, sent, table.concat(parts, ","), summary.duration, summary.bytes,
		e.connect, e.read, e.write, e.status, e.timeout,
		latency.mean, latency.stdev, latency.min,
		latency:percentile(50), latency:percentile(90), latency:percentile(99),
		latency:percentile(99.9), latency.max))
end
