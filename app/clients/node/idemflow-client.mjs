// idemflow-client.mjs - a reference client for idemflow's HTTP API (Node 18+,
// built-in fetch, no npm packages).
//
// Copy this file into a project, or import it from where the package
// installs it (/usr/share/idemflow/clients/node/). What it does is what
// doc/clients.md asks of every client:
//
// - every logical request (one call of a method below) gets one
//   Idempotency-Key, random (crypto.randomUUID), never made from the time,
//   and sends it with every retry of that request, with the same body
//   bytes; a caller that must survive its own crash makes the key itself,
//   stores it with its intent, and passes it as { key };
// - a lost answer (the connection refused, reset or closed, a timeout) and
//   429, 500, 502, 503 (unavailable or outcome-unknown) and
//   409 idempotency-key-in-flight are retried, with the same key, after an
//   exponential backoff with full jitter, never sooner than Retry-After;
// - every other answer is final: 2xx is returned, anything else throws
//   ApiError at once, 409 idempotency-key-reused and the other 4xx included;
// - the attempts are bounded (maxAttempts) and so is the time (deadlineMs):
//   when either runs out RetriesExhausted is thrown. The request may then
//   have taken effect or not: retry it later with err.key to find out.
//
//   import { Client } from './idemflow-client.mjs';
//   const c = new Client('http://127.0.0.1:8080', token);
//   const wf = (await c.createWorkflow({ type: 'order-flow', input: { order: 42 } })).json();
//   const { jobs } = (await c.activateJobs({ jobType: 'stock', worker: 'w-1' })).json();
//   await c.completeJob(jobs[0].key, { worker: 'w-1', output: { reserved: true } });
//
// MIT licensed, like idemflow.

import { randomUUID } from 'node:crypto';

export const DEFAULT_PROBLEM_BASE = 'https://idemflow.example/problems/';
// Answers that mean "nothing was decided for this key yet, ask again".
export const RETRY_STATUSES = new Set([429, 500, 502, 503, 504]);

// A fresh Idempotency-Key: 122 random bits. Never derive a key from the
// time: two requests in one tick would share it, and the second would be
// answered with the first one's answer.
export function newKey() {
  return randomUUID();
}

function checkKey(key) {
  if (typeof key !== 'string' || key.length < 1 || key.length > 255 || !/^[\x21-\x7e]+$/.test(key)) {
    throw new TypeError('an Idempotency-Key is 1 to 255 printable ASCII characters without spaces');
  }
  return key;
}

