"""idemflow_client - a reference client for idemflow's HTTP API (Python 3.8+,
standard library only).

Copy this file into a project, or import it from where the package installs
it (/usr/share/idemflow/clients/python/). What it does is what
doc/clients.md asks of every client:

- every logical request (one call of a method below) gets one
  Idempotency-Key, random (uuid4, from os.urandom), never made from the
  time, and sends it with every retry of that request, with the same body
  bytes; a caller that must survive its own crash makes the key itself,
  stores it with its intent, and passes it as key=;
- a lost answer (the connection refused, reset or closed, a timeout) and
  429, 500, 502, 503 (unavailable or outcome-unknown) and
  409 idempotency-key-in-flight are retried, with the same key, after an
  exponential backoff with full jitter, never sooner than Retry-After;
- every other answer is final: 2xx is returned, anything else raises
  ApiError at once, 409 idempotency-key-reused and the other 4xx included;
- the attempts are bounded (max_attempts) and so is the time
  (deadline): when either runs out RetriesExhausted is raised. The
  request may then have taken effect or not: retry it later with
  err.key to find out.

    from idemflow_client import Client, ApiError
    c = Client("http://127.0.0.1:8080", token)
    wf = c.create_workflow("order-flow", {"order": 42}).json()
    jobs = c.activate_jobs("stock", worker="w-1").json()["jobs"]
    c.complete_job(jobs[0]["key"], worker="w-1", output={"reserved": True})

MIT licensed, like idemflow.
"""

import email.utils
import http.client
import json
import random
import socket
import time
import urllib.parse
import uuid

__all__ = ["Client", "Answer", "ApiError", "RetriesExhausted", "new_key"]

DEFAULT_PROBLEM_BASE = "https://idemflow.example/problems/"
# Answers that mean "nothing was decided for this key yet, ask again".
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def new_key():
    """A fresh Idempotency-Key: 122 random bits (uuid4 reads os.urandom).
    Never derive a key from the time: two requests in one tick would share
    it, and the second would be answered with the first one's answer."""
    return str(uuid.uuid4())


def _check_key(key):
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or \
            any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ValueError("an Idempotency-Key is 1 to 255 printable ASCII characters "
                         "without spaces")
    return key


