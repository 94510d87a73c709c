#!/usr/bin/env node
// verify.cjs - check the deliveries a receiver logged (t/lib/receiver.py's
// JSON lines) with the official Standard Webhooks library, as a consumer
// would: one line per delivery, "ok" or "fail: <why>". Exit 0 when every
// one verified, 1 when one did not, 2 on bad usage.
//
// Usage: node verify.cjs SECRET LOGFILE
// Environment: IDEMFLOW_NODE_WHSIG, where scripts/deps installed
// t/dispatch/whverify's locked packages (default
// /usr/local/lib/idemflow-node-whsig).
'use strict';
const fs = require('fs');
const path = require('path');

const dir = process.env.IDEMFLOW_NODE_WHSIG || '/usr/local/lib/idemflow-node-whsig';
const { Webhook } = require(path.join(dir, 'node_modules', 'standardwebhooks'));

if (process.argv.length !== 4) {
	process.stderr.write('usage: verify.cjs SECRET LOGFILE\n');
	process.exit(2);
}
const wh = new Webhook(process.argv[2]);
let failed = 0;
for (const line of fs.readFileSync(process.argv[3], 'utf8').split('\n')) {
	if (line.trim() === '')
		continue;
	const d = JSON.parse(line);
	try {
		wh.verify(d.body, {
			'webhook-id': d.webhook_id,
			'webhook-timestamp': d.webhook_timestamp,
			'webhook-signature': d.webhook_signature,
		});
		process.stdout.write('ok\n');
	} catch (e) {
		failed++;
		process.stdout.write(`fail: ${e.message}\n`);
	}
}
process.exit(failed ? 1 : 0);
