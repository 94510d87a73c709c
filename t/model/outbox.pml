/*
 * outbox.pml - the outbox protocol: dispatchers with leases, recording,
 * requeue and per-workflow order (app/dispatch/dispatch.c, app/cli/outbox.c).
 *
 * Each step says which code or SQL it stands for; t/model/README.md has
 * the whole map, the bounds and what spin prints for each broken variant.
 *
 * Each SQL statement is one atomic step. The claim takes its rows FOR
 * UPDATE SKIP LOCKED and PostgreSQL re-checks a locked row's WHERE clause
 * on its newest version (READ COMMITTED), so two claims can neither take
 * one row nor both miss a lease; an UPDATE's WHERE is evaluated on the row
 * it changes. The claim's NOT EXISTS reads its statement's snapshot, which
 * can only miss a publication that committed meanwhile: it holds an event
 * back longer, never shorter.
 *
 * Time is a clock process that ticks. A time is kept as the ticks left
 * until it passes: a lease (lease_until - now()), and the dispatcher's own
 * reckoning of it (struct batch's lease_end - now_s()). The dispatcher
 * counts its lease from the moment it sent the claim, before the database
 * granted it, so its count never ends after the database's; the model
 * starts both together, the case least favourable to the dispatcher. A
 * sink call returns within its timeout (curl's timeout, the AMQP confirm
 * wait, the exec sink's kill); that is the one timing assumption of the
 * safety checks.
 *
 * The dispatcher's order is drain()'s: record batch k-1 and claim batch
 * k+1 (one pipeline, two transactions), deliver batch k, and only then
 * learn whether the claim failed; a failed claim, or a sink whose
 * deliver() returns -1, ends the run, but first (drain_settle()) the run
 * records batch k and releases the batch claimed ahead. Options:
 *   SKIP_RECORDING       leave the "recording" assertion out, to check
 *                        another property alone
 *   MAXSFAIL=n           sink calls that fail (0 unless given)
 *
 * Broken variants (-D NAME), each rejected by spin with a counterexample:
 *   NO_OWNER_GUARD       d_done, d_fail, d_release without "lease_owner = $2"
 *   OWNER_PER_PROCESS    one lease_owner for all claims of a process
 *   NO_NOT_EXISTS        d_claim without its NOT EXISTS over earlier events
 *   NO_LEASE_GUARD       batch_deliver without its lease_end check
 *   EXIT_UNRECORDED      drain() before the fix: a failed claim or an
 *                        unusable sink ends the run at once, batch k
 *                        unrecorded, the batch claimed ahead not released
 *   SAME_TX              recording and the next claim in one transaction
 *                        (recording batch k before the end does not save
 *                        a recording of k-1 the claim rolled back)
 *   REQUEUE_CLEARS_LEASE outbox requeue that clears a live lease
 * Each assertion's line names its property ("property NAME"), which is
 * how t/model/run-spin.sh tells which one a counterexample broke.
 * -DLIVENESS builds the liveness check instead (ltl live; pan -a -f),
 * SLOW_DISPATCHER drops its timing assumption, and its broken variant:
 *   LEASE_NEVER_ENDS     d_claim without "OR o.lease_until < now()"
 *
 * -DFANOUT builds the other half instead, the tenant endpoints and the
 * deliveries the trigger writes with each event (sql/020_endpoints.sql),
 * described where it begins, at the end of this file.
 */

#ifndef FANOUT

#define ND 2		/* dispatchers */
#ifndef NE
#define NE 3		/* events: 2 or 3 */
#endif
#ifndef BATCH
#define BATCH 1		/* --batch */
#endif
#define LEASE 3		/* --lease, in ticks */
#define TIMEOUT 1	/* --timeout */
#define MARGIN 1	/* DISPATCH_LEASE_MARGIN_S */
#define MAXATT 2	/* --max-attempts */
#ifndef MAXDEATHS
#define MAXDEATHS 1	/* dispatcher deaths in a run of the model */
#endif
#ifndef MAXCFAIL
#define MAXCFAIL 1	/* claims that fail (statement_timeout, a lost connection) */
#endif
#ifndef MAXREQUEUE
#define MAXREQUEUE 1	/* idemflow outbox requeue */
#endif
#ifndef MAXSFAIL
#define MAXSFAIL 0	/* sink calls that fail (deliver() returns -1) */
#endif
#define NONE 255

/* The events: 0 = (workflow 0, seq 1), 1 = (workflow 0, seq 2),
 * 2 = (workflow 1, seq 1); with -DNE=2, events 0 and 1; with -DNE=2
 * -DTWO_WORKFLOWS, event 1 is (workflow 1, seq 1). E2(x) is x when
 * there is an event 2, else false; E2T(x) is x, else true. */
#ifdef TWO_WORKFLOWS
#define WF(e) (e)
#define SEQ(e) 1
#else
#define WF(e) ((e) == 2 -> 1 : 0)
#define SEQ(e) ((e) == 1 -> 2 : 1)
#endif
#if NE == 3
#define E2(x) (x)
#define E2T(x) (x)
#else
#define E2(x) false
#define E2T(x) true
#endif
#define EARLIER(p, e) (WF(p) == WF(e) && SEQ(p) < SEQ(e))
#define LOWEST(b) (((b) & 1) -> 0 : (((b) & 2) -> 1 : 2))

