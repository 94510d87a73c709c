/*
 * keyclaim.pml - the Idempotency-Key protocol: concurrent same-key
 * requests, the in-flight wait and its timeout, workers dying before and
 * after the commit, expiry and takeover, prune, and the workers' replay
 * caches (app/server/: auth.c, rcache.c, wf.c, cmd.c, queries.c;
 * app/cli/prune.c).
 *
 * Each step says which code or SQL it stands for; t/model/README.md has
 * the map, the bounds and what spin prints for each broken variant.
 *
 * One key of one tenant. Each SQL statement is one atomic step. An
 * insert that meets another transaction's uncommitted row on the primary
 * key (tenant_id, key) waits for that transaction (ON CONFLICT DO NOTHING
 * included): this is "hold" below. The keyed-command runner's two ways
 * (cmd.c, enum cmd_tx): Q_CREATE_KEYED alone, and BEGIN; Q_KEY_CLAIM;
 * command; Q_KEY_STORE; COMMIT, are the same protocol here: a claim that inserts the row, the command's effect, and
 * one commit that makes both visible. Time is a clock that ticks; a key's
 * expires_at and a cache entry's deadline are kept as the ticks left.
 *
 * Properties:
 *   once   an effect commits only when no earlier effect's key is still
 *          inside its TTL: at most one effect per key lifetime;
 *   acked  every 201 a client received is a committed effect;
 *   cache  a replay cache hit answers the key's live row: the row the
 *          entry was made from is still there and has not expired;
 *   replay a replay answers the stored response of a committed effect
 *          (2xx to the same fingerprint, 409 reused to another);
 *   and no request hangs (no invalid end state).
 * Each assertion's line names its property ("property NAME"): the line
 * spin's trail replay reports is how t/model/run-spin.sh tells which
 * property a counterexample broke.
 *
 * Broken variants (-D NAME), each rejected by spin with a counterexample:
 *   NO_ON_CONFLICT       the claim as a read then an insert, without the
 *                        primary key's arbitration (no wait, no conflict)
 *   ACK_BEFORE_COMMIT    the 201 written before the COMMIT
 *   PRUNE_NO_CUTOFF      prune deleting keys without "expires_at <= $1"
 *   RCACHE_NO_EXPIRY_CAP rcache_put keeping an entry replay_cache_ttl
 *                        whatever the key has left
 *   RCACHE_FROM_ANSWER   rcache_put counting from the answer, not asked_at
 *   STORE_BEFORE_COMMIT  the response stored and committed on its own,
 *                        before the command's effect commits
 */

#define NC 2		/* clients, each one logical request under the key */
#define NW 2		/* workers, each with its replay cache */
#define TTL 2		/* idempotency_ttl, in ticks */
#define RCTTL 2		/* replay_cache_ttl, in ticks */
#define ROUNDS 3	/* run_keyed's rounds (cmd.c) */
#ifndef TRIES
#define TRIES 2		/* attempts of a client: the first and one retry */
#endif
#define MAXWDEATHS 1	/* worker deaths */
#define MAXGEN 4	/* effects at most: NC * TRIES */

/* The key's row (sql/001_init.sql, idempotency_keys). */
bit kex;		/* a committed row exists */
byte kgen;		/* which effect stored it (1, 2, ...) */
byte kfp;		/* its fingerprint */
byte kleft;		/* expires_at - now(); 0: expired */
byte hold;		/* 0, or client + 1 whose transaction holds an uncommitted row */
byte hleft;		/* that row's expires_at - now() */
byte ngen;		/* effects committed so far */
byte life;		/* ghost: the last effect's TTL left, kept after its row goes */
bit committed[MAXGEN + 1];	/* ghost */

/* The workers' replay caches (struct rcache), one entry for the key. */
byte rcgen[NW];		/* the row held: its generation */
byte rcfp[NW];
byte rcleft[NW];	/* deadline - rcache_now_ms(); 0: no entry */
byte askage[NC];	/* ticks since the client's asked_at (auth.c, auth_begin) */
bit asking[NC];

byte wdeaths;
byte ndone;
byte acked[NC];		/* ghost: the generation a 201 announced to the client */

/* The fingerprints: both clients send the same request, unless
 * -DREUSE, where client 1 reuses the key for another request. */
#ifdef REUSE
#define FP(c) ((c) + 1)
#else
#define FP(c) 1
#endif

