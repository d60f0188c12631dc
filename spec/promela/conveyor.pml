/*
 * conveyor.pml -- the django-conveyor protocol for SPIN.
 *
 * The same protocol as spec/tla/Conveyor.tla, action for action: every
 * atomic block below is one SQL statement (one transaction) of
 * django_conveyor/protocol.py and carries that statement's name in its
 * comment.  Handler steps (Effect, Start) and the environment (Tick,
 * TxnTimeout, Crash, Freeze, Thaw, Clock) are named in CamelCase.
 *
 * Workers: worker 0 runs two handler slots (0 and 1), worker 1 one (2), so a
 * worker can hold a stale attempt in one slot while it claims the same job
 * again in the other; then only lease_version tells them apart.
 *
 * Features (compile-time switches, one per configuration that spec/check runs):
 *   (none)           the core protocol: 2 jobs, max_attempts 2, the guarded
 *                    transaction (lock -> effect -> commit), SNOOZE,
 *                    RELEASE, REAP, CANCEL, PRUNE, a crash and a freeze
 *   -DISOLATION      crash containment: job 0's handler kills its worker;
 *                    the isolated flag, Start, CLAIM_ISOLATED, DECLARE (the
 *                    worker's may_start) and REAP's give-back of an attempt
 *                    that never started
 *   -DWORKFLOWS      job 2 waits for jobs 0 and 1 (policy 'cancel'), job 3
 *                    for jobs 1 and 2 (policy 'run'): UNBLOCK,
 *                    CANCEL_DEPENDENTS, REQUEUE with REBLOCK_DEPENDENTS
 *   -DCANCEL_RUNNING REQUEST_CANCEL, CANCEL_HELD, cancel-aware REAP/LOCK and
 *                    COMPLETE; job 1 waits for job 0 (policy 'cancel')
 *   -DCRON           one schedule with 3 ticks and two schedulers
 *   -DGATES          job 1 is a gate after job 0, job 2 waits for it: SIGNAL,
 *                    CONDITION_MET, GATE_TIMEOUT; jobs record one
 *                    checkpointed step (CHECKPOINT)
 *   -DUNIQUE         unique jobs: three calls with one unique key, enqueued
 *                    while the workers run; call 0 skips a duplicate, calls
 *                    1 and 2 replace it (ENQUEUE_REPLACE); REQUEUE's key guard
 *   -DLIMITS         flow control: four jobs of one queue with limits
 *                    (concurrency 2, key_concurrency 1 for jobs 0 and 1,
 *                    which share a key, rate 2 per window), claimed only by
 *                    CLAIM_LIMITED; a crash; NewWindow (liveness: -DNJ=3)
 * Sizes and budgets can be overridden: -DNJ=n -DMAX_ATTEMPTS=n
 * -DCRASH_BUDGET=n -DFREEZE_BUDGET=n -DRELEASE_BUDGET=n -DSNOOZE_BUDGET=n
 * -DREQUEUE_BUDGET=n -DCANCEL_BUDGET=n -DPRUNE_BUDGET=n -DRENEW_BUDGET=n.
 *
 * Properties (pan -N name): safety (all invariants at once),
 * lease_exclusive, fenced_writes, effect_once, lock_held, crash_contained,
 * dependents_wait, unblock_fenced, counter_exact, cascade_cause, operator_cancel,
 * cancel_honoured,
 * one_job_per_tick, gate_never_claimed, gate_once, gate_after_upstream,
 * checkpoint_once, unique_key_held, duplicate_of_holder, replace_pending,
 * limit_held, key_limit_held, rate_held;
 * liveness all_final, every_tick.
 *
 * Mutations (spec/mutations.toml) edit the macros below in a copy of this
 * file; none is kept here.
 */

/* ---------------- configuration ---------------------------------------- */

#define MAXJ 4                  /* array size; jobs NJ..MAXJ-1 never exist */
#define NW 2
#define NK 3                    /* slots 0, 1: worker 0; slot 2: worker 1 */
#define WORKER(k) ((k) / 2)

#ifdef WORKFLOWS
#  ifndef NJ
#  define NJ 4
#  endif
#  ifndef MAX_ATTEMPTS
#  define MAX_ATTEMPTS 1
#  endif
#  define NO_ATOMIC             /* handlers without context.atomic() */
#  ifndef REQUEUE_BUDGET
#  define REQUEUE_BUDGET 1
#  endif
#  ifndef CRASH_BUDGET
#  define CRASH_BUDGET 0
#  endif
#  ifndef RELEASE_BUDGET
#  define RELEASE_BUDGET 0
#  endif
#  ifndef SNOOZE_BUDGET
#  define SNOOZE_BUDGET 0
#  endif
#  ifndef PRUNE_BUDGET
#  define PRUNE_BUDGET 0
#  endif
#endif

#ifdef ISOLATION
#  ifndef NJ
#  define NJ 2                  /* job 0 kills its worker; job 1 is ordinary */
#  endif
#  ifndef CRASH_BUDGET
#  define CRASH_BUDGET 0
#  endif
#  ifndef SNOOZE_BUDGET
#  define SNOOZE_BUDGET 0
#  endif
#  ifndef CANCEL_BUDGET
#  define CANCEL_BUDGET 0
#  endif
#  ifndef PRUNE_BUDGET
#  define PRUNE_BUDGET 0
#  endif
#endif

#ifdef CANCEL_RUNNING
#  ifndef NJ
#  define NJ 2
#  endif
#  ifndef MAX_ATTEMPTS
#  define MAX_ATTEMPTS 1
#  endif
#  ifndef REQUEUE_BUDGET
#  define REQUEUE_BUDGET 1
#  endif
#  ifndef CRASH_BUDGET
#  define CRASH_BUDGET 0
#  endif
#  ifndef SNOOZE_BUDGET
#  define SNOOZE_BUDGET 0
#  endif
#  ifndef CANCEL_BUDGET
#  define CANCEL_BUDGET 0
#  endif
#  ifndef PRUNE_BUDGET
#  define PRUNE_BUDGET 0
#  endif
#  ifndef REQUEST_BUDGET
#  define REQUEST_BUDGET 1
#  endif
#endif

#ifdef GATES
#  ifndef NJ
#  define NJ 3                  /* job 0, then the gate (job 1), then job 2 */
#  endif
#  ifndef MAX_ATTEMPTS
#  define MAX_ATTEMPTS 2
#  endif
#  define NO_ATOMIC             /* handlers without context.atomic() */
#  define CHECKPOINTS
#  ifndef REQUEUE_BUDGET
#  define REQUEUE_BUDGET 1
#  endif
#  ifndef SIGNAL_BUDGET
#  define SIGNAL_BUDGET 2
#  endif
#  ifndef CRASH_BUDGET
#  define CRASH_BUDGET 0
#  endif
#  ifndef RELEASE_BUDGET
#  define RELEASE_BUDGET 0
#  endif
#  ifndef SNOOZE_BUDGET
#  define SNOOZE_BUDGET 0
#  endif
#  ifndef CANCEL_BUDGET
#  define CANCEL_BUDGET 0
#  endif
#  ifndef PRUNE_BUDGET
#  define PRUNE_BUDGET 0
#  endif
#endif

#ifdef LIMITS
#  ifndef NJ
#  define NJ 4
#  endif
#  ifndef MAX_ATTEMPTS
#  define MAX_ATTEMPTS 1
#  endif
#  define NO_ATOMIC             /* handlers without context.atomic() */
#  ifndef RELEASE_BUDGET
#  define RELEASE_BUDGET 0
#  endif
#  ifndef SNOOZE_BUDGET
#  define SNOOZE_BUDGET 0
#  endif
#  ifndef CANCEL_BUDGET
#  define CANCEL_BUDGET 0
#  endif
#  ifndef PRUNE_BUDGET
#  define PRUNE_BUDGET 0
#  endif
#endif

#ifdef CRON
#  define NJ 0                  /* the schedule only: no job runs */
#  define MAX_TICK 3
#endif

#ifdef UNIQUE
#  ifndef NJ
#  define NJ 3
#  endif
#  ifndef MAX_ATTEMPTS
#  define MAX_ATTEMPTS 1
#  endif
#  define NO_ATOMIC             /* handlers without context.atomic() */
#  ifndef REQUEUE_BUDGET
#  define REQUEUE_BUDGET 1
#  endif
#  ifndef REQUEST_BUDGET
#  define REQUEST_BUDGET 1
#  endif
#  ifndef CRASH_BUDGET
#  define CRASH_BUDGET 0
#  endif
#  ifndef RELEASE_BUDGET
#  define RELEASE_BUDGET 0
#  endif
#  ifndef SNOOZE_BUDGET
#  define SNOOZE_BUDGET 0
#  endif
#endif

#ifndef NJ
#define NJ 2
#endif
#ifndef MAX_ATTEMPTS
#define MAX_ATTEMPTS 2
#endif
#ifndef CRASH_BUDGET
#define CRASH_BUDGET 1
#endif
#ifndef FREEZE_BUDGET
#define FREEZE_BUDGET 0         /* safety needs none: see the README */
#endif
#ifndef RELEASE_BUDGET
#define RELEASE_BUDGET 1
#endif
#ifndef SNOOZE_BUDGET
#define SNOOZE_BUDGET 1
#endif
#ifndef REQUEUE_BUDGET
#define REQUEUE_BUDGET 0
#endif
#ifndef CANCEL_BUDGET
#define CANCEL_BUDGET 1
#endif
#ifndef PRUNE_BUDGET
#define PRUNE_BUDGET 1
#endif
#ifndef REQUEST_BUDGET
#define REQUEST_BUDGET 0
#endif
#ifndef MAX_TICK
#define MAX_TICK 0
#endif
#ifndef SIGNAL_BUDGET
#define SIGNAL_BUDGET 0
#endif

/* job states (conveyor_job.state); ABSENT: not inserted, PRUNED: deleted */
#define ABSENT    0
#define BLOCKED   1
#define AVAILABLE 2
#define RUNNING   3
#define COMPLETED 4
#define FAILED    5
#define DEAD      6
#define CANCELLED 7
#define PRUNED    8

#define FINAL(s)  ((s) == COMPLETED || (s) == FAILED || (s) == DEAD || (s) == CANCELLED)
#define DOOMED(s) ((s) == FAILED || (s) == DEAD || (s) == CANCELLED)