/* The outbox rows (sql/001_init.sql, sql/002_dispatch.sql). A failed
 * delivery's backoff is not modelled: next_attempt_at <= now() always. */
bit published[NE];	/* published_at IS NOT NULL */
bit dead[NE];		/* dead_at IS NOT NULL */
#ifdef LIVENESS
byte attempts[NE];	/* attempts, counted up to MAXATT */
#endif
byte owner[NE];		/* lease_owner: 0 = NULL, else a claim's token */
byte lleft[NE];		/* lease_until - now(); 0: NULL or passed */

/* The dispatchers' batches (struct batch in app/dispatch/dispatch.c) as sets of
 * events: cur is being delivered, nxt was claimed ahead, prv was
 * delivered and waits to be recorded. */
byte cur[ND], nxt[ND], prv[ND];
byte curleft[ND], nxtleft[ND];		/* lease_end - now_s() of cur and nxt */
byte curtok[ND], nxttok[ND], prvtok[ND];	/* the lease_owner each was claimed as */
bit cc[ND];				/* the process's claims, modulo 2 */
byte sinkev[ND] = NONE;			/* the event in the sink's hands, or NONE */
bit dl[ND];				/* the sink has had it for TIMEOUT */
byte deaths, cfails, sfails, requeues;

/* d_claim: "AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.workflow_id =
 * o.workflow_id AND p.seq < o.seq AND p.published_at IS NULL)". */
#ifdef NO_NOT_EXISTS
#define HELD_BACK(e) false
#else
#define HELD_BACK(e) ((EARLIER(0, e) && !published[0]) || \
                      (EARLIER(1, e) && !published[1]) || \
                      E2(EARLIER(2, e) && !published[2]))
#endif

/* d_claim's WHERE: "o.published_at IS NULL AND o.dead_at IS NULL AND
 * o.next_attempt_at <= now() AND (o.lease_until IS NULL OR o.lease_until <
 * now()) AND NOT EXISTS (...)". */
#ifdef LEASE_NEVER_ENDS
/* Without "OR o.lease_until < now()": only rows with no lease. */
#define ELIGIBLE(e) (!published[e] && !dead[e] && owner[e] == 0 && !HELD_BACK(e))
#else
#define ELIGIBLE(e) (!published[e] && !dead[e] && lleft[e] == 0 && !HELD_BACK(e))
#endif

/* attempts: counted when an attempt starts (d_claim), given back by
 * d_release, zeroed by requeue; batch_outcome makes a failure dead when
 * SINK_DEAD or attempt >= max_attempts. The safety checks neither count
 * nor let an event die: to them a dead event is one that fails for ever,
 * and none of their properties tells the two apart. The liveness check
 * counts. */
#ifdef LIVENESS
#define CLAIM_ATTEMPT(e) \
	if :: attempts[e] < MAXATT -> attempts[e]++ :: else -> skip fi
#define RELEASE_ATTEMPT(e) \
	if :: attempts[e] > 0 -> attempts[e]-- :: else -> skip fi
#define REQUEUE_ATTEMPTS(e) attempts[e] = 0
#define LAST_ATTEMPT(e) (attempts[e] >= MAXATT)
#else
#define CLAIM_ATTEMPT(e) skip
#define RELEASE_ATTEMPT(e) skip
#define REQUEUE_ATTEMPTS(e) skip
#define LAST_ATTEMPT(e) false
#endif

/* d_done, d_fail, d_release: "WHERE ... AND lease_owner = $2". */
#ifdef NO_OWNER_GUARD
#define OWNS(d, e) true
#else
#define OWNS(d, e) (owner[e] == prvtok[d])
#endif

/* $2 of d_claim, d_done, d_fail and d_release, the lease_owner: its own
 * for every claim ("host:pid:n", n counting the process's claims; two
 * values suffice here, as a batch is recorded before the claim after the
 * next one). OWNER_PER_PROCESS: one for every claim of a process
 * ("host:pid", dispatch_new's d->owner). */
#ifdef OWNER_PER_PROCESS
#define TOKEN(d) (1 + 2 * (d))
#else
#define TOKEN(d) (1 + 2 * (d) + cc[d])
#endif

/* batch_deliver: a chunk starts only if "now_s() + timeout + margin <=
 * b->lease_end". */
#ifdef NO_LEASE_GUARD
#define LEASE_OK(d) true
#else
#define LEASE_OK(d) (curleft[d] >= TIMEOUT + MARGIN)
#endif

/* Property "order": when a delivery of e starts, every earlier event of
 * its workflow is published and in no sink's hands. */
#define DONE_BEFORE(p, e) (!EARLIER(p, e) || (published[p] && sinkev[0] != p && sinkev[1] != p))
#define ORDER_OK(e) (DONE_BEFORE(0, e) && DONE_BEFORE(1, e) && E2T(DONE_BEFORE(2, e)))

