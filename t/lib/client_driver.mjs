// client_driver.mjs - drives app/clients/node/idemflow-client.mjs for
// t/e2e/test_clients.py, one JSON line per call on stdin, one per answer on
// stdout (in the order the calls finish; "id" pairs them):
//
//   {"id": 1, "client": {"baseUrl": ..., "token": ..., options...},
//    "op": "create", "args": {...}, "key": "k" or absent}
//   {"id": 1, "ok": true, "status": 201, "headers": {...}, "body_b64": "...",
//    "key": "...", "attempts": 2, "replayed": true, "ms": 12.3}
//   {"id": 1, "ok": false, "error": "ApiError", "status": 409,
//    "problem_type": "idempotency-key-reused", "key": "...", "attempts": 1}
//
// The ops are the test's names for the client's methods (see OPS).
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';

const mod = await import(pathToFileURL(process.argv[2]).href);

const OPS = {
  create: (c, a, o) => c.createWorkflow({ type: a.type, input: a.input, steps: a.steps, businessKey: a.business_key, priority: a.priority }, o),
  activate: (c, a, o) => c.activateJobs({ jobType: a.job_type, worker: a.worker, maxJobs: a.max_jobs, leaseSeconds: a.lease_seconds }, o),
  complete: (c, a, o) => c.completeJob(a.job_key, { worker: a.worker, output: a.output }, o),
  heartbeat: (c, a, o) => c.heartbeatJob(a.job_key, { worker: a.worker, leaseSeconds: a.lease_seconds, progress: a.progress }, o),
  publish: (c, a, o) => c.publishMessage({ name: a.name, businessKey: a.business_key, messageId: a.message_id, payload: a.payload }, o),
  get: (c, a) => c.getWorkflow(a.id),
};

function result(id, r, t0) {
  const ms = performance.now() - t0;
  if (r instanceof mod.Answer) {
    return { id, ok: true, status: r.status, headers: r.headers, body_b64: Buffer.from(r.body).toString('base64'), key: r.key ?? null, attempts: r.attempts, replayed: r.replayed, ms };
  }
  if (r instanceof mod.ApiError) {
    return { id, ok: false, error: 'ApiError', status: r.status, problem_type: r.problemType, key: r.key ?? null, attempts: r.attempts, ms };
  }
  if (r instanceof mod.RetriesExhausted) {
    return { id, ok: false, error: 'RetriesExhausted', status: r.last instanceof mod.Answer ? r.last.status : null, last: r.last instanceof mod.Answer ? null : String(r.last && (r.last.cause || r.last)), key: r.key, attempts: r.attempts, ms };
  }
  return { id, ok: false, error: String(r && r.name), message: String(r && r.stack), ms };
}

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const cmd = JSON.parse(line);
  const { baseUrl, token, ...options } = cmd.client;
  const client = new mod.Client(baseUrl, token, options);
  const opts = cmd.key === undefined ? {} : { key: cmd.key };
  const t0 = performance.now();
  // Not awaited: calls run side by side, as the test needs for a held key.
  OPS[cmd.op](client, cmd.args, opts).then(
    (r) => process.stdout.write(JSON.stringify(result(cmd.id, r, t0)) + '\n'),
    (e) => process.stdout.write(JSON.stringify(result(cmd.id, e, t0)) + '\n'));
}