/* phases of an attempt, as its worker sees it */
#define P_CLAIMED 1               /* claimed, not started (ISOLATION only) */
#define P_RUN     2               /* the handler runs */
#define P_LOCKED  3               /* inside context.atomic(): row locked */
#define P_EFFECT  4               /* ... and the effect written, not committed */
#define P_ABORTED 5               /* PostgreSQL ended the transaction */
#define P_DONE    6               /* the guarded commit succeeded */

#define NOBODY 255              /* lease_owner IS NULL */
#define NOJOB  255

#ifdef ISOLATION
#define ISOLATION_ON true
#define START_PHASE P_CLAIMED
#define CRASHER(j) ((j) == 0)
#else
#define ISOLATION_ON false
#define START_PHASE P_RUN
#define CRASHER(j) false
#endif

/* workflows: DEP(x, d) means x depends on d; RUN_ANYWAY(x): policy 'run' */
#ifdef WORKFLOWS
#define DEP(x, d) (((x) == 2 && ((d) == 0 || (d) == 1)) || ((x) == 3 && ((d) == 1 || (d) == 2)))
#define RUN_ANYWAY(x) ((x) == 3)
#elif defined(CANCEL_RUNNING)
/* a cancelled job's dependent is cancelled with it, never unblocked */
#define DEP(x, d) ((x) == 1 && (d) == 0)
#define RUN_ANYWAY(x) false
#else
#ifdef GATES
#define DEP(x, d) (((x) == 1 && (d) == 0) || ((x) == 2 && (d) == 1))
#else
#define DEP(x, d) false
#endif
#define RUN_ANYWAY(x) false
#endif

/* gates (conveyor_job.gate IS NOT NULL): no handler runs them */
#ifdef GATES
#define GATE(x) ((x) == 1)
#else
#define GATE(x) false
#endif
#define CONTINUE_ON_TIMEOUT(x) false  /* on_timeout 'fail' */
#ifdef CHECKPOINTS
#define CHECKPOINTS_ON true
#else
#define CHECKPOINTS_ON false
#endif
/* flow control: with -DLIMITS every job is of the one queue with limits;
 * jobs 0 and 1 share the concurrency key 1, jobs 2 and 3 have none (0)   */
#ifdef LIMITS
#define LIMITED(x) ((x) < NJ)
#define LKEY(x) ((x) < 2 -> 1 : 0)
#define C_LIMIT 2               /* concurrency: running jobs of the queue */
#define K_LIMIT 1               /* key_concurrency: running jobs per key */
#define R_LIMIT 2               /* rate: claims per window */
#else
#define LIMITED(x) false
#define LKEY(x) 0
#define C_LIMIT 0               /* 0: no such limit */
#define K_LIMIT 0
#define R_LIMIT 0
#endif
#define SAT(x, d) ((RUN_ANYWAY(x) && FINAL(jstate[d])) || (!RUN_ANYWAY(x) && jstate[d] == COMPLETED))
#define UNSAT(x, d) (DEP(x, d) && !SAT(x, d))
#define UNSAT_COUNT(x) (UNSAT(x, 0) + UNSAT(x, 1) + UNSAT(x, 2) + UNSAT(x, 3))

/* ---------------- conveyor_job ----------------------------------------- */
byte jstate[MAXJ];
byte attempt[MAXJ];
byte owner[MAXJ] = NOBODY;      /* lease_owner */
byte version[MAXJ];             /* lease_version: the fencing token */
bool expired[MAXJ];             /* lease_expires_at < now() */
byte locked[MAXJ];              /* claim id whose guarded transaction holds the row lock */
bool isolated[MAXJ];
bool cancel_req[MAXJ];          /* cancel_requested_at IS NOT NULL */
byte pending[MAXJ];             /* pending_dependencies */
byte cause[MAXJ] = NOJOB;       /* the dependency its last error (DependencyFailed) names */
byte count[MAXJ];               /* REBLOCK_DEPENDENTS' counts, within its transaction */
byte rq = 0; byte up = 0;       /* REBLOCK_DEPENDENTS: jobs written so far, in this level */
/* conveyor_ledger (unique per job and effect key) and the business table */
byte ledger[MAXJ];              /* claim id of the committed ledger row; 0: none */
byte business[MAXJ];            /* committed business rows */

/* ---------------- ghost state, for the properties only ----------------- */
byte claims[MAXJ];              /* claims so far: the latest claim's id */
byte holder[MAXJ];              /* the claim that holds the lease; 0: none */
byte live[MAXJ];                /* the claim whose lease is live in real time */
byte completer[MAXJ];           /* the claim whose COMPLETE landed */
byte lost_to[MAXJ];             /* charged attempts lost to another job's crash */
byte h_refund_ran = 0;          /* attempts REAP gave back although their handler started */
byte h_stale = 0;               /* writes that landed from a non-holder */
byte h_double = 0;              /* claims granted while another lease was live */
byte h_early = 0;               /* dependents unblocked before their dependencies */
byte h_cancelled_effect = 0;    /* guarded effects committed after a cancel request */
byte h_rerun = 0;               /* claims of a job with a cancel request */
byte h_iso_claim = 0;           /* isolated jobs taken by CLAIM */
byte h_unfenced = 0;            /* dependents unblocked other than by a holder's COMPLETE */
byte h_cause = 0;               /* cascades naming a dependency that did not fail */
byte h_operator = 0;            /* jobs an operator cancelled, brought back by another's REQUEUE */
bool g_fenced = false;          /* this COMPLETE landed for the lease holder */

/* ---------------- gates and checkpoints (issue 27) --------------------- */
byte outcomes[MAXJ];            /* ghost: ends of the gate's wait since it began */
byte signals_left = SIGNAL_BUDGET;
byte ckpt[MAXJ];                /* conveyor_ledger: claim id of the step's record; 0: none */
byte ckpt_count[MAXJ];          /* ghost: step records committed */
byte step_effect[MAXJ];         /* ghost: committed writes of the checkpointed step */
byte h_gate_early = 0;          /* gate waits ended before their upstream was satisfied */
byte h_stale_step = 0;          /* step records committed by a non-holder */
/* ---------------- unique jobs: the keyed calls ------------------------- */
#define CALL_IDLE     0           /* not made yet, or to be inserted again */
#define CALL_CONFLICT 1           /* its ENQUEUE met the key; next statement pending */
#define CALL_FOLDED   2           /* answered with the job that holds the key */
byte ucall[MAXJ];
byte h_fold = 0;                /* calls answered while no job held their key */
byte h_replace = 0;             /* replaces that wrote a job that had started */
/* ---------------- flow control: the queue's rate log ------------------- */
byte rate_log = 0;              /* claims the rate log records in the current window */
byte g_win = 0;                 /* ghost: limited jobs started in the window, by any statement */

/* ---------------- the workers' beliefs --------------------------------- */
byte v_job[NK] = NOJOB;
byte v_tok[NK];
byte v_gid[NK];
byte v_phase[NK];
bool v_told[NK];                /* HEARTBEAT reported a cancel request */
bool v_iso[NK];                 /* taken by CLAIM_ISOLATED */
bool g_was_iso[NK];             /* ghost: the row was isolated when claimed */
bool v_decl[NK];                /* listed in the worker's may_start (DECLARE_STARTS) */

/* ---------------- crash containment: what a worker may have started ---- */
byte may_start[NW];             /* conveyor_worker.may_start of the current process: bit j */
byte refunds[MAXJ];             /* attempts REAP gave back: never started */
/* the job's lease is in the row of a worker process that died (the
 * restarted one has a row of its own): O_DEAD; O_LISTED: that row lists
 * the job; ghost: O_RAN, the lease holder's handler started; O_VICTIM, the
 * lease was lost to another job's crash                                  */
byte orphan[MAXJ];
#define O_DEAD   1
#define O_LISTED 2
#define O_RAN    4
#define O_VICTIM 8
bool frozen[NW];
bool forever[NW];               /* frozen and never continued */

/* ---------------- budgets ---------------------------------------------- */
byte crashes_left  = CRASH_BUDGET;
byte freezes_left  = FREEZE_BUDGET;
byte releases_left = RELEASE_BUDGET;
byte snoozes_left  = SNOOZE_BUDGET;
byte requeues_left = REQUEUE_BUDGET;
byte cancels_left  = CANCEL_BUDGET;
byte prunes_left   = PRUNE_BUDGET;
byte requests_left = REQUEST_BUDGET;
#ifdef RENEW_BUDGET
byte renewals_left = RENEW_BUDGET;
#define MAY_RENEW (renewals_left > 0)
#define COUNT_RENEWAL renewals_left--
#else
#define MAY_RENEW true
#define COUNT_RENEWAL skip
#endif

/* ---------------- cron: one schedule ----------------------------------- */
byte now = 0;                   /* ticks 1..now are due */
byte next_tick = 1;             /* conveyor_cron.next_tick_at */
byte seen[NW];                  /* the tick a scheduler read as due; 0: none */
byte expect[NW];                /* the next_tick_at it read with it */
#ifndef SYNC_BUDGET
#  ifdef CRON
#  define SYNC_BUDGET 1
#  else
#  define SYNC_BUDGET 0
#  endif
#endif
byte syncs_left = SYNC_BUDGET;
byte cron_jobs[MAX_TICK + 1];   /* jobs inserted per tick */

/* ---------------- the guards (mutations edit these) -------------------- */

/* id = j AND state = 'running' AND lease_owner = w AND lease_version = tok */
#define FENCE(k, j) (jstate[j] == RUNNING && owner[j] == WORKER(k) && version[j] == v_tok[k])
#define GUARD_HEARTBEAT(k, j) FENCE(k, j)
#define GUARD_COMPLETE(k, j) (FENCE(k, j) && !cancel_req[j])
#define GUARD_RETRY(k, j) FENCE(k, j)
#define GUARD_FAIL(k, j) FENCE(k, j)
#define GUARD_SNOOZE(k, j) FENCE(k, j)
#define GUARD_RELEASE(k, j) FENCE(k, j)
#define GUARD_CANCEL_HELD(k, j) (FENCE(k, j) && cancel_req[j])
#define GUARD_LOCK(k, j) (FENCE(k, j) && !cancel_req[j])
#define GUARD_RECORD(k, j) (jstate[j] == COMPLETED && owner[j] == WORKER(k) && version[j] == v_tok[k] \
                            && !cancel_req[j])