/* Property "lease": an event in a sink's hands is leased to the batch
 * that dispatcher claimed it in, and the lease has not run out; so no
 * two dispatchers ever deliver one event at once. Only a tick, a claim, a
 * recording and a requeue change what it reads: each asserts it. */
#define HOLDS(d) (sinkev[d] == NONE || (owner[sinkev[d]] == curtok[d] && lleft[sinkev[d]] > 0))
#define LEASES_HELD (HOLDS(0) && HOLDS(1))

#define SINK_DUE(d) (sinkev[d] != NONE && dl[d])
#ifdef LIVENESS
/* Liveness assumes a running dispatcher's own steps take no time against
 * the lease: time passes during sink calls and while no running
 * dispatcher holds events, so only a dead dispatcher's leases run out.
 * Sound, because (t/model/README.md, "Liveness and its timing
 * assumption"): no lease protocol is live if a dispatcher's own work
 * between a claim and its first sink call may outlast lease - timeout -
 * margin, so some bound is needed, and this is that bound at its
 * strongest; and what it could hide, a batch whose delivery uses up the
 * lease of the batch claimed ahead, only releases that batch (no sink
 * time, the attempt given back): each batch that goes out counts an
 * attempt, attempts are finite with finitely many events, and a run's
 * first claim, alone, has the whole lease. The safety checks assume
 * none of this. */
#ifdef SLOW_DISPATCHER
/* Without the assumption: spin finds the dispatcher that is always
 * slower than its lease (live fails), which is why some bound is needed. */
#define CAN_TICK (!SINK_DUE(0) && !SINK_DUE(1))
#else
#define BUSY(d) ((cur[d] | nxt[d] | prv[d]) != 0 && sinkev[d] == NONE)
#define CAN_TICK (!SINK_DUE(0) && !SINK_DUE(1) && !BUSY(0) && !BUSY(1))
#endif
#else
#define CAN_TICK (!SINK_DUE(0) && !SINK_DUE(1))
#endif

active proctype clock()
{
	byte i;
end:
	do
	:: d_step {
		CAN_TICK ->
		for (i : 0 .. NE - 1) {
			if
			:: lleft[i] > 0 -> lleft[i]--
			:: else -> skip
			fi
		};
		for (i : 0 .. ND - 1) {
			if
			:: curleft[i] > 0 -> curleft[i]--
			:: else -> skip
			fi;
			if
			:: nxtleft[i] > 0 -> nxtleft[i]--
			:: else -> skip
			fi;
			/* A sink call returns within its timeout: the clock
			 * waits for a call that has had TIMEOUT. */
			if
			:: sinkev[i] != NONE -> dl[i] = 1
			:: else -> skip
			fi
		};
		i = 0;
		assert(LEASES_HELD)	/* property lease */
	   }
	od
}

/* app/dispatch/dispatch.c, D_CLAIM (d_claim): "WITH due AS (SELECT o.id FROM
 * outbox o WHERE ... ORDER BY o.next_attempt_at, o.id LIMIT $1 FOR UPDATE
 * SKIP LOCKED) UPDATE outbox o SET lease_owner = $2, lease_until = now() +
 * $3::interval, attempts = o.attempts + 1 FROM due WHERE o.id = due.id
 * RETURNING o.id, ..., o.attempts, o.payload". next_attempt_at is not
 * modelled, so any 1 to BATCH eligible rows may come back (at least one
 * if any is eligible). batch_init: b->lease_end = claimed_at + lease; the
 * rows come back whole before any delivery. */
inline claim_body(b, bleft, btok)
{
	b = 0;
	n = 0;
	for (i : 0 .. NE - 1) {
		if
		:: ELIGIBLE(i) && n < BATCH ->
			if
			:: b = b | (1 << i); n++
			:: skip
			fi
		:: else -> skip
		fi
	};
	for (i : 0 .. NE - 1) {
		if
		:: b == 0 && ELIGIBLE(i) -> b = 1 << i
		:: else -> skip
		fi
	};
	if
	:: b != 0 ->
		btok = TOKEN(d);
		cc[d] = 1 - cc[d];
		bleft = LEASE
	:: else -> skip
	fi;
	for (i : 0 .. NE - 1) {
		if
		:: b & (1 << i) ->
			owner[i] = btok;
			lleft[i] = LEASE;
			CLAIM_ATTEMPT(i)
		:: else -> skip
		fi
	};
	i = 0;
	n = 0;
	assert(LEASES_HELD)	/* property lease */
}

/* The recording of prv, in a transaction of its own: D_DONE (d_done)
 * "UPDATE outbox SET published_at = now(), lease_owner = NULL,
 * lease_until = NULL WHERE id = ANY($1::bigint[]) AND lease_owner = $2";
 * D_FAIL (d_fail) "UPDATE outbox o SET last_error = f.err,
 * next_attempt_at = ..., dead_at = CASE WHEN f.dead THEN now() END,
 * lease_owner = NULL, lease_until = NULL FROM unnest(...) WHERE o.id =
 * f.id AND o.lease_owner = $2"; D_RELEASE (d_release) "UPDATE outbox SET
 * lease_owner = NULL, lease_until = NULL, attempts = attempts - 1 WHERE id
 * = ANY($1::bigint[]) AND lease_owner = $2". A row whose lease passed to
 * another claim is left alone: that claim's dispatcher records it. */
