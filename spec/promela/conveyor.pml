/*
 * conveyor.pml -- the django-conveyor lease protocol for SPIN.
 *
 * This is the same protocol as spec/tla/Conveyor.tla, action for action.
 * Every atomic block below is one SQL statement (one transaction) of
 * django_conveyor/protocol.py and carries that statement's name.
 *
 *   3 jobs, 2 workers, max_attempts = 2.  Worker 0 runs two handler slots
 *   (concurrency 2: it can hold a stale belief about a job in one slot while
 *   it claims the same job again in the other), worker 1 runs one.
 *
 * Compile-time switches (all optional):
 *   -DBROKEN_FENCE      COMPLETE forgets to check lease_version (it checks
 *                       only id, state and lease_owner).  SPIN must then find
 *                       a stale write (property fenced_writes).
 *   -DBROKEN_CLAIM      CLAIM does not bump lease_version, so two claims share
 *                       a token.  SPIN must find it (property lease_exclusive).
 *   -DBROKEN_EFFECT     the handler's effect is committed apart from COMPLETE,
 *                       so a rejected COMPLETE still leaves its effect.  SPIN
 *                       must find it (property effect_once).
 *   -DBROKEN_REAPER     the reaper never runs, so a crashed worker's job
 *                       stays running.  SPIN must then find a run in which a
 *                       job never ends (property all_final).
 *   -DRENEW_BUDGET=n    at most n renewals of an expired lease per run.
 *                       Used by the liveness run (see the README); without
 *                       it renewals are unbounded.
 *   -DCRASH_BUDGET=n    kill -9 events per run        (default 1)
 *   -DFREEZE_BUDGET=n   SIGSTOP events per run        (default 1)
 *   -DRELEASE_BUDGET=n  graceful hand-backs per run   (default 1)
 *
 * Properties (select one with pan -N name):
 *   lease_exclusive  (a) at most one worker holds a valid lease on a job
 *   fenced_writes    (b) outcomes/effects are written only with the current token
 *   effect_once      (c) effect applied exactly once iff the job is completed
 *   all_final        every job eventually reaches completed, failed or dead
 */

#define NJ 3                    /* jobs */
#define NW 2                    /* workers */
#define NK 3                    /* handler slots: 0 and 1 are worker 0's, 2 is worker 1's */
#define MAX_ATTEMPTS 2

#ifndef CRASH_BUDGET
#define CRASH_BUDGET 1
#endif
#ifndef FREEZE_BUDGET
#define FREEZE_BUDGET 1
#endif
#ifndef RELEASE_BUDGET
#define RELEASE_BUDGET 1
#endif

/* job states (column conveyor_job.state) */
#define AVAILABLE 1
#define RUNNING   2
#define COMPLETED 3
#define FAILED    4
#define DEAD      5

#define NOBODY 255              /* lease_owner IS NULL */
#define NOJOB  255              /* a slot that believes it holds nothing */

/* ---------------- the database row (conveyor_job) ---------------------- */
byte jstate[NJ];
byte attempt[NJ];
byte owner[NJ] = NOBODY;        /* lease_owner */
byte version[NJ];               /* lease_version: the fencing token */
bool expired[NJ];               /* lease_expires_at < now(), abstract time */
byte effects[NJ];               /* ledger rows written by the job's handler */

/* ---------------- history of guarded writes ----------------------------
 * Every outcome (and effect) that lands is checked at that moment: the token
 * the writer used must equal the row's lease_version, and the writer must be
 * the row's lease_owner.  Writes that break this are counted here; property
 * fenced_writes says the count stays 0.  (A per-write log would say the same
 * thing with a much larger state.)                                         */
byte h_stale = 0;

/* ---------------- each worker's local belief ----------------------------
 * v_job[k] is the job slot k believes it holds, v_tok[k] the lease_version
 * it got from CLAIM.  A zombie is a slot whose belief no longer matches the
 * row.                                                                     */
byte v_job[NK] = NOJOB;
byte v_tok[NK];
bool frozen[NW];

/* ---------------- environment budgets ---------------------------------- */
byte crashes_left  = CRASH_BUDGET;
byte freezes_left  = FREEZE_BUDGET;
byte releases_left = RELEASE_BUDGET;
#ifdef RENEW_BUDGET
byte renewals_left = RENEW_BUDGET;
#endif

#define WORKER(k) ((k) / 2)     /* slots 0,1 -> worker 0; slot 2 -> worker 1 */

/* The WHERE clause shared by HEARTBEAT, COMPLETE, RETRY, FAIL, RELEASE:
 * id = j AND state = 'running' AND lease_owner = w AND lease_version = tok  */
