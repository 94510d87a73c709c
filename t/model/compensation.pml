/*
 * compensation.pml - compensation (sagas): a workflow of three job steps,
 * each with a "compensate", that fails or is cancelled part way, and
 * undoes the steps it completed (sql/017_compensation.sql).
 *
 * Each step says which SQL function it stands for; t/model/README.md has
 * the whole map. Every command of the engine is one SQL function run as
 * one statement, which locks the workflow's row first
 * (idemflow_job_lock, idemflow_wf_transition, idemflow_wf_resume) and
 * holds it to its commit: one atomic step here. The activation
 * (idemflow_jobs_activate) takes its job and the workflow FOR UPDATE SKIP
 * LOCKED: one atomic step too, which never runs inside another's. The
 * reaper (idemflow_reap) hands back jobs whose lease ran out.
 *
 * Processes: two workers, each holding at most one job at a time, which
 * complete it, fail it (MAXFAIL failures in all, out of retries each) or
 * let its lease run out (MAXEXP in all); a reaper; one cancel, at any
 * moment; an operator who resumes an incident. Each compensating job is
 * the row at step -k: cj[k] here.
 *
 * Properties (each assertion's line names it, "property NAME"):
 *   once     the compensating job of a step is begun at most once, and
 *            completes (step.compensated) at most once
 *   only     only a completed step gets a compensating job
 *   order    the compensating job of step k is begun only once every
 *            completed step after k is undone
 *   ends     once the workflow has ended: if it began compensating it is
 *            compensated, every completed step undone exactly once and no
 *            other; if it did not, no compensating job exists
 *   final    a workflow that has ended never changes state again
 * and no invalid end state: the workflow always ends.
 *
 * Broken variants (-D NAME), each rejected by spin with a counterexample:
 *   STALE_CANCEL   the cancel decides from what it read before it held
 *                  the workflow's lock: a completion that committed in
 *                  between is not seen
 *   UNLOCKED_COMPLETE  a completion checks its lease, then writes, without
 *                  holding the workflow's lock in between (the cancel and
 *                  the compensation it begins run between the two)
 *   CANCEL_COMPENSATING  a cancel of a compensating workflow (or one in
 *                  incident during its compensation) accepted like any
 *                  other, instead of refused with state-conflict
 */

#define N 3		/* job steps, each with a compensate */
#ifndef MAXFAIL
#define MAXFAIL 2	/* job failures (out of retries) in a run of the model */
#endif
#ifndef MAXEXP
#define MAXEXP 1	/* leases that run out */
#endif
#define NW 2		/* workers */

/* jobs.state; NONE: no row */
#define NONE 0
#define ACTIVATABLE 1
#define ACTIVE 2
#define DONE 3		/* completed */
#define FAILED 4
#define CANCELLED 5

/* workflows.state */
#define RUNNING 1
#define INCIDENT 2
#define COMPENSATING 3
#define W_COMPLETED 4
#define W_FAILED 5
#define W_CANCELLED 6
#define W_COMPENSATED 7
#define ENDED (wf >= W_COMPLETED)

byte wf = RUNNING;	/* workflows.state */
byte from;		/* compensation.started's "from": 0, W_FAILED or W_CANCELLED */
/* Jobs 0..N-1: the step jobs of steps 1..N; N..2N-1: the compensating
 * jobs of steps 1..N (rows at step -k). */
byte js[2 * N];		/* jobs.state */
byte holder[2 * N];	/* jobs.worker: 0 none, else worker + 1 */
bit expired[2 * N];	/* due_at <= now() while active */
byte begun[N];		/* compensating jobs begun, per step (ghost) */
byte undone[N];		/* step.compensated events, per step (ghost) */
bit completed[N];	/* the step's job completed once (ghost; a job row never
			 * leaves completed, which the broken variants break) */
byte fails, exps;

#define CJ(k) (N + (k))
/* Due for an activation: activatable, or active with its lease run out. */
#define DUE(i) (js[i] == ACTIVATABLE || (js[i] == ACTIVE && expired[i]))
#define ANY_DUE (DUE(0) || DUE(1) || DUE(2) || DUE(3) || DUE(4) || DUE(5))
#define LAPSED(i) (js[i] == ACTIVE && expired[i])