inline record_body()
{
	for (i : 0 .. NE - 1) {
		if
		:: (prv[d] & (1 << i)) && OWNS(d, i) ->
			if
			:: p_ok & (1 << i) -> published[i] = 1
			:: p_fail & (1 << i) -> dead[i] = (p_dead >> i) & 1
			:: else -> RELEASE_ATTEMPT(i)	/* released */
			fi;
			owner[i] = 0;
			lleft[i] = 0
		:: else -> skip
		fi
	};
	prv[d] = 0;
	prvtok[d] = 0;
	p_ok = 0;
	p_fail = 0;
	p_dead = 0;
	i = 0;
	assert(LEASES_HELD)	/* property lease */
}

/* A dispatcher killed (SIGKILL, a crash, a failed recording, a step_send
 * that cannot reach the server) between two of its steps: everything it
 * held stays leased until the leases run out; cron or systemd starts it
 * again. */
#define MAY_DIE if :: deaths < MAXDEATHS -> deaths++; goto died :: true -> skip fi

/* Property "recording": a run that ends on a failed claim or an unusable
 * sink has recorded every event whose outcome it knew (unless the lease
 * had passed to another claim, whose dispatcher records it). drain()
 * broke it before the fix (-DEXIT_UNRECORDED; t/model/README.md, "What
 * the model found"); -DSKIP_RECORDING leaves the assertion out. */
#ifdef SKIP_RECORDING
#define RECORDED true
#else
#define RECORDED ((p_ok | p_fail | lostrec) == 0)
#endif