#define NEW_TOKEN(j) version[j]++
#define CLAIMABLE(j) (jstate[j] == AVAILABLE && !isolated[j])
#define ISO_HELD(w) ((w) == 0 -> ((v_job[0] != NOJOB && v_iso[0]) || (v_job[1] != NOJOB && v_iso[1])) : (v_job[2] != NOJOB && v_iso[2]))
#define UNSTARTED(w) ((w) == 0 -> ((v_job[0] != NOJOB && v_phase[0] == P_CLAIMED) || (v_job[1] != NOJOB && v_phase[1] == P_CLAIMED)) : (v_job[2] != NOJOB && v_phase[2] == P_CLAIMED))
#define ALONE(w) (!ISO_HELD(w) && !UNSTARTED(w))
#define REAP_GUARD(j) (jstate[j] == RUNNING && expired[j] && locked[j] == 0)
#define REAP_ISOLATES 1
#define IN_LIST(w, j) ((may_start[w] >> (j)) & 1)
#define LISTED(j) ((orphan[j] & O_DEAD) -> ((orphan[j] & O_LISTED) != 0) : IN_LIST(owner[j], j))
#define REAP_STARTED(j) (!ISOLATION_ON || LISTED(j) || refunds[j] >= MAX_ATTEMPTS)
#define GUARD_DECLARE_STARTS(k, j) FENCE(k, j)
/* the slot's attempt holds j's lease and its handler started */
#define RAN_K(k, j) (v_job[k] == (j) && v_gid[k] == holder[j] && v_phase[k] != P_CLAIMED)
#define RAN(j) ((orphan[j] & O_DEAD) -> ((orphan[j] & O_RAN) != 0) : (RAN_K(0, j) || RAN_K(1, j) || RAN_K(2, j)))
#define DECL_BIT(k) ((v_job[k] != NOJOB && v_decl[k]) -> (1 << v_job[k]) : 0)
#define DECLARED(w) ((w) == 0 -> (DECL_BIT(0) | DECL_BIT(1)) : DECL_BIT(2))
#define EFFECT_COMMITS_ALONE 0
#define TXN_BOUND 1
#define DECREMENT(x) pending[x]--
#define RUN_WAITS(s) ((s) == BLOCKED || (s) == AVAILABLE)   /* a 'run' dependent not started */
#define INSERT_TICK(t) if :: cron_jobs[t] == 0 -> cron_jobs[t] = 1 :: else -> skip fi
#define UNBLOCK_IF_REFUSED(j) skip
#define GATE_WAITS(x) GATE(x)             /* a gate stays blocked at pending 0 */
#define WAITING(g) (GATE(g) && jstate[g] == BLOCKED && pending[g] == 0)
#define GUARD_SIGNAL(g) WAITING(g)
#define GUARD_CONDITION_MET(g) WAITING(g)
#define GUARD_GATE_TIMEOUT(g) WAITING(g)
#define GUARD_CHECKPOINT(k, j) (FENCE(k, j) && !cancel_req[j])
#define CKPT_READ(j) (ckpt[j] == 0)          /* the handler's read of the ledger */
#define CKPT_UNIQUE(j) (ckpt[j] == 0)        /* unique (job, effect key) */

/* unique jobs: every job of the model (0..NJ-1) is a call with one key,
 * held while blocked, available or running; the partial unique index
 * (unique_key IS NOT NULL AND unique_states @> ARRAY[state]) holds a row
 * while its state is one of them                                         */
#ifdef UNIQUE
#define KEYED(x) ((x) < NJ)
#define REPLACING(x) ((x) >= 1)
#else
#define KEYED(x) false
#define REPLACING(x) false
#endif
#define INDEXED(x) (KEYED(x) && (jstate[x] == BLOCKED || jstate[x] == AVAILABLE || jstate[x] == RUNNING))
#define KEY_TAKEN(j) (KEYED(j) && (((j) != 0 && INDEXED(0)) || ((j) != 1 && INDEXED(1)) || \
                                   ((j) != 2 && INDEXED(2)) || ((j) != 3 && INDEXED(3))))
#define REPLACE_GUARD(x) (jstate[x] == BLOCKED || jstate[x] == AVAILABLE)
#define CASCADE_IF_REFUSED(j) skip

/* flow control.  CLAIM and CLAIM_ISOLATED filter out a queue with limits,
 * as a paused one; CLAIM_LIMITED's count is every running row of the
 * queue, whatever its worker, expired leases not yet reaped included (w,
 * the claiming worker, is not read), and per key; the room of a batch of
 * jobs i and j (i == j: one job)                                         */
#define CLAIM_SKIPS(j) (!LIMITED(j))
#define QRUNNING(w, x) (LIMITED(x) && jstate[x] == RUNNING)
#define QRUN(w) (QRUNNING(w, 0) + QRUNNING(w, 1) + QRUNNING(w, 2) + QRUNNING(w, 3))
#define KRUN(w, key) ((QRUNNING(w, 0) && LKEY(0) == (key)) + (QRUNNING(w, 1) && LKEY(1) == (key)) + \
                      (QRUNNING(w, 2) && LKEY(2) == (key)) + (QRUNNING(w, 3) && LKEY(3) == (key)))
#define CONC_ROOM(w, n) (C_LIMIT == 0 || QRUN(w) + (n) <= C_LIMIT)
#define KEY_ROOM(w, key, n) (K_LIMIT == 0 || (key) == 0 || KRUN(w, key) + (n) <= K_LIMIT)
#define RATE_ROOM(n) (R_LIMIT == 0 || rate_log + (n) <= R_LIMIT)
#define RATE_LOG(n) if :: R_LIMIT > 0 -> rate_log = rate_log + (n) :: else -> skip fi
#define BATCH(i, j) (1 + ((i) != (j)))
#define SAME_KEY(i, j) ((i) != (j) && LKEY(i) == LKEY(j))
#define BATCH_ROOM(w, i, j) (CONC_ROOM(w, BATCH(i, j)) && RATE_ROOM(BATCH(i, j)) && \
                             KEY_ROOM(w, LKEY(i), 1 + SAME_KEY(i, j)) && KEY_ROOM(w, LKEY(j), 1 + SAME_KEY(i, j)))
/* an isolated job alone, with CLAIM_ISOLATED's guard; a batch without */
#define LIMITED_TAKES(w, i, j) (LIMITED(i) && LIMITED(j) && jstate[i] == AVAILABLE && jstate[j] == AVAILABLE && \
    ((i) == (j) -> (!isolated[i] || ALONE(w)) : (!isolated[i] && !isolated[j])) && BATCH_ROOM(w, i, j))

#define AFTER_FAILURE(j) (attempt[j] >= MAX_ATTEMPTS -> DEAD : AVAILABLE)
/* a job handed back while an operator asked to cancel it ends cancelled */
#define HANDBACK(j, st) (cancel_req[j] -> CANCELLED : (st))
#define REAP_STATE(j) HANDBACK(j, AFTER_FAILURE(j))

#ifdef NO_ATOMIC
#define ATOMIC_PATH false
#else
#define ATOMIC_PATH true
#endif

/* ---------------- properties ------------------------------------------- */

/* slot k holds a valid lease on j (written out, not through FENCE) */
#define VALID(k, j) (v_job[k] == j && jstate[j] == RUNNING && owner[j] == WORKER(k) \
                     && version[j] == v_tok[k] && !expired[j])
#define ONE_HOLDER(j) ((VALID(0, j) + VALID(1, j) + VALID(2, j)) <= 1)
#define HOLDER_OK(k) (v_job[k] == NOJOB || ((!VALID(k, v_job[k]) || v_gid[k] == claims[v_job[k]]) \
                      && v_tok[k] <= version[v_job[k]]))
#define HELD_RUNNING(j) (holder[j] == 0 || jstate[j] == RUNNING)
#define LEASE_OK (ONE_HOLDER(0) && ONE_HOLDER(1) && ONE_HOLDER(2) && ONE_HOLDER(3) \
                  && HOLDER_OK(0) && HOLDER_OK(1) && HOLDER_OK(2) && h_double == 0 \
                  && HELD_RUNNING(0) && HELD_RUNNING(1) && HELD_RUNNING(2) && HELD_RUNNING(3))

#define FENCED (h_stale == 0)

#define EFFECT_J(j) (business[j] <= 1 && (jstate[j] == PRUNED || \
                     (((business[j] == 1) == (ledger[j] != 0)) && \
                      (ledger[j] == 0 || (jstate[j] == COMPLETED && ledger[j] == completer[j])))))
#define EFFECT_OK (EFFECT_J(0) && EFFECT_J(1) && EFFECT_J(2) && EFFECT_J(3))

#define LOCK_K(k) (v_job[k] == NOJOB || (v_phase[k] != P_LOCKED && v_phase[k] != P_EFFECT) || \
                   (locked[v_job[k]] == v_gid[k] && holder[v_job[k]] == v_gid[k]))
#define LOCK_OK (LOCK_K(0) && LOCK_K(1) && LOCK_K(2))

/* no isolated job taken by CLAIM; worker 0 (two slots) never holds the
 * leases of two jobs that were isolated when claimed; no job loses two
 * attempts to a crasher                                                  */
#define ISO_LEASE(k) (v_job[k] != NOJOB && g_was_iso[k] && holder[v_job[k]] == v_gid[k])
#define CRASH_OK (h_iso_claim == 0 && !(ISO_LEASE(0) && ISO_LEASE(1)) && \
                  lost_to[0] <= 1 && lost_to[1] <= 1 && lost_to[2] <= 1 && lost_to[3] <= 1)

/* every started attempt whose lease is current has its job in its
 * worker's may_start; REAP gives back only attempts that never started   */
#define SD_K(k) (!ISOLATION_ON || v_job[k] == NOJOB || v_phase[k] == P_CLAIMED || \
                 holder[v_job[k]] != v_gid[k] || IN_LIST(WORKER(k), v_job[k]))
#define STARTED_OK (h_refund_ran == 0 && SD_K(0) && SD_K(1) && SD_K(2))