// The key as an RFC 8941 string, the IETF draft's form of the header.
function sfString(key) {
  return '"' + key.replace(/\\/g, '\\\\').replace(/"/g, '\\"') + '"';
}

const seg = (s) => encodeURIComponent(String(s));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Retry-After in milliseconds (delta-seconds or an HTTP date), or null.
function retryAfterMs(v) {
  if (v == null) return null;
  v = v.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const when = Date.parse(v);
  return Number.isNaN(when) ? null : Math.max(0, when - Date.now());
}

// A final 2xx answer: status, headers (lower-case names), the body's bytes
// as received, the key it was sent with and how many attempts it took.
export class Answer {
  constructor(status, statusText, headers, body, key, attempts) {
    Object.assign(this, { status, statusText, headers, body, key, attempts });
  }

  // True when this is the stored answer of an earlier attempt.
  get replayed() {
    return this.headers['idempotent-replayed'] === 'true';
  }

  text() {
    return Buffer.from(this.body).toString('utf8');
  }

  json() {
    return this.body.length ? JSON.parse(this.text()) : null;
  }
}

// A final answer that is not 2xx. problemType is the problem's slug
// (idempotency-key-reused, not-found, ...) or null; problem the whole
// application/problem+json object, or null.
export class ApiError extends Error {
  constructor(answer, problem, problemType) {
    const detail = problem && problem.detail ? `: ${problem.detail}` : '';
    super(`${answer.status} ${problemType || answer.statusText}${detail}`);
    this.name = 'ApiError';
    Object.assign(this, { answer, problem, problemType, status: answer.status, key: answer.key, attempts: answer.attempts });
  }
}

// Gave up after maxAttempts tries or at the deadline. last is the last
// Answer (a retryable one) or the error of the last attempt. Whether the
// request took effect is unknown: send it again with { key: err.key }.
export class RetriesExhausted extends Error {
  constructor(key, attempts, last, why) {
    super(`gave up after ${attempts} attempt(s) (${why}); the outcome is unknown: ` +
      `retry later with Idempotency-Key "${key}"`);
    this.name = 'RetriesExhausted';
    Object.assign(this, { key, attempts, last });
  }
}

export class Client {
  // baseUrl: where idemflow answers (a path prefix is kept); token: the
  // tenant's bearer token. maxAttempts (8) and deadlineMs (60 s) bound a
  // logical request; timeoutMs (15 s) bounds one attempt (keep it above the
  // server's idempotency_wait, 5 s). The backoff before retry n (1, 2, ...)
  // is uniform in [0, min(maxDelayMs, baseDelayMs * 2 ** (n - 1))] ("full
  // jitter"); a Retry-After is a floor under it. problemBase is the
  // server's problem_base_uri: problem types are matched on the slug after
  // it (after the last "/" or "#" when they do not start with it).
  constructor(baseUrl, token, {
    maxAttempts = 8, deadlineMs = 60000, timeoutMs = 15000, baseDelayMs = 100,
    maxDelayMs = 10000, problemBase = DEFAULT_PROBLEM_BASE, userAgent = 'idemflow-client-node/1',
  } = {}) {
    const u = new URL(baseUrl);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') {
      throw new TypeError(`baseUrl ${baseUrl}: expected http(s)://host[:port][/prefix]`);
    }
    if (maxAttempts < 1) throw new RangeError('maxAttempts must be at least 1');
    this.base = u.origin + u.pathname.replace(/\/+$/, '');
    this.token = token;
    Object.assign(this, { maxAttempts, deadlineMs, timeoutMs, baseDelayMs, maxDelayMs, problemBase, userAgent });
    this.sleep = sleep; // replaceable, e.g. by a test's clock
  }

  // --- workflows ----------------------------------------------------------
  // POST /v1/workflows: 201 (created, or its replay), or 200 with
  // "existing": true for an active workflow with the same business key.
  // priority (0 to 9) is its job steps' unless a step names its own.
  createWorkflow({ type, input, steps, businessKey, priority }, { key } = {}) {
    return this.request('POST', '/v1/workflows',
      { type, input, steps, business_key: businessKey, priority }, { key });
  }

  getWorkflow(id) {
    return this.request('GET', `/v1/workflows/${seg(id)}`);
  }

  listWorkflows({ state, type, limit, after } = {}) {
    return this.request('GET', '/v1/workflows' + query({ state, type, limit, after }));
  }

  workflowEvents(id, { after, limit } = {}) {
    return this.request('GET', `/v1/workflows/${seg(id)}/events` + query({ after, limit }));
  }

  cancelWorkflow(id, { fromState, key } = {}) {
    return this.request('POST', `/v1/workflows/${seg(id)}/transitions`,
      { to: 'cancelled', from: fromState }, { key });
  }

  resumeWorkflow(id, { retries, key } = {}) {
    return this.request('POST', `/v1/workflows/${seg(id)}/resume`, { retries }, { key });
  }

  // --- messages -----------------------------------------------------------
  // POST /v1/messages: to the workflow with businessKey waiting for name
  // (200), else kept until ttl (202).
  publishMessage({ name, businessKey, messageId, payload, ttl }, { key } = {}) {
    return this.request('POST', '/v1/messages',
      { name, business_key: businessKey, message_id: messageId, payload, ttl }, { key });
  }

  // POST /v1/workflows/{id}/messages.
  deliverMessage(id, { name, messageId, payload }, { key } = {}) {
    return this.request('POST', `/v1/workflows/${seg(id)}/messages`,
      { message_id: messageId, name, payload }, { key });
  }

  // --- jobs ---------------------------------------------------------------
  // POST /v1/jobs/activate. Keyed like every call here: a retry after a
  // lost answer gets the same jobs back instead of an empty list while the
  // lost ones sit leased to nobody who knows it.
  activateJobs({ jobType, worker, maxJobs, leaseSeconds }, { key } = {}) {
    return this.request('POST', '/v1/jobs/activate',
      { job_type: jobType, worker, max_jobs: maxJobs, lease_seconds: leaseSeconds }, { key });
  }

  completeJob(jobKey, { worker, output }, { key } = {}) {
    return this.request('POST', `/v1/jobs/${seg(jobKey)}/complete`, { worker, output }, { key });
  }

  failJob(jobKey, { worker, error, retryAfterSeconds }, { key } = {}) {
    return this.request('POST', `/v1/jobs/${seg(jobKey)}/fail`,
      { worker, error, retry_after_seconds: retryAfterSeconds }, { key });
  }

  heartbeatJob(jobKey, { worker, leaseSeconds, progress }, { key } = {}) {
    return this.request('POST', `/v1/jobs/${seg(jobKey)}/heartbeat`,
      { worker, lease_seconds: leaseSeconds, progress }, { key });
  }

  // --- the one place that sends and retries -------------------------------
  // Send one logical request; every POST carries an Idempotency-Key (key,
  // else a new one), the same on every attempt. Resolves to the 2xx Answer;
  // rejects with ApiError or RetriesExhausted. Members of body that are
  // undefined are left out (JSON.stringify's rule).
  async request(method, path, body, { key } = {}) {
    const data = body === undefined ? undefined : JSON.stringify(body);
    if (method === 'POST') {
      key = key === undefined ? newKey() : checkKey(key);
    } else if (key !== undefined) {
      throw new TypeError('only a POST carries an Idempotency-Key');
    }
    const headers = { authorization: `Bearer ${this.token}`, accept: 'application/json', 'user-agent': this.userAgent };
    if (data !== undefined) headers['content-type'] = 'application/json';
    if (key !== undefined) headers['idempotency-key'] = sfString(key);
    const end = performance.now() + this.deadlineMs;
    for (let attempt = 1; ; attempt++) {
      const left = end - performance.now();
      let last;
      let retryAfter = null;
      try {
        const ans = await this.#attempt(method, this.base + path, headers, data,
          Math.ceil(Math.max(1, Math.min(this.timeoutMs, left))), key, attempt);
        last = ans;
        retryAfter = retryAfterMs(ans.headers['retry-after']);
        if (ans.status >= 200 && ans.status < 300) return ans;
        const [problem, slug] = this.#problem(ans);
        const retry = RETRY_STATUSES.has(ans.status) ||
          (ans.status === 409 && slug === 'idempotency-key-in-flight');
        if (!retry) throw new ApiError(ans, problem, slug);
      } catch (e) {
        if (!lostAnswer(e)) throw e;
        last = e;
      }
      if (attempt >= this.maxAttempts) {
        throw new RetriesExhausted(key, attempt, last, `maxAttempts=${this.maxAttempts}`);
      }
      const cap = Math.min(this.maxDelayMs, this.baseDelayMs * 2 ** (attempt - 1));
      let delay = Math.random() * cap; // jitter only; keys come from newKey()
      if (retryAfter !== null) delay = Math.max(delay, retryAfter + Math.random() * this.baseDelayMs);
      if (performance.now() + delay >= end) {
        throw new RetriesExhausted(key, attempt, last,
          `deadlineMs=${this.deadlineMs} before a wait of ${Math.round(delay)} ms`);
      }
      await this.sleep(delay);
    }
  }

  // One attempt: an Answer, or a thrown error when no whole answer came
  // (the request may have been done all the same).
  async #attempt(method, url, headers, body, timeoutMs, key, attempt) {
    const res = await fetch(url, {
      method, headers, body, redirect: 'manual', signal: AbortSignal.timeout(timeoutMs),
    });
    const bytes = new Uint8Array(await res.arrayBuffer());
    const h = {};
    res.headers.forEach((v, k) => { h[k] = v; });
    return new Answer(res.status, res.statusText, h, bytes, key, attempt);
  }

  #problem(ans) {
    if (!(ans.headers['content-type'] || '').startsWith('application/problem+json')) return [null, null];
    let p;
    try {
      p = ans.json();
    } catch {
      return [null, null];
    }
    const t = p && p.type;
    if (typeof t !== 'string') return [p, null];
    if (this.problemBase && t.startsWith(this.problemBase)) return [p, t.slice(this.problemBase.length)];
    return [p, t.slice(Math.max(t.lastIndexOf('/'), t.lastIndexOf('#')) + 1)];
  }
}

// No answer: fetch's network errors (refused, reset, closed before or
// during the answer: a TypeError with the cause) and the attempt's timeout.
// The request may have been done: ask again. Anything else is a bug or an
// ApiError, and is thrown.
function lostAnswer(e) {
  return (e instanceof TypeError && e.cause !== undefined) ||
    (e && (e.name === 'TimeoutError' || e.name === 'AbortError'));
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null) q.set(k, String(v));
  const s = q.toString();
  return s ? '?' + s : '';
}