proctype dispatcher(byte d)
{
	byte i, n;
	byte p_ok, p_fail, p_dead;	/* cur's, then prv's outcomes (batch_outcome) */
	byte todo;			/* cur's events not handed to the sink yet */
	bit cfailed, sfailed;		/* the claim failed; the sink failed */
#ifdef SAME_TX
	byte lostrec;			/* ghost: outcomes a failed claim rolled back */
#else
#define lostrec 0
#endif

	/* app/dispatch/dispatch.c, drain(): one run, as cron starts it (--once) or
	 * dispatch_run's loop goes round (--loop). */
newrun:
	/* step_sync(d, NULL, 1, &cur): the first claim, alone. A failed
	 * statement ends the run (drain returns -1). */
	if
	:: atomic { cfails < MAXCFAIL -> cfails++ }; goto run_failed
	:: atomic { claim_body(cur[d], curleft[d], curtok[d]) }
	fi;
	do
	:: cur[d] == 0 -> break		/* "while (cur.n > 0)" */
	:: else ->
		MAY_DIE;
		/* step_send(d, &prev, more, &s), step_read_async: the
		 * recording of batch k-1 and the claim of batch k+1 go out in
		 * one pipeline, two transactions (a sync after each), and the
		 * server runs them while the sink delivers batch k. Whatever
		 * they return is seen only by step_recv, after the delivery.
		 *
		 * The model runs both statements at the send, before the
		 * delivery: the dispatcher counts the lease of k+1 from the
		 * send (claimed_at) in any case; a database lease that starts
		 * later only ends later; and the claim takes rows with no
		 * live lease while the sink holds leased rows of batch k, so
		 * the two touch nothing in common. Letting the server's two
		 * steps fall anywhere in the delivery multiplies the states
		 * by four or more (t/model/README.md). ("more" is 0 once the
		 * run is stopping or out of time: no claim, the loop ends
		 * after k; the model leaves it out, as a claim that took
		 * nothing.) */
#ifdef SAME_TX
		/* As before the fix: the recording and the claim in one
		 * implicit transaction; a failed claim rolls the recording
		 * back with it. */
		if
		:: atomic {
			cfails < MAXCFAIL -> cfails++; cfailed = 1;
			lostrec = p_ok | p_fail; p_ok = 0; p_fail = 0; p_dead = 0;
			prv[d] = 0; prvtok[d] = 0
		   }
		:: atomic { record_body(); claim_body(nxt[d], nxtleft[d], nxttok[d]) }
		fi;
#else
		/* The recording, committed on its own (its sync) ... */
		atomic { record_body() };
		/* ... then the claim, its rows read whole by the reader
		 * thread (step_read), or the statement fails
		 * (statement_timeout, a lock, the connection). */
		if
		:: atomic { cfails < MAXCFAIL -> cfails++; cfailed = 1 }
		:: atomic { claim_body(nxt[d], nxtleft[d], nxttok[d]) }
		fi;
#endif
		MAY_DIE;
		/* batch_deliver(d, &cur): one event a chunk (the exec sink;
		 * an http chunk never holds two events of one workflow). */
		todo = cur[d];
		do
		:: atomic {
			/* The check "now_s() + timeout + margin > b->lease_end"
			 * and d->sink->deliver(...) starting are one step: the
			 * moment between them is what the margin is for. */
			todo != 0 && LEASE_OK(d) ->
			i = LOWEST(todo);
			todo = todo & ~(1 << i);
			assert(ORDER_OK(i));	/* property order */
			sinkev[d] = i;
			dl[d] = 0
		   };
		   MAY_DIE;
		   /* ... the sink returns; batch_outcome decides dead. */
		   atomic {
			if
			:: p_ok = p_ok | (1 << i)		/* SINK_OK */
			:: p_fail = p_fail | (1 << i);	/* SINK_RETRY */
			   if
			   :: LAST_ATTEMPT(i) -> p_dead = p_dead | (1 << i)
			   :: else -> skip
			   fi
#ifdef LIVENESS
			:: p_fail = p_fail | (1 << i); p_dead = p_dead | (1 << i)	/* SINK_DEAD */
#endif
			/* deliver() returns -1: the sink itself is unusable
			 * (out of memory, a curl_multi error). This call's
			 * outcome is unknown; batch_deliver returns at once. */
			:: sfails < MAXSFAIL -> sfails++; sfailed = 1; todo = 0
			fi;
			sinkev[d] = NONE;
			dl[d] = 0;
			i = 0
		   }
		:: atomic {
			/* Past the lease's margin: the rest is not attempted
			 * and goes back by d_release (neither done nor failed). */
			todo != 0 && !LEASE_OK(d) -> todo = 0
		   }
		:: todo == 0 -> break
		od;
		/* step_recv: "if (step_recv(...) < 0 || delivered < 0)":
		 * drain_settle(), then the run ends. */
		if
		:: cfailed || sfailed -> goto run_failed
		:: else -> skip
		fi;
		/* prev = cur; cur = next. */
		atomic {
			prv[d] = cur[d];
			prvtok[d] = curtok[d];
			cur[d] = nxt[d];
			curleft[d] = nxtleft[d];
			curtok[d] = nxttok[d];
			nxt[d] = 0;
			nxtleft[d] = 0;
			nxttok[d] = 0
		}
	od;
	/* "The last delivered batch is recorded on its own." */
	atomic { record_body() };
	goto newrun;

run_failed:
#ifndef EXIT_UNRECORDED
	/* drain_settle(): before returning -1, record batch k
	 * (step_sync(d, cur, 0, ...)): what it attempted with its known
	 * outcomes, the rest released; and release the batch claimed
	 * ahead. A recording that fails is a death (MAY_DIE). Without it
	 * (-DEXIT_UNRECORDED, the code before the fix) the run ends with
	 * batch k unrecorded. */
	MAY_DIE;
	atomic {
		prv[d] = cur[d];
		prvtok[d] = curtok[d];
		record_body();
		prv[d] = nxt[d];
		prvtok[d] = nxttok[d];
		record_body()
	};
#endif
	atomic {
		assert(RECORDED);	/* property recording */
		cur[d] = 0;
		nxt[d] = 0;
		prv[d] = 0;
		curleft[d] = 0;
		nxtleft[d] = 0;
		curtok[d] = 0;
		nxttok[d] = 0;
		prvtok[d] = 0;
		p_ok = 0;
		p_fail = 0;
		p_dead = 0;
		todo = 0;
		cfailed = 0;
		sfailed = 0;
#ifdef SAME_TX
		lostrec = 0
#endif
	};
	goto newrun;

died:
	atomic {
		sinkev[d] = NONE;
		dl[d] = 0;
		cur[d] = 0;
		nxt[d] = 0;
		prv[d] = 0;
		curleft[d] = 0;
		nxtleft[d] = 0;
		curtok[d] = 0;
		nxttok[d] = 0;
		prvtok[d] = 0;
		p_ok = 0;
		p_fail = 0;
		p_dead = 0;
		todo = 0;
		cfailed = 0;
		sfailed = 0;
#ifdef SAME_TX
		lostrec = 0;
#endif
		n = 0;
		i = 0
	};
	goto newrun
}

/* app/cli/outbox.c, outbox_requeue, "requeue ID": "UPDATE outbox SET dead_at =
 * NULL, attempts = 0, next_attempt_at = now(), lease_owner = NULL,
 * lease_until = NULL WHERE <id> AND published_at IS NULL", refusing an
 * event under a live lease ("AND (lease_until IS NULL OR lease_until <
 * now())"). REQUEUE_CLEARS_LEASE: the statement without that condition,
 * as it stands today. */
#ifdef REQUEUE_CLEARS_LEASE
#define REQUEUE_OK(e) (!published[e])
#else
#define REQUEUE_OK(e) (!published[e] && lleft[e] == 0)
#endif

active proctype requeue()
{
	byte e;
end:
	do
	:: atomic {
		requeues < MAXREQUEUE ->
		requeues++;
		select (e : 0 .. NE - 1);
		if
		:: REQUEUE_OK(e) ->
			dead[e] = 0;
			REQUEUE_ATTEMPTS(e);
			owner[e] = 0;
			lleft[e] = 0
		:: else -> skip
		fi;
		e = 0;
		assert(LEASES_HELD)	/* property lease */
	   }
	od
}