#define AVAIL_J(x) (jstate[x] != AVAILABLE || UNSAT_COUNT(x) == 0)
#define WAIT_OK (h_early == 0 && AVAIL_J(0) && AVAIL_J(1) && AVAIL_J(2) && AVAIL_J(3))
#define UNBLOCK_OK (h_unfenced == 0)
#define COUNT_J(x) (jstate[x] != BLOCKED || pending[x] == UNSAT_COUNT(x))
#define COUNT_OK (COUNT_J(0) && COUNT_J(1) && COUNT_J(2) && COUNT_J(3))
#define NODOOM_D(x, d) (!DEP(x, d) || !DOOMED(jstate[d]))
#define NODOOM_J(x) (jstate[x] != BLOCKED || RUN_ANYWAY(x) || \
                     (NODOOM_D(x, 0) && NODOOM_D(x, 1) && NODOOM_D(x, 2) && NODOOM_D(x, 3)))
#define DOOMED_DEP(x) ((DEP(x, 0) && DOOMED(jstate[0])) || (DEP(x, 1) && DOOMED(jstate[1])) || \
                       (DEP(x, 2) && DOOMED(jstate[2])) || (DEP(x, 3) && DOOMED(jstate[3])))
#define CAUSE_J(x) (jstate[x] != CANCELLED || cause[x] == NOJOB || (DEP(x, cause[x]) && DOOMED_DEP(x)))
#define WF_OK (h_cause == 0 && NODOOM_J(0) && NODOOM_J(1) && NODOOM_J(2) && NODOOM_J(3) && \
               CAUSE_J(0) && CAUSE_J(1) && CAUSE_J(2) && CAUSE_J(3))

#define GATE_J(x) (!GATE(x) || (jstate[x] != AVAILABLE && jstate[x] != RUNNING))
#define GATE_HELD(k) (v_job[k] == NOJOB || !GATE(v_job[k]))
#define GATE_NEVER_OK (GATE_J(0) && GATE_J(1) && GATE_J(2) && GATE_J(3) && \
                       GATE_HELD(0) && GATE_HELD(1) && GATE_HELD(2))
#define GATE_ONCE_OK (outcomes[0] <= 1 && outcomes[1] <= 1 && outcomes[2] <= 1 && outcomes[3] <= 1)
#define GATE_UPSTREAM_OK (h_gate_early == 0)
#define CKPT_J(j) (ckpt_count[j] <= 1 && step_effect[j] == ckpt_count[j])
#define CKPT_OK (h_stale_step == 0 && CKPT_J(0) && CKPT_J(1) && CKPT_J(2) && CKPT_J(3))
#define GATES_OK (GATE_NEVER_OK && GATE_ONCE_OK && GATE_UPSTREAM_OK && CKPT_OK)

#define OPERATOR_OK (h_operator == 0)
/* unique jobs, written out (not through INDEXED): at most one keyed job in
 * the blocking states; no call answered while none held the key; no
 * replace of a job that had started                                      */
#define HOLDS(x) (KEYED(x) && (jstate[x] == BLOCKED || jstate[x] == AVAILABLE || jstate[x] == RUNNING))
#define HELD_BY_OTHER(j) (((j) != 0 && HOLDS(0)) || ((j) != 1 && HOLDS(1)) || \
                          ((j) != 2 && HOLDS(2)) || ((j) != 3 && HOLDS(3)))
#define UNIQUE_OK ((HOLDS(0) + HOLDS(1) + HOLDS(2) + HOLDS(3)) <= 1)
#define DUP_OK (h_fold == 0)
#define REPLACE_OK (h_replace == 0)
/* a job with a cancel request never ends completed */
#define NOT_DONE_J(j) (!cancel_req[j] || jstate[j] != COMPLETED)
#define CANCEL_OK (h_cancelled_effect == 0 && h_rerun == 0 && \
                   NOT_DONE_J(0) && NOT_DONE_J(1) && NOT_DONE_J(2) && NOT_DONE_J(3))
#define TICKS_OK (cron_jobs[0] <= 1 && cron_jobs[MAX_TICK] <= 1 && \
                  (MAX_TICK < 2 || cron_jobs[1] <= 1) && (MAX_TICK < 3 || cron_jobs[2] <= 1))

/* flow control, written out (not through CLAIM_LIMITED's count): running
 * rows of the queue, of its one key, and starts in the window (ghost)    */
#define L_RUN(x) (LIMITED(x) && jstate[x] == RUNNING)
#define LIMIT_OK (C_LIMIT == 0 || L_RUN(0) + L_RUN(1) + L_RUN(2) + L_RUN(3) <= C_LIMIT)
#define L_KEY_RUN(x) (L_RUN(x) && LKEY(x) == 1)
#define KEY_LIMIT_OK (K_LIMIT == 0 || L_KEY_RUN(0) + L_KEY_RUN(1) + L_KEY_RUN(2) + L_KEY_RUN(3) <= K_LIMIT)
#define RATE_OK (R_LIMIT == 0 || g_win <= R_LIMIT)

#define DONE_J(j) (FINAL(jstate[j]) || jstate[j] == PRUNED || jstate[j] == ABSENT)
#define ALL_FINAL (DONE_J(0) && DONE_J(1) && DONE_J(2) && DONE_J(3))
#define ALL_TICKS (MAX_TICK == 0 || (cron_jobs[1] >= 1 && (MAX_TICK < 2 || cron_jobs[2] >= 1) \
                   && (MAX_TICK < 3 || cron_jobs[3] >= 1)))

/* ---------------- helpers ---------------------------------------------- */

/* a write of slot k about job j landed: it must come from the lease holder */
inline landed(k, j) {
  if
  :: holder[j] != v_gid[k] -> h_stale++
  :: else -> skip
  fi
}

/* the attempt's own write ended its lease */
inline end_lease(k, j) {
  expired[j] = false;
  holder[j] = 0;
  if
  :: live[j] == v_gid[k] -> live[j] = 0
  :: else -> skip
  fi
}

inline clear_slot(k) {
  v_job[k] = NOJOB; v_tok[k] = 0; v_gid[k] = 0; v_phase[k] = 0; v_told[k] = false; v_iso[k] = false;
  g_was_iso[k] = false; v_decl[k] = false
}

/* slot k forgets its attempt.  Worker 0's two slots are interchangeable, so
 * occupied slots come first (a symmetry reduction only).                   */
inline forget(k) {
  if
  :: k == 0 ->
       v_job[0] = v_job[1]; v_tok[0] = v_tok[1]; v_gid[0] = v_gid[1];
       v_phase[0] = v_phase[1]; v_told[0] = v_told[1]; v_iso[0] = v_iso[1];
       g_was_iso[0] = g_was_iso[1]; v_decl[0] = v_decl[1];
       clear_slot(1)
  :: else -> clear_slot(k)
  fi
}

/* a job left blocked for available: were its dependencies done? */
inline check_wait(x) {
  if
  :: UNSAT_COUNT(x) > 0 -> h_early++
  :: else -> skip
  fi
}

/* UNBLOCK: in the transaction of a COMPLETE that wrote job j */
inline unblock(j) {
  x = 0;
  do
  :: x < NJ ->
       if
       :: jstate[x] == BLOCKED && DEP(x, j) ->
            DECREMENT(x);
            if
            :: pending[x] == 0 && !GATE_WAITS(x) ->
                 jstate[x] = AVAILABLE; check_wait(x);
                 if :: !(jstate[j] == COMPLETED && g_fenced) -> h_unfenced++ :: else -> skip fi
            :: else -> skip
            fi
       :: else -> skip
       fi;
       x++
  :: else -> break
  od;
  x = 0
}

/* CANCEL_DEPENDENTS: job j became failed, dead or cancelled.  Dependents
 * with policy 'cancel' are cancelled, naming the dependency, transitively;
 * those with policy 'run' are decremented.  Jobs are numbered so that
 * dependencies come first, so one pass in order is the closure.           */
inline cancel_dependents(j) {
  nf = (1 << j);                /* jobs final in this statement */
  x = 0;
  do
  :: x < NJ ->
       if
       :: jstate[x] == BLOCKED && x != j ->
            d = 0; n = 0;
            do
            :: d < NJ -> if :: DEP(x, d) && (nf & (1 << d)) -> n++; c = d :: else -> skip fi; d++
            :: else -> break
            od;
            if
            :: n > 0 && RUN_ANYWAY(x) ->
                 pending[x] = pending[x] - n;
                 if
                 :: pending[x] == 0 && !GATE_WAITS(x) -> jstate[x] = AVAILABLE; check_wait(x)
                 :: else -> skip
                 fi
            :: n > 0 && !RUN_ANYWAY(x) ->
                 jstate[x] = CANCELLED; cause[x] = c; nf = nf | (1 << x);
                 if :: !DOOMED(jstate[c]) -> h_cause++ :: else -> skip fi
            :: else -> skip
            fi
       :: else -> skip
       fi;
       x++
  :: else -> break
  od;
  x = 0; d = 0; n = 0; c = 0; nf = 0
}

/* the statement moves job j to state st, with UNBLOCK or CANCEL_DEPENDENTS */
inline settle(j, st) {
  jstate[j] = st;
  if
  :: st == COMPLETED -> unblock(j)
  :: DOOMED(st) -> cancel_dependents(j)
  :: else -> skip
  fi
}

/* REBLOCK_DEPENDENTS, after REQUEUE in its transaction, as the code runs
 * them.  REQUEUE makes job j blocked when it has dependencies, else
 * available.  REBLOCK_DEPENDENTS runs one statement per level (frontier nf,
 * jobs written so far rq): the candidates are the blocked jobs of the
 * frontier, and its dependents that have policy 'run' and have not started
 * (RUN_WAITS) or were cancelled because of a dependency (cause: their last
 * error is DependencyFailed); each is counted from the states before the
 * statement (n unfinished, c unsettled) and written if blocked, a 'run' one
 * not started, or cancelled with no dependency failed, dead or cancelled:
 * pending = c ('run') or n, blocked while above 0, else available.  The
 * next frontier is what the statement wrote that no level had written.    */
#define DEP_IN(x, m) ((DEP(x, 0) && ((m) & 1)) || (DEP(x, 1) && ((m) & 2)) || \
                      (DEP(x, 2) && ((m) & 4)) || (DEP(x, 3) && ((m) & 8)))
#define REBLOCK_CANDIDATE(x, m) ((((m) & (1 << (x))) && jstate[x] == BLOCKED) || \
    (DEP_IN(x, m) && ((RUN_ANYWAY(x) && RUN_WAITS(jstate[x])) || \
                      (jstate[x] == CANCELLED && cause[x] != NOJOB))))