#define FENCE(k, j) (jstate[j] == RUNNING && owner[j] == WORKER(k) && version[j] == v_tok[k])

#ifdef BROKEN_CLAIM
/* the bug: CLAIM does not issue a new token (no lease_version+1) */
#define NEW_TOKEN(j) skip
#else
#define NEW_TOKEN(j) version[j]++
#endif

#ifdef BROKEN_EFFECT
/* the bug: the handler's effect is committed in its own transaction, before
 * and apart from the guarded COMPLETE, so it lands even when COMPLETE is
 * rejected */
#define EFFECT_IF_REJECTED(j) effects[j]++
#else
#define EFFECT_IF_REJECTED(j) skip
#endif

#ifdef BROKEN_FENCE
/* the bug: COMPLETE's WHERE clause lost "AND lease_version = %s" */
#define COMPLETE_GUARD(k, j) (jstate[j] == RUNNING && owner[j] == WORKER(k))
#else
#define COMPLETE_GUARD(k, j) FENCE(k, j)
#endif

#ifdef RENEW_BUDGET
#define MAY_RENEW (renewals_left > 0)
#define COUNT_RENEWAL renewals_left--
#else
#define MAY_RENEW true
#define COUNT_RENEWAL skip
#endif

/* ---------------- properties -------------------------------------------- */

/* slot k holds a valid lease on job j: the row names k's worker and token,
 * the job is running and the lease has not expired                         */
#define VALID(k, j) (v_job[k] == j && jstate[j] == RUNNING && owner[j] == WORKER(k) \
                     && version[j] == v_tok[k] && !expired[j])
#define ONE_HOLDER(j) ((VALID(0, j) + VALID(1, j) + VALID(2, j)) <= 1)
/* a token is never handed out twice, and no one believes in a future token */
#define TOK_OK(k) (v_job[k] == NOJOB || v_tok[k] <= version[v_job[k]])
#define TOK_PAIR(a, b) (v_job[a] == NOJOB || v_job[a] != v_job[b] || v_tok[a] != v_tok[b])
#define LEASE_OK (ONE_HOLDER(0) && ONE_HOLDER(1) && ONE_HOLDER(2) \
                  && TOK_OK(0) && TOK_OK(1) && TOK_OK(2) \
                  && TOK_PAIR(0, 1) && TOK_PAIR(0, 2) && TOK_PAIR(1, 2))

#define FENCED (h_stale == 0)

#define EFFECT_J(j) (effects[j] <= 1 && ((effects[j] == 1) == (jstate[j] == COMPLETED)))
#define EFFECT_OK (EFFECT_J(0) && EFFECT_J(1) && EFFECT_J(2))

#define FINAL(j) (jstate[j] == COMPLETED || jstate[j] == FAILED || jstate[j] == DEAD)
#define ALL_FINAL (FINAL(0) && FINAL(1) && FINAL(2))

ltl lease_exclusive { [] LEASE_OK }
ltl fenced_writes   { [] FENCED }
ltl effect_once     { [] EFFECT_OK }
ltl all_final       { <> ALL_FINAL }

/* ---------------- helpers ----------------------------------------------- */

/* a guarded write landed: was it written with the row's current token? */
inline record_write(k, j) {
  if
  :: v_tok[k] != version[j] || WORKER(k) != owner[j] -> h_stale++
  :: else -> skip
  fi
}

/* slot k forgets its job (outcome written, write rejected, or lease lost).
 * Worker 0's two slots are interchangeable, so when slot 0 is freed slot 1's
 * belief moves into it: occupied slots come first (a symmetry reduction of
 * the state space only, no behaviour is lost).                            */
inline forget(k) {
  if
  :: k == 0 ->
       v_job[0] = v_job[1]; v_tok[0] = v_tok[1];
       v_job[1] = NOJOB; v_tok[1] = 0
  :: else ->
       v_job[k] = NOJOB; v_tok[k] = 0
  fi
}

/* the row leaves 'running': lease columns cleared */
inline end_lease(j) {
  owner[j] = NOBODY;
  expired[j] = false
}

/* ---------------- worker actions -----------------------------------------
 * Each is one atomic step = one SQL statement in one transaction.  A frozen
 * worker takes no step.  w is the worker, k the slot, j the job.          */

/* CLAIM: UPDATE ... SET state='running', attempt=attempt+1, lease_owner=w,
 * lease_version=lease_version+1, lease_expires_at=now()+lease
 * WHERE id = j AND state='available' (FOR UPDATE SKIP LOCKED).
 * The job goes into worker 0's lowest free slot.                         */