init
{
	atomic {
		run dispatcher(0);
		run dispatcher(1)
	}
}

#ifdef LIVENESS
/* Every event ends published, or dead, or held back by a dead earlier
 * event of its workflow (README: a dead event holds its workflow's later
 * events until it is requeued), and stays so. Written out for the
 * layouts (ltl reads "->" as implication). */
#if defined(TWO_WORKFLOWS)
#define SETTLED_ALL ((published[0] || dead[0]) && (published[1] || dead[1]))
#else
#define SETTLED_ALL ((published[0] || dead[0]) && \
                     (published[1] || dead[1] || dead[0]) && \
                     E2T(published[2] || dead[2]))
#endif
ltl live { <> [] SETTLED_ALL }
#endif

#else /* FANOUT */

/*
 * The fan-out (sql/020_endpoints.sql): tenant endpoints, and a delivery
 * row per matching endpoint written by the trigger outbox_deliveries in
 * the transaction that writes the event. Two workflows of two events
 * each, two endpoints, two delivery dispatchers, a client that creates
 * the second endpoint at any moment.
 *
 * Events: x = 2 * workflow + (seq - 1). Workflow 0's events are of type
 * "order.*", workflow 1's "invoice.*". Endpoint 0 has filter_types NULL
 * (every type) and exists from the start; endpoint 1 has filter_types
 * {"order.*"} and is created (POST /v1/endpoints, its INSERT committed)
 * at any moment, before, between or after the events. Both have
 * ordering 'workflow'. A delivery is (endpoint, event): k = NX * e + x.
 *
 * The dispatcher's claim takes one delivery (a batch of one) "FOR UPDATE
 * SKIP LOCKED" under a lease; the timing assumption of the safety checks
 * above (a sink call returns within its timeout, a chunk starts only
 * with its margin of lease left), checked there for the pipeline of
 * batches, lets the model leave the clock out: a live dispatcher's lease
 * does not run out; a dead one's does, at some moment (LAPSED). Any
 * sink call may fail (MAXFAIL in all), into a retry or dead (out of
 * attempts); one dispatcher may die (MAXDEATHS) between any two steps,
 * after its receiver got the event too; one create's transaction may
 * roll back after its INSERT (MAXROLLBACK), and is then written again
 * (the client's retry under its key).
 *
 * Properties (each assertion's line names it):
 *   matching     a delivery, and a sink call, only to an endpoint whose
 *                filter matches the event's type
 *   subscribed   the endpoints an event goes to are those whose creation
 *                had committed when the event was written (the trigger
 *                fired), and no other: an endpoint created after the
 *                event committed never gets it (one committed between
 *                the write and the event's commit may or may not); only
 *                committed events are sent
 *   order        per endpoint and workflow: when a sink call of (e, x)
 *                starts, every earlier event of x's workflow that has a
 *                delivery to e is delivered and in no sink's hands
 *   isolation    once nothing can move: no delivery is held back only
 *                by another endpoint's dead delivery
 *   every        once nothing can move: every delivery's receiver got it
 *                at least once, unless it is dead or held back by a dead
 *                earlier delivery of its own endpoint and workflow
 *
 * Broken variants (-D NAME), each rejected by spin with a counterexample:
 *   MATERIALISE_AFTER_COMMIT  no trigger: the dispatcher writes an
 *                committed event's deliveries itself, reading the
 *                endpoint list when it gets to it
 *   NO_ENDPOINT_ORDER  the delivery claim without its NOT EXISTS over
 *                earlier pending or dead deliveries
 *   ORDER_ACROSS_ENDPOINTS  that NOT EXISTS without "p.endpoint_id =
 *                d.endpoint_id": a workflow's earlier delivery to any
 *                endpoint holds it back (how a dead event holds back
 *                every consumer of the operator's sink)
 *   NO_FILTER    the trigger without idemflow_type_matches
 */

#define ND 2		/* delivery dispatchers */
#define NEP 2		/* endpoints */
#define NX 4		/* events */
#define NK 8		/* deliveries: NEP * NX */
#ifndef MAXFAIL
#define MAXFAIL 2	/* failed sink calls in a run of the model */
#endif
#ifndef MAXDEATHS
#define MAXDEATHS 1	/* dispatcher deaths */
#endif
#ifndef MAXROLLBACK
#define MAXROLLBACK 1	/* create transactions rolled back after the INSERT */
#endif
#define NONE 255

#define WFX(x) ((x) >> 1)
#define SEQX(x) (((x) & 1) + 1)
#define EPK(k) ((k) / NX)
#define EVK(k) ((k) % NX)
#define KEY(e, x) ((e) * NX + (x))
/* idemflow_type_matches(e.filter_types, NEW.type) */
#define MATCHES(e, x) ((e) == 0 || WFX(x) == 0)
#ifdef NO_FILTER
#define TRIGGER_MATCHES(e, x) true
#else
#define TRIGGER_MATCHES(e, x) MATCHES(e, x)
#endif

