-- scripts/lib/bench.lua - wrk script of scripts/bench.
--
--   wrk ... -s bench.lua URL -- MODE TOKEN TAG
--
-- MODE create  POST /v1/workflows, a new Idempotency-Key on every request:
--              TAG-<thread>-<random>-<counter>
--      create-steps  the same with a body of one job step: a command of two
--              round trips (claim and command, then the stored answer),
--              as every keyed command but the plain create
--      scatter the same, the key <16 random hex digits>-<thread>-<counter>-TAG:
--              keys spread over the whole key index, as random client keys
--              do, instead of all going to one place in it
--      replay  POST /v1/workflows with the one key TAG (created beforehand)
--      mix     a mix that fills a worker's per-key memory: 20% creates
--              (new keys, as create), 50% replays and 30% reuse conflicts
--              (409) of the keys SEED-1 .. SEED-N, chosen at random,
--              created beforehand with the body {"type":"order-flow",
--              "input":{"pad":"<PAD x's>"}}; extra arguments SEED N PAD
--      storm   a retry storm: POST /v1/workflows replaying the keys SEED-1 ..
--              SEED-N (created beforehand with bench.py seed's body), each
--              once, in order from OFFSET: thread t of THREADS takes the
--              keys OFFSET + t, OFFSET + t + THREADS, ... (modulo N), so no
--              key is sent twice in a run and no worker has the answer in
--              its replay cache; extra arguments SEED N PAD OFFSET THREADS
--      create-status  create, counting the answers by status (the
--              overload points: 503s and 429s are answers, not errors)
--      soak    scripts/soak's traffic: creates of workflows with one short
--              sleep step (they end by themselves once the reaper fires the
--              timer), 20% replays of the thread's recent keys and 1% reuse
--              conflicts (409) of them, each connection pausing DELAY ms
--              before each request; extra arguments DELAY SLEEP (the step's
--              ISO 8601 duration)
--      get     GET of the URL's path, no headers (GET /healthz)
-- TOKEN  bearer token (create, replay, mix)
--
-- done() prints one line "BENCH_JSON {...}" with the request count, the
-- errors and latency percentiles in microseconds, for scripts/lib/bench.py;
-- "sent" is the number of requests written (create, scatter, mix: the
-- difference to "requests" are those still unanswered when wrk stopped),
-- and in modes mix, storm, soak and create-status "status" counts the answers by
-- status.

local BODY = '{"type":"order-flow","input":{"order":42}}'
local STEPS_BODY = '{"type":"order-flow","input":{"order":42},' ..
    '"steps":[{"name":"pack","job_type":"bench-pack"}]}'

local nthreads = 0
local threads = {}

function setup(thread)
	nthreads = nthreads + 1
	thread:set("tid", nthreads)
	threads[nthreads] = thread
end

local mode, token, tag
local prefix
local seed, nseed, seedbody, offset, nthr
local pause, soakbody, ring, nring = 0, nil, {}, 0
local RING = 4096
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
	if mode == "mix" or mode == "storm" then
		seed = args[4]
		nseed = tonumber(args[5])
		seedbody = '{"type":"order-flow","input":{"pad":"' .. string.rep("x", tonumber(args[6])) .. '"}}'
	end
	if mode == "storm" then
		offset = tonumber(args[7])
		nthr = tonumber(args[8])
	end
	if mode == "soak" then
		pause = tonumber(args[4])
		soakbody = '{"type":"soak","input":{"order":42},"steps":[{"name":"wait","sleep":"' ..
		    args[5] .. '"}]}'
	else
		delay = nil
	end
	if mode ~= "get" then
		wrk.method = "POST"
		wrk.path = "/v1/workflows"
		wrk.body = mode == "create-steps" and STEPS_BODY or BODY
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
	if mode ~= "create" and mode ~= "create-steps" and mode ~= "scatter" and mode ~= "mix" and
	    mode ~= "storm" and mode ~= "create-status" and mode ~= "soak" then
		request = nil
	end
	-- Parsing answers costs the load generator: only these count them.
	if mode ~= "mix" and mode ~= "storm" and mode ~= "create-status" and mode ~= "soak" then
		response = nil
	end
end

function request()
	counter = counter + 1
	if mode == "create" or mode == "create-status" or mode == "create-steps" then
		wrk.headers["Idempotency-Key"] = prefix .. counter
	elseif mode == "soak" then
		local r = math.random()
		if nring > 0 and r < 0.21 then
			wrk.headers["Idempotency-Key"] = ring[math.random(1, nring)]
			return wrk.format(nil, nil, nil, r < 0.2 and soakbody or BODY)
		end
		local key = prefix .. counter
		wrk.headers["Idempotency-Key"] = key
		if nring < RING then
			nring = nring + 1
			ring[nring] = key
		else
			ring[math.random(1, RING)] = key
		end
		return wrk.format(nil, nil, nil, soakbody)
	elseif mode == "storm" then
		local i = (offset + (counter - 1) * nthr + (tid or 1) - 1) % nseed + 1
		wrk.headers["Idempotency-Key"] = seed .. "-" .. i
		return wrk.format(nil, nil, nil, seedbody)
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

function delay()
	return pause
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