#define CLAIM(w, k, j) \
  :: atomic { !frozen[w] && v_job[k] == NOJOB && jstate[j] == AVAILABLE -> \
       jstate[j] = RUNNING; attempt[j]++; owner[j] = w; NEW_TOKEN(j); \
       expired[j] = false; \
       v_job[k] = j; v_tok[k] = version[j]; \
       printf("CLAIM      worker %d slot %d job %d token %d\n", w, k, j, version[j]) }
#define CLAIM_W0(j) \
  :: atomic { !frozen[0] && v_job[1] == NOJOB && jstate[j] == AVAILABLE -> \
       if \
       :: v_job[0] == NOJOB -> k = 0 \
       :: else -> k = 1 \
       fi; \
       jstate[j] = RUNNING; attempt[j]++; owner[j] = 0; NEW_TOKEN(j); \
       expired[j] = false; \
       v_job[k] = j; v_tok[k] = version[j]; \
       printf("CLAIM      worker 0 slot %d job %d token %d\n", k, j, version[j]); k = 0 }

/* HEARTBEAT: UPDATE ... SET lease_expires_at = now()+lease
 * WHERE id=j AND state='running' AND lease_owner=w AND lease_version=tok.
 * Zero rows: the lease is lost; the handler is told and writes nothing.
 * With abstract time a renewal of a lease that has not expired changes no
 * variable (a stuttering step), so the model only takes the two steps that
 * change something: renewing an expired (not yet reaped) lease, and
 * finding the lease lost.  -DRENEW_BUDGET=n bounds the renewals per run.   */
#define HEARTBEAT(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && \
              (!FENCE(k, v_job[k]) || (expired[v_job[k]] && MAY_RENEW)) -> \
       j = v_job[k]; \
       if \
       :: FENCE(k, j) -> expired[j] = false; COUNT_RENEWAL; \
            printf("HEARTBEAT  worker %d slot %d job %d token %d renewed\n", w, k, j, v_tok[k]) \
       :: else -> printf("HEARTBEAT  worker %d slot %d job %d token %d lost\n", w, k, j, v_tok[k]); forget(k) \
       fi; j = 0 }

/* LOCK_FOR_EFFECT + COMPLETE in one transaction: SELECT ... FOR UPDATE
 * guarded by the token, the handler's ORM writes (the effect), then
 * UPDATE ... SET state='completed' WHERE id, state, owner, version.
 * If the guard fails the whole transaction rolls back, effect included.   */
#define COMPLETE(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB -> \
       j = v_job[k]; \
       if \
       :: COMPLETE_GUARD(k, j) -> \
            record_write(k, j); effects[j]++; jstate[j] = COMPLETED; end_lease(j) \
       :: else -> EFFECT_IF_REJECTED(j) \
       fi; \
       printf("COMPLETE   worker %d slot %d job %d token %d -> state %d version %d stale_writes %d\n", w, k, j, v_tok[k], jstate[j], version[j], h_stale); \
       forget(k); j = 0 }

/* RETRY: UPDATE ... SET state = CASE WHEN attempt >= max_attempts THEN
 * 'dead' ELSE 'available' END, errors = errors || ..., run_after = backoff
 * WHERE id, state='running', lease_owner, lease_version.                  */
#define RETRY(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB -> \
       j = v_job[k]; \
       if \
       :: FENCE(k, j) -> \
            record_write(k, j); \
            if \
            :: attempt[j] >= MAX_ATTEMPTS -> jstate[j] = DEAD \
            :: else -> jstate[j] = AVAILABLE \
            fi; end_lease(j) \
       :: else -> skip \
       fi; \
       printf("RETRY      worker %d slot %d job %d token %d -> state %d version %d stale_writes %d\n", w, k, j, v_tok[k], jstate[j], version[j], h_stale); \
       forget(k); j = 0 }

/* FAIL: UPDATE ... SET state='failed' (the handler raised Discard)
 * WHERE id, state='running', lease_owner, lease_version.                  */
#define FAIL(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB -> \
       j = v_job[k]; \
       if \
       :: FENCE(k, j) -> record_write(k, j); jstate[j] = FAILED; end_lease(j) \
       :: else -> skip \
       fi; \
       printf("FAIL       worker %d slot %d job %d token %d -> state %d version %d stale_writes %d\n", w, k, j, v_tok[k], jstate[j], version[j], h_stale); \
       forget(k); j = 0 }

/* RELEASE: graceful shutdown hands an unfinished lease back at once:
 * UPDATE ... SET state='available', attempt=attempt-1 (the hand-back does
 * not use up an attempt) WHERE id, state='running', lease_owner, lease_version.
 * Bounded by RELEASE_BUDGET (shutdowns per run).                          */