#define REBLOCK_WRITES(x, n, c) (jstate[x] == BLOCKED || (RUN_ANYWAY(x) && RUN_WAITS(jstate[x])) || \
    (jstate[x] == CANCELLED && (RUN_ANYWAY(x) || (n) == (c))))
#define HAS_DEPS(j) (DEP(j, 0) || DEP(j, 1) || DEP(j, 2) || DEP(j, 3))
inline requeue(j) {
  jstate[j] = (HAS_DEPS(j) -> BLOCKED : AVAILABLE); cause[j] = NOJOB;
  if :: GATE(j) -> jstate[j] = BLOCKED; outcomes[j] = 0 :: else -> skip fi;  /* a gate waits again */
  attempt[j] = 0; isolated[j] = false; cancel_req[j] = false;
  nf = (1 << j); rq = nf;
  do
  :: nf != 0 ->
       up = 0; x = 0;
       do
       :: x < NJ ->
            if
            :: REBLOCK_CANDIDATE(x, nf) ->
                 d = 0; n = 0; c = 0;
                 do
                 :: d < NJ ->
                      if :: DEP(x, d) && jstate[d] != COMPLETED -> n++ :: else -> skip fi;
                      if :: DEP(x, d) && !FINAL(jstate[d]) -> c++ :: else -> skip fi;
                      d++
                 :: else -> break
                 od;
                 if
                 :: REBLOCK_WRITES(x, n, c) -> up = up | (1 << x); count[x] = (RUN_ANYWAY(x) -> c : n)
                 :: else -> skip
                 fi
            :: else -> skip
            fi;
            x++
       :: else -> break
       od;
       x = 0;
       do
       :: x < NJ ->
            if
            :: (up & (1 << x)) ->
                 if :: x != j && jstate[x] == CANCELLED && cause[x] == NOJOB -> h_operator++ :: else -> skip fi;
                 pending[x] = count[x]; jstate[x] = (count[x] > 0 || GATE(x) -> BLOCKED : AVAILABLE);
                 cause[x] = NOJOB; count[x] = 0
            :: else -> skip
            fi;
            x++
       :: else -> break
       od;
       nf = up & ~rq; rq = rq | up
  :: else -> break
  od;
  x = 0; d = 0; n = 0; c = 0; nf = 0; rq = 0; up = 0
}

/* a claim hands job j to slot k of worker w */
inline claimed(w, k, j, iso) {
  if :: live[j] != 0 -> h_double++ :: else -> skip fi;
  if :: cancel_req[j] -> h_rerun++ :: else -> skip fi;
  if :: isolated[j] && !iso -> h_iso_claim++ :: else -> skip fi;
#ifdef LIMITS
  if :: LIMITED(j) -> g_win++ :: else -> skip fi;   /* ghost: only with -DLIMITS, so */
#endif                                             /* other runs keep their depths */
  jstate[j] = RUNNING; attempt[j]++; owner[j] = w; NEW_TOKEN(j); expired[j] = false;
  claims[j]++; holder[j] = claims[j]; live[j] = claims[j];
  v_job[k] = j; v_tok[k] = version[j]; v_gid[k] = claims[j];
  v_phase[k] = START_PHASE; v_told[k] = false; v_iso[k] = iso; g_was_iso[k] = isolated[j];
  v_decl[k] = !ISOLATION_ON;
  printf("CLAIM      worker %d slot %d job %d token %d\n", w, k, j, version[j])
}

/* worker w's process dies (kill -9, or slot ck's handler, ck < NK): each
 * lease in its row stays with that dead row until REAP, which reads the
 * row's may_start; the restarted process has a row of its own, empty     */
inline orphan_leases(w, ck) {
  if
  :: ISOLATION_ON ->
       x = 0;
       do
       :: x < NJ ->
            if
            :: jstate[x] == RUNNING && owner[x] == w && (orphan[x] & O_DEAD) == 0 ->
                 orphan[x] = O_DEAD;
                 if :: IN_LIST(w, x) -> orphan[x] = orphan[x] | O_LISTED :: else -> skip fi;
                 q = (w == 0 -> 0 : 2);
                 do
                 :: q < NK && WORKER(q) == w ->
                      if
                      :: v_job[q] == x && v_gid[q] == holder[x] && (v_phase[q] != P_CLAIMED || q == ck) ->
                           orphan[x] = orphan[x] | O_RAN
                      :: else -> skip
                      fi;
                      q++
                 :: else -> break
                 od;
                 q = 0;
                 if :: ck < NK && v_job[ck] != x -> orphan[x] = orphan[x] | O_VICTIM :: else -> skip fi
            :: else -> skip
            fi;
            x++
       :: else -> break
       od;
       x = 0; may_start[w] = 0
  :: else -> skip
  fi
}

/* kill -9 of worker w: its beliefs go, its open transactions roll back */
inline crash_worker(w) {
  q = (w == 0 -> 0 : 2);
  do
  :: q < NK && WORKER(q) == w ->
       if
       :: v_job[q] != NOJOB && locked[v_job[q]] == v_gid[q] && v_gid[q] != 0 -> locked[v_job[q]] = 0
       :: else -> skip
       fi;
       clear_slot(q); q++
  :: else -> break
  od;
  q = 0;
  frozen[w] = false; seen[w] = 0; expect[w] = 0
}

/* ---------------- worker actions --------------------------------------- */

/* CLAIM: UPDATE ... SET state='running', attempt+1, lease_owner=w,
 * lease_version+1, lease_expires_at=now()+lease FROM (SELECT ... WHERE
 * state='available' AND NOT isolated ... FOR UPDATE SKIP P_LOCKED)          */
#define CLAIM_W0(j) \
  :: atomic { !frozen[0] && v_job[1] == NOJOB && CLAIMABLE(j) && CLAIM_SKIPS(j) -> \
       k = (v_job[0] == NOJOB -> 0 : 1); claimed(0, k, j, false); k = 0 }
#define CLAIM_W1(j) \
  :: atomic { !frozen[1] && v_job[2] == NOJOB && CLAIMABLE(j) && CLAIM_SKIPS(j) -> claimed(1, 2, j, false) }

/* CLAIM_ISOLATED: the same for one isolated job, for a worker that holds no
 * other isolated job and no claimed job it has not started                */
#define CLAIM_ISOLATED_W0(j) \
  :: atomic { !frozen[0] && v_job[1] == NOJOB && jstate[j] == AVAILABLE && isolated[j] && ALONE(0) && \
              CLAIM_SKIPS(j) -> \
       k = (v_job[0] == NOJOB -> 0 : 1); claimed(0, k, j, true); k = 0 }
#define CLAIM_ISOLATED_W1(j) \
  :: atomic { !frozen[1] && v_job[2] == NOJOB && jstate[j] == AVAILABLE && isolated[j] && ALONE(1) && \
              CLAIM_SKIPS(j) -> \
       claimed(1, 2, j, true) }

/* CLAIM_LIMITED: the claim of a queue with limits, in the worker's
 * transaction: SELECT ... FROM conveyor_queue FOR NO KEY UPDATE, then a
 * second statement, whose snapshot is taken after that lock is granted: it counts
 * the queue's running rows and those per key, reads the rate log, claims
 * jobs i and j (i == j: one) as CLAIM does, each with a new token, within
 * least(batch, concurrency - running, rate - logged) and key_concurrency -
 * running per key, and appends its count to the rate log.  Claims of one
 * queue serialize on its row lock: one step.  Worker 0 claims one job or
 * two (its free slots, or one claimed ahead: the batch is the worker's
 * choice, the limits are the statement's); worker 1 one.                  */
#define CLAIM_LIMITED_W0(i, j) \
  :: atomic { !frozen[0] && ((i) == (j) -> v_job[1] == NOJOB : v_job[0] == NOJOB) && \
              LIMITED_TAKES(0, i, j) -> \
       k = (v_job[0] == NOJOB -> 0 : 1); claimed(0, k, i, isolated[i]); \
       if :: (i) != (j) -> claimed(0, 1, j, false) :: else -> skip fi; \
       RATE_LOG(BATCH(i, j)); k = 0 }
#define CLAIM_LIMITED_W1(j) \
  :: atomic { !frozen[1] && v_job[2] == NOJOB && LIMITED_TAKES(1, j, j) -> \
       claimed(1, 2, j, isolated[j]); RATE_LOG(1) }

/* HEARTBEAT: UPDATE ... SET lease_expires_at = now()+lease WHERE id, state,
 * lease_owner, lease_version (SKIP P_LOCKED: the slot's own locked row is
 * neither renewed nor lost), reporting cancel requests.  Zero rows: lost.
 * A renewal that changes nothing is a stuttering step and is left out.
 * RENEWAL is the statement with its own guard (GUARD, a macro's name) and
 * the slot phases that send it (PHASE_OK); HEARTBEAT_PROGRESS shares it.  */
#define RENEWAL(w, k, GUARD, PHASE_OK) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && PHASE_OK && \
              (!GUARD(k, v_job[k]) || \
               ((expired[v_job[k]] || live[v_job[k]] != v_gid[k]) && MAY_RENEW) || \
               (cancel_req[v_job[k]] && !v_told[k])) -> \
       j = v_job[k]; \
       if \
       :: GUARD(k, j) -> \
            landed(k, j); \
            if :: expired[j] || live[j] != v_gid[k] -> COUNT_RENEWAL :: else -> skip fi; \
            expired[j] = false; live[j] = v_gid[k]; v_told[k] = cancel_req[j] \
       :: else -> forget(k) \
       fi; j = 0 }
#define HEARTBEAT(w, k) RENEWAL(w, k, GUARD_HEARTBEAT, \
  (v_phase[k] == P_CLAIMED || v_phase[k] == P_RUN || v_phase[k] == P_ABORTED))

/* ---------------- progress (issue 24) ---------------------------------- */

/* HEARTBEAT_PROGRESS: HEARTBEAT that also writes the progress the slot's
 * running handler reported since the last beat (context.set_progress), in
 * the same statement and under the same fence; the worker sends it instead
 * of HEARTBEAT when a handler reported progress.  Only a running handler
 * reports (P_RUN, or P_ABORTED: its guarded transaction was ended and it
 * goes on).  The progress column is not modelled: its write lands exactly
 * when the renewal does, and fenced_writes judges it (landed).            */