def _sf_string(key):
    """The key as an RFC 8941 string, the IETF draft's form of the header."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Answer:
    """A final 2xx answer: status, headers (lower-case names), the body's
    bytes as received, the key it was sent with and how many attempts it
    took."""

    def __init__(self, status, reason, headers, body, key, attempts):
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body
        self.key = key
        self.attempts = attempts

    @property
    def replayed(self):
        """True when this is the stored answer of an earlier attempt."""
        return self.headers.get("idempotent-replayed") == "true"

    def json(self):
        return json.loads(self.body) if self.body else None

    def __repr__(self):
        return f"<Answer {self.status} key={self.key} attempts={self.attempts}>"


class ApiError(Exception):
    """A final answer that is not 2xx. problem_type is the problem's slug
    (idempotency-key-reused, not-found, ...) or None; problem the whole
    application/problem+json object, or None."""

    def __init__(self, answer, problem, problem_type):
        self.answer = answer
        self.status = answer.status
        self.key = answer.key
        self.attempts = answer.attempts
        self.problem = problem
        self.problem_type = problem_type
        detail = problem.get("detail") if isinstance(problem, dict) else None
        super().__init__(f"{answer.status} {problem_type or answer.reason}"
                         + (f": {detail}" if detail else ""))


class RetriesExhausted(Exception):
    """Gave up after attempts tries or at the deadline. last is the last
    Answer (a retryable one) or the exception of the last attempt. Whether
    the request took effect is unknown: send it again with key=self.key."""

    def __init__(self, key, attempts, last, why):
        self.key = key
        self.attempts = attempts
        self.last = last
        super().__init__(f"gave up after {attempts} attempt(s) ({why}); the outcome is "
                         f"unknown: retry later with Idempotency-Key {key!r}; last: {last!r}")


class _Lost(Exception):
    """An attempt that got no answer."""


class Client:
    """base_url: where idemflow answers (a path prefix is kept); token: the
    tenant's bearer token.

    max_attempts (8) and deadline (60 s) bound a logical request; timeout
    (15 s) bounds one attempt (keep it above the server's idempotency_wait,
    5 s). The backoff before retry n (1, 2, ...) is uniform in
    [0, min(max_delay, base_delay * 2 ** (n - 1))] ("full jitter"); a
    Retry-After is a floor under it. problem_base is the server's
    problem_base_uri: problem types are matched on the slug after it (after
    the last "/" or "#" when they do not start with it)."""

    def __init__(self, base_url, token, *, max_attempts=8, deadline=60.0, timeout=15.0,
                 base_delay=0.1, max_delay=10.0, problem_base=DEFAULT_PROBLEM_BASE,
                 user_agent="idemflow-client-python/1"):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url {base_url!r}: expected http(s)://host[:port][/prefix]")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self._token = token
        self.max_attempts = max_attempts
        self.deadline = deadline
        self.timeout = timeout
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.problem_base = problem_base
        self.user_agent = user_agent
        self._random = random.Random()  # jitter only; keys come from new_key()
        self.sleep = time.sleep  # replaceable, e.g. by a test's clock

    # --- workflows ---------------------------------------------------------
    def create_workflow(self, type, input=None, *, steps=None, business_key=None, priority=None,
                        key=None):
        """POST /v1/workflows: 201 (created, or its replay), or 200 with
        "existing": true for an active workflow with the same business key.
        priority (0 to 9) is its job steps' unless a step names its own."""
        body = {"type": type}
        if input is not None:
            body["input"] = input
        if steps is not None:
            body["steps"] = steps
        if business_key is not None:
            body["business_key"] = business_key
        if priority is not None:
            body["priority"] = priority
        return self.request("POST", "/v1/workflows", body, key=key)

    def get_workflow(self, workflow_id):
        return self.request("GET", "/v1/workflows/" + _seg(workflow_id))

    def list_workflows(self, *, state=None, type=None, limit=None, after=None):
        q = {k: v for k, v in (("state", state), ("type", type), ("limit", limit),
                               ("after", after)) if v is not None}
        path = "/v1/workflows" + ("?" + urllib.parse.urlencode(q) if q else "")
        return self.request("GET", path)

    def workflow_events(self, workflow_id, *, after=None, limit=None):
        q = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
        path = f"/v1/workflows/{_seg(workflow_id)}/events"
        return self.request("GET", path + ("?" + urllib.parse.urlencode(q) if q else ""))

    def cancel_workflow(self, workflow_id, *, from_state=None, key=None):
        body = {"to": "cancelled"}
        if from_state is not None:
            body["from"] = from_state
        return self.request("POST", f"/v1/workflows/{_seg(workflow_id)}/transitions", body,
                            key=key)

    def resume_workflow(self, workflow_id, *, retries=None, key=None):
        body = {} if retries is None else {"retries": retries}
        return self.request("POST", f"/v1/workflows/{_seg(workflow_id)}/resume", body, key=key)

    # --- messages ----------------------------------------------------------
    def publish_message(self, name, business_key, message_id, payload=None, *, ttl=None,
                        key=None):
        """POST /v1/messages: to the workflow with business_key waiting for
        name (200), else kept until ttl (202)."""
        body = {"name": name, "business_key": business_key, "message_id": message_id}
        if payload is not None:
            body["payload"] = payload
        if ttl is not None:
            body["ttl"] = ttl
        return self.request("POST", "/v1/messages", body, key=key)

    def deliver_message(self, workflow_id, name, message_id, payload=None, *, key=None):
        """POST /v1/workflows/{id}/messages."""
        body = {"message_id": message_id, "name": name}
        if payload is not None:
            body["payload"] = payload
        return self.request("POST", f"/v1/workflows/{_seg(workflow_id)}/messages", body,
                            key=key)

    # --- jobs --------------------------------------------------------------
    def activate_jobs(self, job_type, worker, *, max_jobs=None, lease_seconds=None, key=None):
        """POST /v1/jobs/activate. Keyed like every call here: a retry after
        a lost answer gets the same jobs back instead of an empty list while
        the lost ones sit leased to nobody who knows it."""
        body = {"job_type": job_type, "worker": worker}
        if max_jobs is not None:
            body["max_jobs"] = max_jobs
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        return self.request("POST", "/v1/jobs/activate", body, key=key)

    def complete_job(self, job_key, worker, output=None, *, key=None):
        body = {"worker": worker}
        if output is not None:
            body["output"] = output
        return self.request("POST", f"/v1/jobs/{_seg(job_key)}/complete", body, key=key)

    def fail_job(self, job_key, worker, error, *, retry_after_seconds=None, key=None):
        body = {"worker": worker, "error": error}
        if retry_after_seconds is not None:
            body["retry_after_seconds"] = retry_after_seconds
        return self.request("POST", f"/v1/jobs/{_seg(job_key)}/fail", body, key=key)

    def heartbeat_job(self, job_key, worker, *, lease_seconds=None, progress=None, key=None):
        body = {"worker": worker}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        if progress is not None:
            body["progress"] = progress
        return self.request("POST", f"/v1/jobs/{_seg(job_key)}/heartbeat", body, key=key)

    # --- the one place that sends and retries -------------------------------
    def request(self, method, path, body=None, *, key=None):
        """Send one logical request; every POST carries an Idempotency-Key
        (key, else a new one), the same on every attempt. Returns the 2xx
        Answer; raises ApiError or RetriesExhausted."""
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        if method == "POST":
            key = _check_key(key) if key is not None else new_key()
        elif key is not None:
            raise ValueError("only a POST carries an Idempotency-Key")
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json",
                   "User-Agent": self.user_agent}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if key is not None:
            headers["Idempotency-Key"] = _sf_string(key)
        end = time.monotonic() + self.deadline
        attempt = 0
        while True:
            attempt += 1
            left = end - time.monotonic()
            try:
                ans = self._attempt(method, self._prefix + path, headers, data,
                                    max(0.001, min(self.timeout, left)), key, attempt)
                last, retry_after = ans, _retry_after(ans.headers.get("retry-after"))
                problem, slug = self._problem(ans)
                if 200 <= ans.status < 300:
                    return ans
                retry = ans.status in RETRY_STATUSES or \
                    (ans.status == 409 and slug == "idempotency-key-in-flight")
                if not retry:
                    raise ApiError(ans, problem, slug)
            except _Lost as e:
                last, retry_after = e.__cause__, None
            if attempt >= self.max_attempts:
                raise RetriesExhausted(key, attempt, last, f"max_attempts={self.max_attempts}")
            cap = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
            delay = self._random.uniform(0, cap)
            if retry_after is not None:
                delay = max(delay, retry_after + self._random.uniform(0, self.base_delay))
            if time.monotonic() + delay >= end:
                raise RetriesExhausted(key, attempt, last,
                                       f"deadline={self.deadline}s before a wait of "
                                       f"{delay:.2f}s")
            self.sleep(delay)

    def _attempt(self, method, target, headers, data, timeout, key, attempt):
        cls = http.client.HTTPSConnection if self._scheme == "https" else \
            http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout)
        try:
            conn.request(method, target, body=data, headers=headers)
            r = conn.getresponse()
            body = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            return Answer(r.status, r.reason, hdrs, body, key, attempt)
        except (OSError, http.client.HTTPException, socket.timeout) as e:
            # No answer: refused, reset, closed before or during the answer,
            # or too slow. The request may have been done: ask again.
            raise _Lost() from e
        finally:
            conn.close()

    def _problem(self, ans):
        if not ans.headers.get("content-type", "").startswith("application/problem+json"):
            return None, None
        try:
            p = json.loads(ans.body)
            t = p.get("type")
        except (ValueError, AttributeError):
            return None, None
        if not isinstance(t, str):
            return p, None
        if self.problem_base and t.startswith(self.problem_base):
            return p, t[len(self.problem_base):]
        return p, t[max(t.rfind("/"), t.rfind("#")) + 1:]


def _seg(s):
    return urllib.parse.quote(str(s), safe="")


def _retry_after(v):
    """Retry-After in seconds (delta-seconds or an HTTP date), or None."""
    if v is None:
        return None
    v = v.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())