#define RELEASE(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && releases_left > 0 -> \
       releases_left--; j = v_job[k]; \
       if \
       :: FENCE(k, j) -> \
            record_write(k, j); jstate[j] = AVAILABLE; attempt[j]--; end_lease(j) \
       :: else -> skip \
       fi; \
       printf("RELEASE    worker %d slot %d job %d token %d -> state %d version %d stale_writes %d\n", w, k, j, v_tok[k], jstate[j], version[j], h_stale); \
       forget(k); j = 0 }

#define SLOT_ACTIONS(w, k) HEARTBEAT(w, k) COMPLETE(w, k) RETRY(w, k) FAIL(w, k) RELEASE(w, k)

proctype Worker0() {
  byte k = 0;
  byte j = 0;
end_loop:
  do
  CLAIM_W0(0)
  CLAIM_W0(1)
  CLAIM_W0(2)
  SLOT_ACTIONS(0, 0)
  SLOT_ACTIONS(0, 1)
  od
}

proctype Worker1() {
  byte j = 0;
end_loop:
  do
  CLAIM(1, 2, 0)
  CLAIM(1, 2, 1)
  CLAIM(1, 2, 2)
  SLOT_ACTIONS(1, 2)
  od
}

/* ---------------- the reaper -------------------------------------------- */

/* REAP: UPDATE ... SET state = CASE WHEN attempt >= max_attempts THEN 'dead'
 * ELSE 'available' END, lease_owner = NULL, errors = errors || 'lease lost'
 * WHERE state='running' AND lease_expires_at < now() (database time; no
 * owner needed; SKIP LOCKED).                                              */
#ifdef BROKEN_REAPER
#define REAPER_RUNS false
#else
#define REAPER_RUNS true
#endif
#define REAP(j) \
  :: atomic { REAPER_RUNS && jstate[j] == RUNNING && expired[j] -> \
       if \
       :: attempt[j] >= MAX_ATTEMPTS -> jstate[j] = DEAD \
       :: else -> jstate[j] = AVAILABLE \
       fi; end_lease(j); \
       printf("REAP       job %d -> state %d\n", j, jstate[j]) }

/* ---------------- the environment --------------------------------------- */

/* Tick: time passes a lease's expiry (no heartbeat came in time) */
#define TICK(j) :: atomic { jstate[j] == RUNNING && !expired[j] -> expired[j] = true; \
       printf("Tick       lease of job %d expired\n", j) }

/* Crash: kill -9; the process restarts at once with empty memory, so all
 * of its beliefs are gone and its leases just expire.                      */
#define CRASH_W0 \
  :: atomic { crashes_left > 0 -> crashes_left--; frozen[0] = false; \
       v_job[0] = NOJOB; v_tok[0] = 0; \
       v_job[1] = NOJOB; v_tok[1] = 0; printf("Crash      worker 0\n") }
#define CRASH_W1 \
  :: atomic { crashes_left > 0 -> crashes_left--; frozen[1] = false; \
       v_job[2] = NOJOB; v_tok[2] = 0; printf("Crash      worker 1\n") }

/* Freeze: SIGSTOP; the worker keeps its beliefs but does nothing.
 * Thaw: SIGCONT; it resumes with whatever it believed.                     */
#define FREEZE(w) :: atomic { freezes_left > 0 && !frozen[w] -> freezes_left--; frozen[w] = true; \
       printf("Freeze     worker %d\n", w) }
#define THAW(w)   :: atomic { frozen[w] -> frozen[w] = false; printf("Thaw       worker %d\n", w) }

/* The reaper's statement and the environment's events share one process:
 * each is still its own atomic step, and one process instead of two keeps
 * SPIN's fairness construction (pan -f copies the graph per process) small.
 * The liveness property holds even without fairness (see the README).     */
proctype World() {
end_loop:
  do
  REAP(0)
  REAP(1)
  REAP(2)
  TICK(0)
  TICK(1)
  TICK(2)
  CRASH_W0
  CRASH_W1
  FREEZE(0)
  FREEZE(1)
  THAW(0)
  THAW(1)
  od
}

/* ENQUEUE: INSERT INTO conveyor_job (..., state) VALUES (..., 'available').
 * All jobs are enqueued before the workers start: an INSERT touches only its
 * own new row, so interleaving it with the other actions adds states but no
 * behaviour that matters to the properties.                              */
init {
  byte i = 0;
  atomic {
    do
    :: i < NJ -> jstate[i] = AVAILABLE; attempt[i] = 0; i++          /* ENQUEUE */
    :: else -> break
    od;
    i = 0;
    run Worker0();
    run Worker1();
    run World()
  }
}