#define GUARD_HEARTBEAT_PROGRESS(k, j) FENCE(k, j)
#define HEARTBEAT_PROGRESS(w, k) RENEWAL(w, k, GUARD_HEARTBEAT_PROGRESS, \
  (v_phase[k] == P_RUN || v_phase[k] == P_ABORTED))

/* LOCK_FOR_EFFECT: SELECT ... FOR UPDATE WHERE id, state, owner, version,
 * no cancel request; the lock is held until the transaction ends.  Zero
 * rows: LeaseLost, nothing committed, no outcome written.                 */
#define LOCK_FOR_EFFECT(w, k) \
  :: atomic { ATOMIC_PATH && !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_RUN && \
              (!GUARD_LOCK(k, v_job[k]) || locked[v_job[k]] == 0) -> \
       j = v_job[k]; \
       if \
       :: GUARD_LOCK(k, j) -> landed(k, j); locked[j] = v_gid[k]; v_phase[k] = P_LOCKED \
       :: else -> forget(k) \
       fi; j = 0 }

/* Effect: the handler's business row and ledger row, uncommitted, inside
 * the guarded transaction.  The ledger's unique (job, effect key): once a
 * row is committed, the insert raises and the attempt can only roll back. */
#if EFFECT_COMMITS_ALONE
#define EFFECT(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_RUN && ledger[v_job[k]] == 0 -> \
       j = v_job[k]; ledger[j] = v_gid[k]; \
       if :: business[j] < 2 -> business[j]++ :: else -> skip fi; j = 0 }
#else
#define EFFECT(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_LOCKED && ledger[v_job[k]] == 0 -> \
       v_phase[k] = P_EFFECT }
#endif

/* COMPLETE: UPDATE ... SET state='completed' WHERE id, state, owner,
 * version, no cancel request (lease_owner kept), with UNBLOCK, from the
 * batch (the handler returned) or as the guarded commit with the effect;
 * zero rows there roll the effect back.  A batch completion refused for a
 * cancel request is followed, in its transaction, by the holder's
 * CANCEL_HELD: the job ends cancelled, with CANCEL_DEPENDENTS.            */
inline complete(w, k) {
  j = v_job[k];
  if
  :: GUARD_COMPLETE(k, j) ->
       landed(k, j);
       if :: v_phase[k] == P_EFFECT && cancel_req[j] -> h_cancelled_effect++ :: else -> skip fi;
       g_fenced = (holder[j] == v_gid[k]);
       settle(j, COMPLETED);
       g_fenced = false;
       end_lease(k, j); completer[j] = v_gid[k]; isolated[j] = false;
       if
       :: v_phase[k] == P_EFFECT ->
            ledger[j] = v_gid[k];
            if :: business[j] < 2 -> business[j]++ :: else -> skip fi;
            locked[j] = 0; v_phase[k] = P_DONE
       :: else -> forget(k)
       fi
  :: !GUARD_COMPLETE(k, j) && v_phase[k] != P_EFFECT && GUARD_CANCEL_HELD(k, j) ->
       landed(k, j); settle(j, CANCELLED); owner[j] = NOBODY; end_lease(k, j); isolated[j] = false;
       forget(k)
  :: else ->
       UNBLOCK_IF_REFUSED(j);
       if :: v_phase[k] == P_EFFECT -> locked[j] = 0 :: else -> skip fi;
       forget(k)
  fi;
  printf("COMPLETE   worker %d slot %d job %d token %d -> state %d stale %d\n", w, k, j, v_tok[k], jstate[j], h_stale);
  j = 0
}
#define COMPLETE(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && (v_phase[k] == P_RUN || v_phase[k] == P_EFFECT) -> \
       complete(w, k) }

/* RECORD_RESULT: UPDATE ... SET return_value WHERE id, state='completed',
 * owner, version: after the guarded commit                               */
#define RECORD_RESULT(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_DONE -> \
       j = v_job[k]; \
       if :: GUARD_RECORD(k, j) && completer[j] != v_gid[k] -> h_stale++ :: else -> skip fi; \
       forget(k); j = 0 }

/* the slot's transaction (if any) rolls back and releases the row lock */
inline rollback(k, j) {
  if :: locked[j] == v_gid[k] -> locked[j] = 0 :: else -> skip fi
}

/* RETRY: UPDATE ... SET state = dead or available (or cancelled after a
 * cancel request), lease_owner = NULL, isolated = false WHERE id, state,
 * owner, version; CANCEL_DEPENDENTS when the job is dead or cancelled.    */
inline retry(w, k) {
  j = v_job[k]; rollback(k, j);
  if
  :: GUARD_RETRY(k, j) ->
       landed(k, j); s = HANDBACK(j, AFTER_FAILURE(j)); settle(j, s);
       owner[j] = NOBODY; end_lease(k, j); isolated[j] = false
  :: else -> skip
  fi;
  printf("RETRY      worker %d slot %d job %d token %d -> state %d stale %d\n", w, k, j, v_tok[k], jstate[j], h_stale);
  forget(k); j = 0; s = 0
}
#define RETRY(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] >= P_RUN && v_phase[k] <= P_ABORTED -> retry(w, k) }

/* FAIL: UPDATE ... SET state = 'failed', lease_owner = NULL, isolated =
 * false WHERE id, state, owner, version; with CANCEL_DEPENDENTS           */
inline fail(w, k) {
  j = v_job[k]; rollback(k, j);
  if
  :: GUARD_FAIL(k, j) ->
       landed(k, j); settle(j, FAILED); owner[j] = NOBODY; end_lease(k, j); isolated[j] = false
  :: else ->
       CASCADE_IF_REFUSED(j)
  fi;
  forget(k); j = 0
}
#define FAIL(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] >= P_RUN && v_phase[k] <= P_ABORTED -> fail(w, k) }

/* SNOOZE: UPDATE ... SET state = 'available', attempt - 1, lease_owner =
 * NULL, isolated = false WHERE id, state, owner, version                 */
inline snooze(w, k) {
  snoozes_left--; j = v_job[k]; rollback(k, j);
  if
  :: GUARD_SNOOZE(k, j) ->
       landed(k, j); s = HANDBACK(j, AVAILABLE); settle(j, s); attempt[j]--;
       owner[j] = NOBODY; end_lease(k, j); isolated[j] = false
  :: else -> skip
  fi;
  forget(k); j = 0; s = 0
}
#define SNOOZE(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] >= P_RUN && v_phase[k] <= P_EFFECT && \
              snoozes_left > 0 -> snooze(w, k) }

/* RELEASE: graceful shutdown: UPDATE ... SET state = 'available', attempt
 * - 1, lease_owner = NULL WHERE id, state, owner, version (isolated kept; a
 * row locked by the slot's own transaction would make it wait)           */
inline release(w, k) {
  releases_left--; j = v_job[k];
  if
  :: GUARD_RELEASE(k, j) ->
       landed(k, j); s = HANDBACK(j, AVAILABLE); settle(j, s); attempt[j]--;
       owner[j] = NOBODY; end_lease(k, j)
  :: else -> skip
  fi;
  forget(k); j = 0; s = 0
}
#define RELEASE(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && releases_left > 0 && \
              (v_phase[k] == P_CLAIMED || v_phase[k] == P_RUN || v_phase[k] == P_ABORTED) -> release(w, k) }

/* CANCEL_HELD: the worker was told of a cancel request: UPDATE ... SET
 * state = 'cancelled', lease_owner = NULL WHERE id, state, owner, version,
 * with CANCEL_DEPENDENTS                                                 */
inline cancel_held(w, k) {
  j = v_job[k];
  if
  :: GUARD_CANCEL_HELD(k, j) ->
       landed(k, j); settle(j, CANCELLED); owner[j] = NOBODY; end_lease(k, j); isolated[j] = false
  :: else -> skip
  fi;
  forget(k); j = 0
}
#define CANCEL_HELD(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_told[k] && \
              (v_phase[k] == P_CLAIMED || v_phase[k] == P_RUN || v_phase[k] == P_ABORTED) -> cancel_held(w, k) }

/* DECLARE_STARTS: UPDATE conveyor_worker SET may_start = <the jobs of its
 * declared attempts and this one> WHERE id = w; then, in the same
 * transaction, a read of the job's row: lease still this attempt's (state,
 * owner, version)?  Declared; else the attempt is dropped unstarted.  REAP
 * locks the owners' rows FOR SHARE: one step.                            */
#define DECLARE_STARTS(w, k) \
  :: atomic { ISOLATION_ON && !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_CLAIMED && !v_decl[k] -> \
       j = v_job[k]; may_start[w] = DECLARED(w) | (1 << j); \
       if \
       :: GUARD_DECLARE_STARTS(k, j) -> v_decl[k] = true \
       :: else -> forget(k) \
       fi; j = 0 }

/* Start: a claimed job it has declared goes to a handler; a crasher kills
 * the worker, and every other attempt it holds is lost with it (REAP
 * charges those its row lists)                                            */
inline start(w, k) {
  j = v_job[k];
  if
  :: CRASHER(j) ->
       orphan_leases(w, k);
       crash_worker(w);
       printf("Start      worker %d job %d: the handler kills the worker\n", w, j)
  :: else -> v_phase[k] = P_RUN
  fi;
  j = 0
}
#define START(w, k) \
  :: atomic { !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_CLAIMED && v_decl[k] -> start(w, k) }

/* CRON_ENQUEUE: guarded by the schedule row as read (next_tick_at = what the
 * scheduler saw, FOR UPDATE SKIP LOCKED): INSERT the tick's job, key
 * 'cron:<name>:<tick>', ON CONFLICT DO NOTHING, and advance the row        */
#define CRON_ENQUEUE(w) \
  :: atomic { !frozen[w] && seen[w] != 0 -> \
       if \
       :: next_tick == expect[w] -> INSERT_TICK(seen[w]); next_tick = seen[w] + 1 \
       :: else -> skip \
       fi; \
       seen[w] = 0; expect[w] = 0 }
/* a scheduler pass reads the schedule row and picks the next due tick */
#define SCHEDULER_READ(w) \
  :: atomic { !frozen[w] && seen[w] == 0 && next_tick <= now -> seen[w] = next_tick; expect[w] = next_tick }