active proctype clock()
{
	byte i;
end:
	do
	:: d_step {
		ndone < NC ->
		if
		:: kleft > 0 -> kleft--
		:: else -> skip
		fi;
		if
		:: hleft > 0 -> hleft--
		:: else -> skip
		fi;
		if
		:: life > 0 -> life--
		:: else -> skip
		fi;
		for (i : 0 .. NW - 1) {
			if
			:: rcleft[i] > 0 -> rcleft[i]--
			:: else -> skip
			fi
		};
		for (i : 0 .. NC - 1) {
			if
			:: asking[i] && askage[i] < RCTTL -> askage[i]++
			:: else -> skip
			fi
		};
		i = 0
	   }
	od
}

/* A replayed answer: the stored response of generation g, fingerprint fp. */
#define REPLAY(g, fp) \
	assert(committed[g]); \
	if \
	:: (fp) == FP(c) -> skip	/* 2xx replay, Idempotent-Replayed: true */ \
	:: else -> skip			/* 409 idempotency-key-reused */ \
	fi

proctype client(byte c)
{
	byte w, tries, round, g, f, left;
	bit owned;

	tries = 0;
attempt:
	tries++;
	/* nginx hands the attempt to some worker. */
	select (w : 0 .. NW - 1);

	/* auth.c, auth_begin(): rcache_get() before any statement. A hit
	 * (deadline not reached) answers the held row with no round trip. */
	if
	:: atomic {
		rcleft[w] > 0 ->
		assert(kex && kgen == rcgen[w] && kleft > 0);	/* property cache */
		REPLAY(rcgen[w], rcfp[w]);	/* property replay */
		goto done
	   }
	:: else -> skip
	fi;
	/* asked_at = rcache_now_ms(); then Q_AUTH_KEY ("... LEFT JOIN
	 * idempotency_keys k ... k.expires_at <= now(), ...,
	 * floor(extract(epoch FROM k.expires_at - now()) * 1000)"). */
	atomic { asking[c] = 1; askage[c] = 0 };
	atomic {
		if
		:: kex -> g = kgen; f = kfp; left = kleft
		:: else -> g = 0; f = 0; left = 0
		fi
	};
	/* rcache_put(..., ttl, asked_at): held until asked_at + min(ttl,
	 * milliseconds left), only a live row (status 0 is never visible to
	 * another transaction: the row commits with its response). */
	atomic {
		if
		:: g != 0 && left > 0 ->
			rcgen[w] = g;
			rcfp[w] = f;
#if defined(RCACHE_NO_EXPIRY_CAP)
			rcleft[w] = RCTTL
#elif defined(RCACHE_FROM_ANSWER)
			rcleft[w] = (left < RCTTL -> left : RCTTL)
#else
			/* An entry already past its deadline is none. */
			left = (left < RCTTL -> left : RCTTL);
			rcleft[w] = (left > askage[c] -> left - askage[c] : 0)
#endif
		:: else -> skip
		fi;
		asking[c] = 0;
		askage[c] = 0
	};
	/* cmd_run: a live key row fetched with the token is answered at
	 * once (answer_existing); an expired one is taken over below. */
	if
	:: g != 0 && left > 0 -> atomic { REPLAY(g, f); goto done }	/* property replay */
	:: else -> skip
	fi;

	round = 0;
claim:
	/* run_keyed, one round: the claim, "INSERT INTO
	 * idempotency_keys ... ON CONFLICT (tenant_id, key) DO NOTHING". */
	owned = 0;
	if
	:: atomic {
#ifdef NO_ON_CONFLICT
		/* A read, then an insert: nothing arbitrates. */
		!(kex && kleft > 0) ->
#else
		hold == 0 && !kex ->
#endif
		hold = c + 1;
		hleft = TTL;	/* expires_at = now() + coalesce(tenant ttl, $ttl) */
		owned = 1
	   }
	:: atomic {
#ifdef NO_ON_CONFLICT
		kex && kleft > 0 ->
#else
		hold == 0 && kex ->	/* conflict on a committed row: DO NOTHING */
#endif
		skip
	   }
#ifndef NO_ON_CONFLICT
	:: atomic { hold != 0 && hold != c + 1 -> goto in_flight }
#endif
	fi;
	if
	:: owned -> goto owner
	:: else -> goto taken
	fi;

in_flight:
	/* Waiting on the other transaction's row, up to lock_timeout
	 * (idempotency_wait), set per connection by db.c. */
	if
	:: atomic { hold == 0 -> goto claim }	/* it committed or rolled back: the insert goes on */
	:: skip ->
		/* 55P03: key_problem(P_KEY_IN_FLIGHT), 409 with
		 * Retry-After; nothing written. The client retries. */
		goto retry
	fi;

owner:
	/* The command's effect in the same transaction (Q_CREATE_KEYED's
	 * workflow and outbox rows; cmd_run's function), then the commit
	 * (one statement's implicit commit; store_and_commit's Q_KEY_STORE
	 * and COMMIT). */
#ifdef ACK_BEFORE_COMMIT
	atomic { acked[c] = ngen + 1 };
#endif
#ifdef STORE_BEFORE_COMMIT
	/* Q_KEY_STORE in a transaction of its own, committed before the
	 * command's: the row answers with its response at once, and the
	 * effect it announces commits later, or never. */
	atomic { kex = 1; kgen = ngen + 1; kfp = FP(c); kleft = hleft; hold = 0 };
#endif
	if
	:: atomic {
		wdeaths < MAXWDEATHS ->
		/* The worker dies before the commit: PostgreSQL rolls the
		 * transaction back; the client gets no answer. */
		wdeaths++;
		hold = 0;
		hleft = 0;
		rcleft[w] = 0
	   };
#ifdef ACK_BEFORE_COMMIT
	   goto done	/* the client has its 201 already */
#else
	   goto retry
#endif
	:: atomic {
		assert(life == 0);	/* property once */
		ngen++;
		committed[ngen] = 1;
		kex = 1;
		kgen = ngen;
		kfp = FP(c);
		kleft = hleft;
		life = hleft;
		hold = 0;
		hleft = 0
	   }
	fi;
	if
	:: atomic {
		wdeaths < MAXWDEATHS ->
		/* The worker dies after the commit: no answer; a retry
		 * replays. */
		wdeaths++;
		rcleft[w] = 0
	   };
	   goto retry
	:: atomic { acked[c] = kgen; goto done }	/* 201 */
	fi;

taken:
	/* Q_KEY_GET ("SELECT 'existing', fingerprint, status, headers,
	 * body, expires_at <= now() FROM idempotency_keys WHERE ..."): a
	 * new statement sees the row its claim waited for. */
	atomic {
		if
		:: kex && kleft > 0 -> REPLAY(kgen, kfp); goto done	/* property replay */
		:: else -> skip
		fi
	};
	/* Gone (pruned): claim again. Expired: Q_KEY_DELETE_EXPIRED ("DELETE
	 * FROM idempotency_keys WHERE ... AND expires_at <= now()"), then
	 * claim again. */
	atomic {
		if
		:: kex && kleft == 0 -> kex = 0
		:: else -> skip
		fi;
		round++
	};
	if
	:: round < ROUNDS -> goto claim
	:: else -> skip	/* "idempotency key row kept changing; giving up": 500 */
	fi;

retry:
	if
	:: tries < TRIES -> goto attempt
	:: else -> skip
	fi;
done:
	atomic { ndone++; w = 0; tries = 0; round = 0; g = 0; f = 0; left = 0; owned = 0 }
}

/* app/cli/prune.c, cli_prune: the cutoff "SELECT now()" first, then
 * PRUNE_KEYS: "DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(SELECT
 * ctid ... WHERE expires_at <= $1::timestamptz ... FOR UPDATE SKIP
 * LOCKED))". A row that is there at the delete and had expired at the
 * cutoff is the row that was there then (a newer row expires after now()
 * + TTL). */
active proctype prune()
{
	byte cutgen;
	atomic {
		if
		:: kex && kleft == 0 -> cutgen = kgen
		:: else -> cutgen = 0
		fi
	};
	atomic {
#ifdef PRUNE_NO_CUTOFF
		if
		:: kex -> kex = 0
		:: else -> skip
		fi;
#else
		if
		:: kex && kgen == cutgen -> kex = 0
		:: else -> skip
		fi;
#endif
		cutgen = 0
	}
}

init
{
	atomic {
		run client(0);
		run client(1)
	};
	/* acked: when every client is done, every 201 was a committed effect. */
	(ndone == NC);
	assert((acked[0] == 0 || committed[acked[0]]) && (acked[1] == 0 || committed[acked[1]]))	/* property acked */
}