/* deliveries.state */
#define PENDING 0
#define DELIVERED 1
#define DEAD 2
/* deliveries.lease_owner: 0 = NULL, d + 1 a live dispatcher's lease,
 * LAPSED a dead dispatcher's, run out */
#define LAPSED 3

bit ep[NEP];		/* the endpoint's row is committed */
bit written[NX];	/* the outbox row is inserted (committed or not) */
bit committed[NX];	/* ... and committed */
byte subins[NX];	/* ghost: the endpoints committed when the trigger fired */
byte subcom[NX];	/* ghost: the endpoints committed when the event committed */
#ifdef MATERIALISE_AFTER_COMMIT
bit mat[NX];		/* the dispatcher has written the event's deliveries */
#endif
bit dexists[NK];	/* the delivery row exists */
byte dstate[NK];
byte downer[NK];
bit got[NK];		/* ghost: its receiver answered 2xx at least once */
byte sinkk[ND] = NONE;	/* the delivery in a dispatcher's sink call */
byte fails, deaths, rollbacks;

#define EPSET ((ep[0] -> 1 : 0) | (ep[1] -> 2 : 0))

/* An earlier delivery of the same endpoint and workflow, not delivered:
 * "NOT EXISTS (SELECT 1 FROM deliveries p WHERE p.tenant_id =
 * d.tenant_id AND p.endpoint_id = d.endpoint_id AND p.workflow_id =
 * d.workflow_id AND p.seq < d.seq AND p.state IN ('pending', 'dead'))". */
#define BEFORE(j, k) (EPK(j) == EPK(k) && WFX(EVK(j)) == WFX(EVK(k)) && SEQX(EVK(j)) < SEQX(EVK(k)))
#define UNDONE(j) (dexists[j] && dstate[j] != DELIVERED)
#define ACROSS(j, k) (WFX(EVK(j)) == WFX(EVK(k)) && SEQX(EVK(j)) < SEQX(EVK(k)))
#ifdef NO_ENDPOINT_ORDER
#define HELD(k) false
#elif defined(ORDER_ACROSS_ENDPOINTS)
#define HELD(k) ((ACROSS(0, k) && UNDONE(0)) || (ACROSS(1, k) && UNDONE(1)) || \
                 (ACROSS(2, k) && UNDONE(2)) || (ACROSS(3, k) && UNDONE(3)) || \
                 (ACROSS(4, k) && UNDONE(4)) || (ACROSS(5, k) && UNDONE(5)) || \
                 (ACROSS(6, k) && UNDONE(6)) || (ACROSS(7, k) && UNDONE(7)))
#else
/* two events a workflow: only seq 2 has an earlier one */
#define HELD(k) (SEQX(EVK(k)) == 2 && UNDONE((k) - 1))
#endif

/* The delivery claim's WHERE: "d.state = 'pending' AND d.next_attempt_at
 * <= now() AND (d.lease_until IS NULL OR d.lease_until < now()) AND NOT
 * EXISTS (...)"; a row of an uncommitted transaction is not seen. */
#define ELIG(k) (dexists[k] && committed[EVK(k)] && dstate[k] == PENDING && \
                 (downer[k] == 0 || downer[k] == LAPSED) && !HELD(k))
#define ANY_ELIG (ELIG(0) || ELIG(1) || ELIG(2) || ELIG(3) || \
                  ELIG(4) || ELIG(5) || ELIG(6) || ELIG(7))
#ifdef MATERIALISE_AFTER_COMMIT
#define TO_MAT (committed[0] && !mat[0] || committed[1] && !mat[1] || \
                committed[2] && !mat[2] || committed[3] && !mat[3])
#else
#define TO_MAT false
#endif

/* Property order: every earlier delivery of k's endpoint and workflow
 * is delivered and in no sink's hands. */
#define SENT(j) (!dexists[j] || (dstate[j] == DELIVERED && sinkk[0] != (j) && sinkk[1] != (j)))
#define ORDER_OK(k) (SEQX(EVK(k)) == 1 || SENT((k) - 1))
/* Property subscribed, at a sink call: the event is committed and the
 * endpoint was committed when the event committed. */
#define SUB_OK(k) (committed[EVK(k)] && (subcom[EVK(k)] & (1 << EPK(k))))

/* Writes the deliveries of event x, as the trigger (or the broken
 * materialiser) does: every committed endpoint whose filter matches. */
inline write_deliveries(x)
{
	for (e : 0 .. NEP - 1) {
		if
		:: ep[e] && TRIGGER_MATCHES(e, x) ->
			assert(MATCHES(e, x));	/* property matching */
			dexists[KEY(e, x)] = 1;
			dstate[KEY(e, x)] = PENDING
		:: else -> skip
		fi
	};
	e = 0
}

/* A create (or any command writing an event) of workflow w: its INSERT
 * INTO outbox, the trigger outbox_deliveries firing in it, then its
 * commit. The workflow's row lock orders its events: seq 2 is written
 * after seq 1 committed. */