/* CHECKPOINT: context.checkpoint(name, fn) found no record of its step (a
 * plain read of the ledger); one guarded transaction: LOCK_FOR_EFFECT
 * (FOR UPDATE, fenced, no cancel request), fn's writes, INSERT INTO
 * conveyor_ledger (job, 'checkpoint:<name>', value, token) SELECT ... WHERE
 * <the fence> ON CONFLICT DO NOTHING, one commit; the job stays running.
 * The row lock covers the whole transaction, so it is one step.  The lock
 * refused: LeaseLost, nothing commits, the attempt ends without an outcome. */
inline checkpoint(w, k) {
  j = v_job[k];
  if
  :: GUARD_CHECKPOINT(k, j) ->
       if
       :: CKPT_UNIQUE(j) ->
            if :: holder[j] != v_gid[k] -> h_stale_step++ :: else -> skip fi;
            ckpt[j] = v_gid[k];
            if :: ckpt_count[j] < 2 -> ckpt_count[j]++ :: else -> skip fi;
            if :: step_effect[j] < 2 -> step_effect[j]++ :: else -> skip fi
       :: else -> skip
       fi
  :: else -> forget(k)
  fi;
  printf("CHECKPOINT worker %d slot %d job %d token %d\n", w, k, j, v_tok[k]);
  j = 0
}
#define CHECKPOINT(w, k) \
  :: atomic { CHECKPOINTS_ON && !frozen[w] && v_job[k] != NOJOB && v_phase[k] == P_RUN && \
              CKPT_READ(v_job[k]) && (!GUARD_CHECKPOINT(k, v_job[k]) || locked[v_job[k]] == 0) -> \
       checkpoint(w, k) }

#define SLOT(w, k) HEARTBEAT(w, k) LOCK_FOR_EFFECT(w, k) EFFECT(w, k) COMPLETE(w, k) \
  RECORD_RESULT(w, k) RETRY(w, k) FAIL(w, k) SNOOZE(w, k) RELEASE(w, k) CANCEL_HELD(w, k) START(w, k) \
  DECLARE_STARTS(w, k) \
  CHECKPOINT(w, k) HEARTBEAT_PROGRESS(w, k)

proctype Worker0() {
  byte j = 0; byte k = 0; byte x = 0; byte d = 0; byte n = 0; byte c = 0; byte nf = 0; byte s = 0; byte q = 0;
end_loop:
  do
  CLAIM_W0(0) CLAIM_W0(1) CLAIM_W0(2) CLAIM_W0(3)
#ifdef ISOLATION
  CLAIM_ISOLATED_W0(0) CLAIM_ISOLATED_W0(1)
#endif
#ifdef LIMITS
  CLAIM_LIMITED_W0(0, 0) CLAIM_LIMITED_W0(1, 1) CLAIM_LIMITED_W0(2, 2) CLAIM_LIMITED_W0(3, 3)
  CLAIM_LIMITED_W0(0, 1) CLAIM_LIMITED_W0(0, 2) CLAIM_LIMITED_W0(0, 3)
  CLAIM_LIMITED_W0(1, 2) CLAIM_LIMITED_W0(1, 3) CLAIM_LIMITED_W0(2, 3)
#endif
  SLOT(0, 0)
  SLOT(0, 1)
#ifdef CRON
  SCHEDULER_READ(0) CRON_ENQUEUE(0)
#endif
  od
}

proctype Worker1() {
  byte j = 0; byte k = 0; byte x = 0; byte d = 0; byte n = 0; byte c = 0; byte nf = 0; byte s = 0; byte q = 0;
end_loop:
  do
  CLAIM_W1(0) CLAIM_W1(1) CLAIM_W1(2) CLAIM_W1(3)
#ifdef ISOLATION
  CLAIM_ISOLATED_W1(0) CLAIM_ISOLATED_W1(1)
#endif
#ifdef LIMITS
  CLAIM_LIMITED_W1(0) CLAIM_LIMITED_W1(1) CLAIM_LIMITED_W1(2) CLAIM_LIMITED_W1(3)
#endif
  SLOT(1, 2)
#ifdef CRON
  SCHEDULER_READ(1) CRON_ENQUEUE(1)
#endif
  od
}

/* ---------------- the reaper and the environment ----------------------- */

/* REAP: UPDATE ... SET state = cancelled (cancel request) / dead / available
 * (isolated), lease_owner = NULL WHERE state='running' AND lease_expires_at
 * < now() FOR UPDATE SKIP P_LOCKED, the owners' rows FOR SHARE;
 * CANCEL_DEPENDENTS when dead/cancelled.  A job its owner's row does not
 * list never started: cancelled or available as it was (isolated kept),
 * attempt - 1, at most MAX_ATTEMPTS times (refunds).  Ghost: a charged
 * attempt lost to another job's crash counts in lost_to; a give-back of an
 * attempt whose handler started counts in h_refund_ran.                  */
#define REAP(j) \
  :: atomic { REAP_GUARD(j) -> \
       if \
       :: REAP_STARTED(j) -> \
            s = REAP_STATE(j); settle(j, s); \
            if :: ISOLATION_ON && REAP_ISOLATES && s == AVAILABLE -> isolated[j] = true :: else -> skip fi; \
            if :: (orphan[j] & O_VICTIM) && lost_to[j] < 2 -> lost_to[j]++ :: else -> skip fi \
       :: else -> \
            if :: RAN(j) -> h_refund_ran++ :: else -> skip fi; \
            s = HANDBACK(j, AVAILABLE); settle(j, s); attempt[j]--; refunds[j]++; \
            if :: s == CANCELLED -> isolated[j] = false :: else -> skip fi \
       fi; \
       orphan[j] = 0; \
       owner[j] = NOBODY; expired[j] = false; holder[j] = 0; \
       printf("REAP       job %d -> state %d\n", j, jstate[j]); s = 0 }

/* Tick: time passes a lease's expiry */
#define TICK(j) \
  :: atomic { jstate[j] == RUNNING && !expired[j] -> expired[j] = true; live[j] = 0; \
       printf("Tick       lease of job %d expired\n", j) }

/* TxnTimeout: PostgreSQL ends the guarded transaction of slot k, whose
 * session stayed idle (idle_in_transaction_session_timeout) or whose
 * statement ran too long (statement_timeout): the lock is released, the
 * effect discarded; the worker finds out when it next uses the connection */
#define TXN_TIMEOUT(k) \
  :: atomic { TXN_BOUND && v_job[k] != NOJOB && (v_phase[k] == P_LOCKED || v_phase[k] == P_EFFECT) -> \
       if :: locked[v_job[k]] == v_gid[k] -> locked[v_job[k]] = 0 :: else -> skip fi; \
       v_phase[k] = P_ABORTED; printf("TxnTimeout slot %d\n", k) }

/* Crash: kill -9 and an immediate restart */
#define CRASH(w) \
  :: atomic { crashes_left > 0 -> crashes_left--; orphan_leases(w, NK); crash_worker(w); forever[w] = false; \
       printf("Crash      worker %d\n", w) }

/* Freeze: SIGSTOP, continued later (Thaw) or never */
#define FREEZE(w) \
  :: atomic { freezes_left > 0 && !frozen[w] -> freezes_left--; frozen[w] = true; \
       printf("Freeze     worker %d\n", w) }
#define FREEZE_FOREVER(w) \
  :: atomic { freezes_left > 0 && !frozen[w] -> freezes_left--; frozen[w] = true; forever[w] = true; \
       printf("Freeze     worker %d for ever\n", w) }
#define THAW(w) \
  :: atomic { frozen[w] && !forever[w] -> frozen[w] = false; printf("Thaw       worker %d\n", w) }

/* NewWindow: time passes into a new window of the rate; the claims logged
 * in the old one no longer count (the code's window slides)               */
#define NEW_WINDOW \
  :: atomic { R_LIMIT > 0 && (rate_log > 0 || g_win > 0) -> rate_log = 0; g_win = 0 }

/* Clock: time reaches the next tick of the schedule */
#define CLOCK :: atomic { now < MAX_TICK -> now++ }
/* CronSync: the settings sync (or an admin edit) recomputes next_tick_at,
 * back to a tick whose job exists: then only the key holds                */
#define CRON_SYNC :: atomic { syncs_left > 0 && next_tick > 1 -> syncs_left--; \
       if :: next_tick = 1 :: next_tick > 2 -> next_tick = 2 :: next_tick > 3 -> next_tick = 3 fi }

proctype World() {
  byte j = 0; byte k = 0; byte x = 0; byte d = 0; byte n = 0; byte c = 0; byte nf = 0; byte s = 0; byte q = 0;
end_loop:
  do
  REAP(0) REAP(1) REAP(2) REAP(3)
  TICK(0) TICK(1) TICK(2) TICK(3)
  TXN_TIMEOUT(0) TXN_TIMEOUT(1) TXN_TIMEOUT(2)
  CRASH(0) CRASH(1)
  FREEZE(0) FREEZE(1) FREEZE_FOREVER(0) FREEZE_FOREVER(1)
  THAW(0) THAW(1)
  CLOCK CRON_SYNC
#ifdef LIMITS
  NEW_WINDOW
#endif
  od
}

/* ---------------- operators -------------------------------------------- */

/* REQUEUE: failed/dead/cancelled -> available or blocked, attempt 0, with
 * REBLOCK_DEPENDENTS; refused for a policy-'cancel' job whose dependency
 * failed (requeue that one instead), and for a keyed job whose key another
 * job holds                                                              */
#define DEPS_ALIVE(j) (RUN_ANYWAY(j) || ((!DEP(j, 0) || !DOOMED(jstate[0])) && \
                       (!DEP(j, 1) || !DOOMED(jstate[1])) && (!DEP(j, 2) || !DOOMED(jstate[2]))))
#define REQUEUE(j) \
  :: atomic { requeues_left > 0 && DOOMED(jstate[j]) && DEPS_ALIVE(j) && !KEY_TAKEN(j) -> \
       requeues_left--; requeue(j); printf("REQUEUE    job %d -> state %d\n", j, jstate[j]) }

/* CANCEL: blocked/available -> cancelled, with CANCEL_DEPENDENTS */
#define CANCEL(j) \
  :: atomic { cancels_left > 0 && (jstate[j] == BLOCKED || jstate[j] == AVAILABLE) -> \
       cancels_left--; settle(j, CANCELLED) }