/* A workflow that has ended never changes. */
inline set_wf(s)
{
	assert(!ENDED);	/* property final */
	wf = s
}

/* idemflow_compensate_next: the latest completed step without a
 * compensating job gets one; none left: compensated. Called with the
 * workflow's row locked. */
inline compensate_next()
{
	ck = N;
	do
	:: ck > 0 && !(js[ck - 1] == DONE && js[CJ(ck - 1)] == NONE) -> ck--
	:: else -> break
	od;
	if
	:: ck > 0 ->
		assert(begun[ck - 1] == 0);	/* property once */
		assert(completed[ck - 1]);	/* property only */
		cm = ck;
		do
		:: cm < N -> assert(!completed[cm] || js[CJ(cm)] == DONE);	/* property order */
			cm++
		:: else -> break
		od;
		begun[ck - 1]++;
		js[CJ(ck - 1)] = ACTIVATABLE
	:: else -> set_wf(W_COMPENSATED)
	fi
}

/* idemflow_compensate_begin: with a completed step to undo, compensating
 * (compensation.started) and the first compensating job; else false. */
inline compensate_begin(f, began)
{
	began = false;
	for (ci : 0 .. N - 1) {
		if
		:: js[ci] == DONE -> began = true
		:: else -> skip
		fi
	}
	if
	:: began -> set_wf(COMPENSATING); from = f; compensate_next()
	:: else -> skip
	fi
}

/* idemflow_job_complete, its effect once idemflow_job_lock let it: the
 * step's next job (idemflow_enter_step) or the workflow's end; a
 * compensating job: step.compensated and the next. */
inline complete_effect(j)
{
	js[j] = DONE;
	if
	:: j < N -> completed[j] = 1
	:: else -> skip
	fi;
	if
	:: j < N - 1 -> js[j + 1] = ACTIVATABLE
	:: j == N - 1 -> set_wf(W_COMPLETED)
	:: j >= N ->
		assert(undone[j - N] == 0);	/* property once */
		undone[j - N]++;
		compensate_next()
	fi
}

proctype worker(byte me)
{
	byte j = 255, i, ck, cm, ci;
	bit began;
	do
	:: ENDED && j == 255 -> break
	:: j == 255 && ANY_DUE ->
		/* idemflow_jobs_activate: an activatable job, or an active one
		 * whose lease ran out, FOR UPDATE SKIP LOCKED. */
		atomic {
			if
			:: ANY_DUE ->
				i = 0;
				do
				:: DUE(i) ->
					js[i] = ACTIVE; holder[i] = me + 1; expired[i] = 0; j = i;
					break
				:: else -> i++
				od
			:: else -> skip	/* another worker took it */
			fi
		}
	:: j != 255 ->
		if
		:: true ->
#ifdef UNLOCKED_COMPLETE
			/* Broken: the lease checked, then the write, apart. */
			if
			:: js[j] == ACTIVE && holder[j] == me + 1 && !expired[j] ->
				atomic { complete_effect(j) }
			:: else -> skip
			fi;
#else
			/* idemflow_job_complete: the workflow's lock, then
			 * idemflow_job_lock's check, then the effect, as one. */
			atomic {
				if
				:: js[j] == ACTIVE && holder[j] == me + 1 && !expired[j] ->
					complete_effect(j)
				:: else -> skip	/* lease-expired, job-not-active */
				fi
			}
#endif
			j = 255
		:: fails < MAXFAIL ->
			/* idemflow_job_fail out of retries. */
			atomic {
				if
				:: js[j] == ACTIVE && holder[j] == me + 1 && !expired[j] ->
					fails++;
					js[j] = FAILED;
					if
					:: j >= N -> set_wf(INCIDENT)	/* a compensating job */
					:: else ->
						compensate_begin(W_FAILED, began);
						if
						:: !began -> set_wf(W_FAILED)
						:: else -> skip
						fi
					fi
				:: else -> skip
				fi
			}
			j = 255
		:: exps < MAXEXP ->
			/* The worker is slow: its lease runs out while it
			 * holds the job (its completion, next, is refused;
			 * the reaper or another activation hands the job on). */
			atomic {
				if
				:: js[j] == ACTIVE && holder[j] == me + 1 && !expired[j] ->
					exps++; expired[j] = 1
				:: else -> skip
				fi
			}
		fi
	od
}