proctype producer(byte w)
{
	byte x, e;
	x = 2 * w;
	do
	:: x < 2 * w + 2 ->
		atomic {
			written[x] = 1;
			subins[x] = EPSET;
#ifndef MATERIALISE_AFTER_COMMIT
			write_deliveries(x)
#endif
		};
		if
		:: atomic {
			/* the transaction rolls back (a failed statement after
			 * the INSERT, the worker killed): the event and its
			 * deliveries go together; the client retries */
			rollbacks < MAXROLLBACK -> rollbacks++;
			written[x] = 0;
			subins[x] = 0;
			for (e : 0 .. NEP - 1) {
				dexists[KEY(e, x)] = 0
			};
			e = 0
		   }
		:: atomic { committed[x] = 1; subcom[x] = EPSET; x++ }
		fi
	:: else -> break
	od
}

/* POST /v1/endpoints for endpoint 1: its INSERT commits at any moment. */
active proctype creator()
{
	ep[1] = 1
}

proctype fdispatcher(byte d)
{
	byte k, res;
#ifdef MATERIALISE_AFTER_COMMIT
	byte e;
#endif
end:
	do
#ifdef MATERIALISE_AFTER_COMMIT
	:: atomic {
		/* the broken variant: the dispatcher writes a committed
		 * event's deliveries, with the endpoints it reads now */
		TO_MAT ->
		if
		:: committed[0] && !mat[0] -> k = 0
		:: committed[1] && !mat[1] -> k = 1
		:: committed[2] && !mat[2] -> k = 2
		:: committed[3] && !mat[3] -> k = 3
		fi;
		mat[k] = 1;
		write_deliveries(k);
		k = 0
	   }
#endif
	:: atomic {
		/* The delivery claim: one due delivery, leased; then the
		 * sink call starts, a POST of the payload to the endpoint.
		 * Nothing another process does between the two touches
		 * the leased row or the ones it holds back. */
		ANY_ELIG ->
		if
		:: ELIG(0) -> k = 0
		:: ELIG(1) -> k = 1
		:: ELIG(2) -> k = 2
		:: ELIG(3) -> k = 3
		:: ELIG(4) -> k = 4
		:: ELIG(5) -> k = 5
		:: ELIG(6) -> k = 6
		:: ELIG(7) -> k = 7
		fi;
		downer[k] = d + 1;
		assert(MATCHES(EPK(k), EVK(k)));	/* property matching */
		assert(SUB_OK(k));	/* property subscribed */
		assert(ORDER_OK(k));	/* property order */
		sinkk[d] = k
	   };
	   atomic {
		/* The sink call returns: 2xx, or a failure (a retry, or
		 * out of attempts: dead) ... */
		if
		:: got[k] = 1; res = DELIVERED
		:: fails < MAXFAIL -> fails++; res = PENDING
		:: fails < MAXFAIL -> fails++; res = DEAD
		fi;
		sinkk[d] = NONE;
		/* ... and the dispatcher records it under "lease_owner =
		 * $2", or is killed first (after its receiver may have got
		 * the event): its lease runs out (the clock left out) and
		 * another claim may take the delivery again. Killed before
		 * the sink call is the same as not having claimed. */
		if
		:: deaths < MAXDEATHS -> deaths++; downer[k] = LAPSED
		:: downer[k] == d + 1 -> dstate[k] = res; downer[k] = 0
		fi;
		k = 0;
		res = 0
	   }
	od
}

/* An earlier delivery of k's own endpoint and workflow is dead. */
#define OWN_DEAD(k) (SEQX(EVK(k)) == 2 && dexists[(k) - 1] && dstate[(k) - 1] == DEAD)
/* ... of another endpoint's, same workflow. */
#define OTHER_DEAD(k) (SEQX(EVK(k)) == 2 && dexists[(k) + NX - 1 - 2 * NX * EPK(k)] && \
                       dstate[(k) + NX - 1 - 2 * NX * EPK(k)] == DEAD)
#define BORN(x, e) (!(MATCHES(e, x) && (subins[x] & (1 << (e)))) || dexists[KEY(e, x)])
#define STUCK(k) (dexists[k] && !got[k] && dstate[k] != DEAD && !OWN_DEAD(k))

/* Once nothing can move (spin's timeout: every process blocked or
 * ended, the dispatchers with nothing to claim), the final state. */
active proctype settled()
{
	byte k, e;
	timeout ->
	atomic {
		for (k : 0 .. NK - 1) {
			assert(!(STUCK(k) && OTHER_DEAD(k)))	/* property isolation */
		};
		for (k : 0 .. NK - 1) {
			assert(!STUCK(k));	/* property every */
			assert(!dexists[k] || subcom[EVK(k)] & (1 << EPK(k)))	/* property subscribed */
		};
		for (k : 0 .. NX - 1) {
			for (e : 0 .. NEP - 1) {
				assert(committed[k] && BORN(k, e))	/* property every */
			}
		}
	}
}

init
{
	atomic {
		ep[0] = 1;
		run producer(0);
		run producer(1);
		run fdispatcher(0);
		run fdispatcher(1)
	}
}

#endif /* FANOUT */