/* PRUNE: a final job and its ledger rows are deleted (not a dependency) */
#define PRUNE(j) \
  :: atomic { prunes_left > 0 && FINAL(jstate[j]) && !DEP(1, j) && !DEP(2, j) && !DEP(3, j) -> \
       prunes_left--; jstate[j] = PRUNED; ledger[j] = 0 }

/* REQUEST_CANCEL: a running job gets a cancel request (waits for its lock) */
#define REQUEST_CANCEL(j) \
  :: atomic { requests_left > 0 && jstate[j] == RUNNING && locked[j] == 0 && !cancel_req[j] -> \
       requests_left--; cancel_req[j] = true; printf("REQUEST_CANCEL job %d\n", j) }

/* ---------------- gates (issue 27) ------------------------------------ */

/* a gate's wait ends: completed, with UNBLOCK, or failed, with
 * CANCEL_DEPENDENTS, in the same statement                               */
inline gate_ends(g, st) {
  if :: UNSAT_COUNT(g) > 0 -> h_gate_early++ :: else -> skip fi;
  if :: outcomes[g] < 2 -> outcomes[g]++ :: else -> skip fi;
  g_fenced = true; settle(g, st); g_fenced = false;
  printf("gate       job %d -> state %d\n", g, jstate[g])
}

/* SIGNAL: send_signal(gate, name, payload) or a rejection: UPDATE ... SET
 * state = 'completed' (return_value = payload) or 'failed' WHERE id,
 * state = 'blocked', pending_dependencies = 0, the gate's kind and signal
 * name; zero rows: refused, nothing changes                              */
#define SIGNAL(g) \
  :: atomic { GATE(g) && signals_left > 0 -> signals_left--; \
       if \
       :: GUARD_SIGNAL(g) -> if :: s = COMPLETED :: s = FAILED fi; gate_ends(g, s); s = 0 \
       :: else -> skip \
       fi }

/* CONDITION_MET: the gates service found a row that matches a wait_until
 * gate's condition (under the gate's row lock, SKIP LOCKED): completed; or
 * the condition could not be evaluated: failed (ConditionInvalid)        */
#define CONDITION_MET(g) \
  :: atomic { GUARD_CONDITION_MET(g) -> \
       if :: s = COMPLETED :: s = FAILED fi; gate_ends(g, s); s = 0 }

/* GATE_TIMEOUT: the gates service, WHERE state = 'blocked' AND
 * gate_deadline <= now() (FOR UPDATE SKIP LOCKED): completed for a timer
 * or on_timeout 'continue', else failed                                  */
#define GATE_TIMEOUT(g) \
  :: atomic { GUARD_GATE_TIMEOUT(g) -> \
       s = (CONTINUE_ON_TIMEOUT(g) -> COMPLETED : FAILED); gate_ends(g, s); s = 0 }

proctype Gatekeeper() {
  byte j = 0; byte x = 0; byte d = 0; byte n = 0; byte c = 0; byte nf = 0; byte s = 0;
end_loop:
  do
  SIGNAL(0) SIGNAL(1) SIGNAL(2) SIGNAL(3)
  CONDITION_MET(0) CONDITION_MET(1) CONDITION_MET(2) CONDITION_MET(3)
  GATE_TIMEOUT(0) GATE_TIMEOUT(1) GATE_TIMEOUT(2) GATE_TIMEOUT(3)
  od
}

proctype Operator() {
  byte x = 0; byte d = 0; byte n = 0; byte c = 0; byte nf = 0;
end_loop:
  do
  REQUEUE(0) REQUEUE(1) REQUEUE(2) REQUEUE(3)
  CANCEL(0) CANCEL(1) CANCEL(2) CANCEL(3)
  PRUNE(0) PRUNE(1) PRUNE(2) PRUNE(3)
  REQUEST_CANCEL(0) REQUEST_CANCEL(1) REQUEST_CANCEL(2) REQUEST_CANCEL(3)
  od
}

/* ---------------- unique jobs: the callers ---------------------------- */

/* ENQUEUE of a keyed call: INSERT ... ON CONFLICT DO NOTHING; a row whose
 * key the unique index holds is not inserted, and the call goes on to its
 * next statement                                                         */
#define ENQUEUE_KEYED(j) \
  :: atomic { jstate[j] == ABSENT && ucall[j] == CALL_IDLE -> \
       if \
       :: KEY_TAKEN(j) -> ucall[j] = CALL_CONFLICT \
       :: else -> jstate[j] = AVAILABLE \
       fi; printf("ENQUEUE    call %d -> state %d call %d\n", j, jstate[j], ucall[j]) }

/* the call ends: folded into the job that holds its key (it must hold it),
 * or back to ENQUEUE, to be inserted now                                  */
#define ANSWER(j, fold) \
  if \
  :: (fold) -> ucall[j] = CALL_FOLDED; if :: !HELD_BY_OTHER(j) -> h_fold++ :: else -> skip fi \
  :: else -> ucall[j] = CALL_IDLE \
  fi

/* on_duplicate 'skip': the read of the job holding the key, a statement
 * of its own after the INSERT (FoldDuplicate)                             */
#define FOLD_DUPLICATE(j) \
  :: atomic { ucall[j] == CALL_CONFLICT && !REPLACING(j) -> ANSWER(j, KEY_TAKEN(j)) }

/* ENQUEUE_REPLACE: on_duplicate 'replace': UPDATE ... SET args, run_after
 * WHERE unique_key AND unique_states @> ARRAY[state] AND state IN
 * ('blocked', 'available'), re-checked under the row lock; then the key is
 * read again: a running holder is left alone, none and the call is
 * inserted again                                                          */
#define ENQUEUE_REPLACE(j) \
  :: atomic { ucall[j] == CALL_CONFLICT && REPLACING(j) -> \
       x = 0; \
       do \
       :: x < NJ -> \
            if \
            :: x != j && INDEXED(x) && REPLACE_GUARD(x) && \
               !(jstate[x] == BLOCKED || jstate[x] == AVAILABLE) -> h_replace++ \
            :: else -> skip \
            fi; x++ \
       :: else -> break \
       od; \
       x = 0; ANSWER(j, KEY_TAKEN(j)); \
       printf("ENQUEUE_REPLACE call %d -> call %d\n", j, ucall[j]) }

proctype Enqueuer() {
  byte x = 0;
end_loop:
  do
  ENQUEUE_KEYED(0) ENQUEUE_KEYED(1) ENQUEUE_KEYED(2)
  FOLD_DUPLICATE(0) FOLD_DUPLICATE(1) FOLD_DUPLICATE(2)
  ENQUEUE_REPLACE(0) ENQUEUE_REPLACE(1) ENQUEUE_REPLACE(2)
  od
}

/* ENQUEUE: INSERT INTO conveyor_job (state 'available', or 'blocked' with
 * pending_dependencies = its unfinished dependencies).  All jobs are
 * enqueued before the workers start, dependencies first (with -DUNIQUE
 * the Enqueuer makes the keyed calls while the workers run).              */
init {
  byte i = 0;
  atomic {
#ifndef UNIQUE
    do
    :: i < NJ ->
         pending[i] = UNSAT_COUNT(i);
         jstate[i] = (pending[i] > 0 || GATE(i) -> BLOCKED : AVAILABLE);
         i++
    :: else -> break
    od;
#else
    run Enqueuer();
#endif
    i = 0;
    run Worker0();
    run Worker1();
    run World();
    run Operator();
#ifdef GATES
    run Gatekeeper()
#endif
  }
}

/* ---------------- the properties as never claims ---------------------
 * (declared after the processes: pan numbers claims after them)         */

/* Invariants, as never claims written in Promela (LTL's parser cannot read
 * these expressions): each claim fails as soon as a state breaks it.      */
#define INVARIANT(name, p) \
never name { \
T0: do \
    :: atomic { !(p) -> assert(p) } \
    :: (1) -> goto T0 \
    od \
}

INVARIANT(safety, LEASE_OK && FENCED && EFFECT_OK && LOCK_OK && CRASH_OK && STARTED_OK && WAIT_OK && UNBLOCK_OK
                  && COUNT_OK && WF_OK && OPERATOR_OK && CANCEL_OK && TICKS_OK
                  && GATES_OK && UNIQUE_OK && DUP_OK && REPLACE_OK
                  && LIMIT_OK && KEY_LIMIT_OK && RATE_OK)
INVARIANT(lease_exclusive, LEASE_OK)
INVARIANT(fenced_writes, FENCED)
INVARIANT(effect_once, EFFECT_OK)
INVARIANT(lock_held, LOCK_OK)
INVARIANT(crash_contained, CRASH_OK)
INVARIANT(started_declared, STARTED_OK)
INVARIANT(dependents_wait, WAIT_OK)
INVARIANT(unblock_fenced, UNBLOCK_OK)
INVARIANT(counter_exact, COUNT_OK)
INVARIANT(cascade_cause, WF_OK)
INVARIANT(operator_cancel, OPERATOR_OK)
INVARIANT(cancel_honoured, CANCEL_OK)
INVARIANT(one_job_per_tick, TICKS_OK)
INVARIANT(gate_never_claimed, GATE_NEVER_OK)
INVARIANT(gate_once, GATE_ONCE_OK)
INVARIANT(gate_after_upstream, GATE_UPSTREAM_OK)
INVARIANT(checkpoint_once, CKPT_OK)
INVARIANT(unique_key_held, UNIQUE_OK)
INVARIANT(duplicate_of_holder, DUP_OK)
INVARIANT(replace_pending, REPLACE_OK)
INVARIANT(limit_held, LIMIT_OK)
INVARIANT(key_limit_held, KEY_LIMIT_OK)
INVARIANT(rate_held, RATE_OK)

/* Liveness, as never claims of the negated formulas (as spin writes them):
 * all_final is <>[] ALL_FINAL (every job ends final and stays so), and
 * every_tick is <> ALL_TICKS (every tick of the schedule gets its job).   */
#define EVENTUALLY_ALWAYS(name, p) \
never name { \
T0_init: do \
    :: (!(p)) -> goto accept_S9 \
    :: (1) -> goto T0_init \
    od; \
accept_S9: do \
    :: (1) -> goto T0_init \
    od \
}
#define EVENTUALLY(name, p) \
never name { \
accept_init: do \
    :: (!(p)) -> goto accept_init \
    od \
}

EVENTUALLY_ALWAYS(all_final, ALL_FINAL)
EVENTUALLY(every_tick, ALL_TICKS)
