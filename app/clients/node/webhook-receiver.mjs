// webhook-receiver.mjs - receive idemflow's webhooks and apply each event
// once (Node 18+, built-ins only: node:http, node:crypto).
//
// idemflow-dispatch delivers every event at least once: after a lost
// answer, a timeout or a crash it sends the same event again, with the same
// id. This receiver makes the effect happen once all the same:
//
// 1. verify the Standard Webhooks signature over the body's raw bytes:
//    webhook-signature holds one or more "v1,<base64 HMAC-SHA256 of
//    id.timestamp.body>" separated by spaces (several while a secret is
//    rotated; any match will do), webhook-timestamp must be within five
//    minutes of now; a secret "whsec_<base64>" is the decoded bytes, any
//    other secret its own bytes, as idemflow-dispatch takes it. A bad or
//    missing signature is 401 and nothing is applied: the dispatcher treats
//    a 4xx other than 408 and 429 as final (the event is dead until an
//    operator requeues it);
// 2. skip an event id already applied, apply a new one, and remember its
//    id only once the effect is done; a failed effect answers 500 and the
//    event comes again.
//
// The ids are remembered in a Set in memory: that is a sketch, lost on a
// restart, and it cannot commit with the effect. In production the id goes
// into an inbox table in the same database transaction as the effect (the
// consumer inbox, doc/clients.md), so that both commit or neither.
//
//   WEBHOOK_SECRET='whsec_...' node webhook-receiver.mjs --port 8000
//
// WEBHOOK_SECRET may hold several secrets separated by spaces (the old and
// the new one while rotating). The secret is read from the environment, not
// the command line, which other users can read.
//
// MIT licensed, like idemflow.

import { createHmac, timingSafeEqual } from 'node:crypto';
import { realpathSync } from 'node:fs';
import { createServer } from 'node:http';
import { pathToFileURL } from 'node:url';

export const TOLERANCE_SECONDS = 300;
const MAX_BODY = 16 * 1024 * 1024;

export class InvalidSignature extends Error {}

// The HMAC key of a secret, as idemflow-dispatch reads it.
export function secretKey(secret) {
  if (secret.startsWith('whsec_')) {
    const b64 = secret.slice('whsec_'.length);
    if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(b64) || !b64) {
      throw new TypeError('the text after whsec_ is not base64');
    }
    return Buffer.from(b64, 'base64');
  }
  return Buffer.from(secret, 'utf8');
}

// Check a delivery; returns its webhook-id, or throws InvalidSignature.
// keys: HMAC keys (secretKey()); headers: Node's lower-case header object;
// body: the raw bytes as received (a Buffer).
export function verify(keys, headers, body, { now = Date.now() / 1000, tolerance = TOLERANCE_SECONDS } = {}) {
  const id = headers['webhook-id'];
  const ts = headers['webhook-timestamp'];
  const sigs = headers['webhook-signature'];
  if (!id || !ts || !sigs) throw new InvalidSignature('missing webhook-id, webhook-timestamp or webhook-signature');
  if (!/^\d+$/.test(ts)) throw new InvalidSignature('webhook-timestamp is not unix seconds');
  if (Math.abs(now - Number(ts)) > tolerance) throw new InvalidSignature('webhook-timestamp is too far from now');
  const signed = Buffer.concat([Buffer.from(`${id}.${ts}.`), body]);
  const expected = keys.map((k) => createHmac('sha256', k).update(signed).digest());
  for (const entry of sigs.split(' ')) {
    const [version, sig] = [entry.slice(0, entry.indexOf(',')), entry.slice(entry.indexOf(',') + 1)];
    if (version !== 'v1') continue;
    const got = Buffer.from(sig, 'base64');
    // timingSafeEqual: the time taken tells nothing about the expected value.
    if (expected.some((e) => got.length === e.length && timingSafeEqual(got, e) && got.toString('base64') === sig)) {
      return id;
    }
  }
  throw new InvalidSignature('no v1 signature matches');
}

// The effect: yours goes here. This one prints a line.
export async function applyEvent(event) {
  console.log(`effect ${event.id} ${event.type}`);
}

// A request listener for node:http. seen: the ids applied (a Set here;
// an inbox table in production); busy: ids being applied right now.
export function receiver({ keys, apply = applyEvent, seen = new Set(), log = console.log }) {
  const busy = new Set();
  return (req, res) => {
    const answer = (status, outcome, id) => {
      log(`${outcome} ${id || '-'} ${status}`);
      const body = JSON.stringify({ outcome });
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    };
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size <= MAX_BODY) chunks.push(c);
    });
    req.on('end', async () => {
      if (req.method !== 'POST') return answer(405, 'method-not-allowed');
      if (size > MAX_BODY) return answer(413, 'too-large');
      const body = Buffer.concat(chunks);
      let id;
      try {
        id = verify(keys, req.headers, body);
      } catch (e) {
        if (!(e instanceof InvalidSignature)) return answer(500, 'failed');
        return answer(401, 'refused:' + e.message.replaceAll(' ', '-'), req.headers['webhook-id']);
      }
      let event;
      try {
        event = JSON.parse(body.toString('utf8'));
      } catch {
        return answer(400, 'invalid-json', id);
      }
      if (event === null || typeof event !== 'object' || event.id !== id) return answer(400, 'id-mismatch', id);
      if (seen.has(id)) return answer(200, 'duplicate', id);
      // The same event on two connections at once: one applies it, the
      // other is asked to come back (503 is retried; a 4xx would be final).
      if (busy.has(id)) {
        res.setHeader('retry-after', '1');
        return answer(503, 'busy', id);
      }
      busy.add(id);
      try {
        await apply(event);
        seen.add(id);
      } catch (e) {
        console.error(`error applying ${id}: ${e}`);
        return answer(500, 'failed', id);
      } finally {
        busy.delete(id);
      }
      return answer(200, 'applied', id);
    });
  };
}

function main() {
  const args = process.argv.slice(2);
  const opt = (name, dflt) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : dflt;
  };
  const secrets = (process.env.WEBHOOK_SECRET || '').split(' ').filter(Boolean);
  if (!secrets.length) {
    console.error('webhook-receiver: set WEBHOOK_SECRET (whsec_... ; several, space-separated, while rotating)');
    process.exit(64);
  }
  const host = opt('--host', '127.0.0.1');
  const server = createServer(receiver({ keys: secrets.map(secretKey) }));
  server.listen(Number(opt('--port', '8000')), host, () => {
    console.log(`listening on http://${host}:${server.address().port}/`);
  });
}

// Run as a program (not imported): node webhook-receiver.mjs ...
if (process.argv[1] && import.meta.url === pathToFileURL(realpathSync(process.argv[1])).href) main();