/* idemflow_reap: active jobs whose lease ran out are activatable. */
proctype reaper()
{
	byte i;
	do
	:: ENDED -> break
	:: atomic {
		LAPSED(0) || LAPSED(1) || LAPSED(2) || LAPSED(3) || LAPSED(4) || LAPSED(5) ->
		for (i : 0 .. 2 * N - 1) {
			if
			:: js[i] == ACTIVE && expired[i] ->
				js[i] = ACTIVATABLE; holder[i] = 0; expired[i] = 0
			:: else -> skip
			fi
		}
	   }
	od
}

/* idemflow_wf_transition to cancelled, at any moment. A compensating
 * workflow, or one in incident during its compensation, is refused
 * (state-conflict), but in the broken variant. */
#ifdef CANCEL_COMPENSATING
#define CANCEL_ALSO (wf == COMPENSATING || wf == INCIDENT)
#else
#define CANCEL_ALSO false
#endif
proctype cancel()
{
	byte i, ck, cm, ci;
	bit began;
#ifdef STALE_CANCEL
	/* Broken: what the cancel decides on is read before the lock. */
	byte seen[N];
	byte seenwf;
	atomic {
		seenwf = wf;
		for (i : 0 .. N - 1) { seen[i] = js[i] }
	}
#endif
	atomic {
#ifdef STALE_CANCEL
		if
		:: seenwf == RUNNING || (seenwf == INCIDENT && js[CJ(0)] == NONE &&
		                         js[CJ(1)] == NONE && js[CJ(2)] == NONE) ->
			for (i : 0 .. N - 1) {
				if
				:: seen[i] == ACTIVATABLE || seen[i] == ACTIVE -> js[i] = CANCELLED
				:: else -> skip
				fi
			}
			began = (seen[0] == DONE || seen[1] == DONE || seen[2] == DONE);
			if
			:: began -> set_wf(COMPENSATING); from = W_CANCELLED; compensate_next()
			:: else -> set_wf(W_CANCELLED)
			fi
		:: else -> skip
		fi
#else
		if
		:: wf == RUNNING || (wf == INCIDENT && js[CJ(0)] == NONE && js[CJ(1)] == NONE &&
		                     js[CJ(2)] == NONE) || CANCEL_ALSO ->
			for (i : 0 .. N - 1) {
				if
				:: js[i] == ACTIVATABLE || js[i] == ACTIVE -> js[i] = CANCELLED
				:: else -> skip
				fi
			}
			compensate_begin(W_CANCELLED, began);
			if
			:: !began -> set_wf(W_CANCELLED)
			:: else -> skip
			fi
		:: else -> skip	/* ended: invalid-transition; compensating: state-conflict */
		fi
#endif
	}
}

/* idemflow_wf_resume of a compensation in incident: the failed
 * compensating job activatable again, compensating. */
proctype operator()
{
	byte i;
	do
	:: ENDED -> break
	:: atomic {
		wf == INCIDENT && (js[CJ(0)] == FAILED || js[CJ(1)] == FAILED ||
		                   js[CJ(2)] == FAILED) ->
		for (i : N .. 2 * N - 1) {
			if
			:: js[i] == FAILED -> js[i] = ACTIVATABLE; holder[i] = 0
			:: else -> skip
			fi
		}
		set_wf(COMPENSATING)
	   }
	od
}

/* Once the workflow has ended, what it undid. */
proctype checker()
{
	byte k;
	ENDED;
	atomic {
		for (k : 0 .. N - 1) {
			if
			:: from != 0 ->
				assert(wf == W_COMPENSATED);	/* property ends */
				assert(!completed[k] || (js[CJ(k)] == DONE && undone[k] == 1));	/* property ends */
				assert(completed[k] || js[CJ(k)] == NONE);	/* property ends */
			:: else ->
				assert(js[CJ(k)] == NONE)	/* property ends */
			fi
		}
	}
}

init
{
	atomic {
		js[0] = ACTIVATABLE;	/* idemflow_wf_create: step 1 begun */
		run worker(0);
		run worker(1);
		run reaper();
		run cancel();
		run operator();
		run checker()
	}
}
