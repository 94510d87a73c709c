-- scripts/lib/bench-jobs.lua - a job worker for wrk (scripts/bench-jobs).
--
-- One connection per thread: activate one job, complete it, repeat. The
-- thread's number names its worker, so the lease compare-and-set sees
-- distinct workers as it would in production. TOKEN comes from the
-- environment. A non-2xx answer counts as an error for wrk's summary.

local counter = 0
local threads = {}

function setup(thread)
	counter = counter + 1
	thread:set("id", counter)
	table.insert(threads, thread)
end

local headers
local key = nil
failed = 0

function init(args)
	headers = {
		["Authorization"] = "Bearer " .. os.getenv("TOKEN"),
		["Content-Type"] = "application/json",
	}
	worker = "wrk-" .. tostring(id)
end

function request()
	if key then
		local k = key
		key = nil
		return wrk.format("POST", "/v1/jobs/" .. k .. "/complete", headers,
			'{"worker":"' .. worker .. '","output":{}}')
	end
	return wrk.format("POST", "/v1/jobs/activate", headers,
		'{"job_type":"bench","worker":"' .. worker .. '","max_jobs":1,"lease_seconds":60}')
end

function response(status, hdrs, body)
	if status ~= 200 then
		failed = failed + 1
		return
	end
	local k = body:match('^{"jobs":%[{"key":"([^"]+)"')
	if k then
		key = k
	end
end

function done(summary, latency, requests)
	local f = 0
	for _, t in ipairs(threads) do
		f = f + (t:get("failed") or 0)
	end
	if f > 0 then
		io.write(string.format("errors %d non-200 answers\n", f))
	end
end
