------------------------------ MODULE Conveyor ------------------------------
(***************************************************************************)
(* The django-conveyor protocol: every statement of                        *)
(* django_conveyor/protocol.py that changes conveyor_job is one action     *)
(* here, named after its SQL constant, and executed atomically, as          *)
(* PostgreSQL executes one statement (or one transaction).                 *)
(*                                                                         *)
(*   ENQUEUE  CLAIM  CLAIM_ISOLATED  HEARTBEAT  LOCK_FOR_EFFECT  COMPLETE  *)
(*   RECORD_RESULT  RETRY  FAIL  SNOOZE  RELEASE  REAP  REQUEUE  CANCEL    *)
(*   PRUNE  REQUEST_CANCEL  CANCEL_HELD  CRON_ENQUEUE  ENQUEUE_REPLACE     *)
(*   HEARTBEAT_PROGRESS (issue 24): HEARTBEAT with handlers' progress      *)
(*   CLAIM_LIMITED: the claim of a queue that has limits (flow control)    *)
(*   UNBLOCK, CANCEL_DEPENDENTS, REBLOCK_DEPENDENTS: the statements that   *)
(*   run in the same transaction as COMPLETE, as the writes that make a    *)
(*   job failed/dead/cancelled, and as REQUEUE (operators below).          *)
(*                                                                         *)
(* Actions in CamelCase are not SQL: the handler's own effect (Effect),    *)
(* a worker starting a claimed job (Start), PostgreSQL ending a guarded    *)
(* transaction whose session went quiet (TxnTimeout), time (Tick, Clock),  *)
(* faults (Crash, Freeze, Thaw), a scheduler reading its schedule and the  *)
(* read that answers a duplicate call (FoldDuplicate).                     *)
(*                                                                         *)
(* Each feature is switched on by constants, so that a configuration can   *)
(* check one feature in a state space small enough for TLC:                *)
(*   Isolation        crash containment (issue 8): isolated flag, Start,   *)
(*                    CLAIM_ISOLATED, handlers that kill their worker;     *)
(*                    DECLARE (the worker's may_start list) and REAP's     *)
(*                    give-back of an attempt that never started           *)
(*   Deps, RunAnyway  workflows (issue 12): blocked jobs and dependencies  *)
(*   CancelRunning    cancelling a running job (issue 14)                  *)
(*   MaxTick          cron (issue 11): one schedule, ticks 1..MaxTick      *)
(*   TxnBound         PostgreSQL ends a guarded transaction whose worker   *)
(*                    stopped talking to it (the bound of issue 10)        *)
(*   Gates,           durable waits (issue 27): steps no handler runs,     *)
(*   Checkpoints      satisfied by SIGNAL, CONDITION_MET or GATE_TIMEOUT;  *)
(*                    resumable steps recorded by CHECKPOINT               *)
(*   Uniq             unique jobs (issue 23): keyed calls, the unique      *)
(*                    index, debounce (ENQUEUE_REPLACE)                    *)
(*   Lim              flow control: one queue with limits (concurrency,    *)
(*                    per-key concurrency, rate), claimed by CLAIM_LIMITED *)
(*                                                                         *)
(* Ghost state, for the properties only, records what the protocol is     *)
(* supposed to achieve without reading the columns its guards compare:     *)
(* which attempt made the latest claim of each job (claims), which one     *)
(* holds the lease (holder), whose lease is live in real time (liveGid),   *)
(* which one completed the job (completer), and the alarms raised when a   *)
(* write lands that the protocol should have refused.  In a correct run   *)
(* every ghost variable is a function of the real ones, so it adds no      *)
(* states.                                                                 *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Jobs,           \* job ids
    Workers,        \* worker ids (lease_owner values); each also runs a scheduler
    Concurrency,    \* handler slots per worker
    MaxAttempts,    \* conveyor_job.max_attempts
    NoWorker,       \* lease_owner IS NULL
    NoJob,          \* "no job" (cause of a cancellation that no dependency caused)
    \* ---- budgets: how often the environment or an operator acts per behaviour
    CrashBudget, FreezeBudget, ReleaseBudget, SnoozeBudget,
    RequeueBudget, CancelBudget, PruneBudget, CancelRequestBudget, CronSyncBudget,
    \* ---- features
    Atomic,         \* TRUE: handlers may use context.atomic() (the guarded transaction)
    TxnBound,       \* TRUE: idle_in_transaction_session_timeout / statement_timeout
                    \* end a guarded transaction whose worker went quiet
    Isolation,      \* TRUE: the isolated flag, CLAIM_ISOLATED, claimed-not-started jobs
    Crashers,       \* jobs whose handler kills its worker process (with Isolation)
    Deps,           \* Deps[j]: the jobs j depends on (conveyor_dependency)
    RunAnyway,      \* jobs with dependency_policy = 'run'; the others have 'cancel'
    CancelRunning,  \* TRUE: REQUEST_CANCEL and CANCEL_HELD
    MaxTick,        \* cron: ticks 1..MaxTick of one schedule (0: no cron)
    MissedAll,      \* cron: missed = 'all' (TRUE) or 'latest' (FALSE)
    \* ---- gates and checkpoints (issue 27)
    Gates,          \* jobs that are gates (conveyor_job.gate IS NOT NULL): no handler runs them
    ContinueOnTimeout, \* gates with on_timeout = 'continue' (the others: 'fail')
    SignalBudget,   \* signals sent (to any gate, at any time) per behaviour
    Checkpoints     \* TRUE: a handler may record one resumable step (context.checkpoint)

\* ---- unique jobs (issue 23): Uniq.key[j] is the unique key of job j's call
\* (NoKey: none), Uniq.states the states in which a keyed job holds its key,
\* Uniq.replace the keyed calls with on_duplicate = 'replace'.
CONSTANTS Uniq

\* ---- flow control: Lim.jobs are the jobs of the one queue that has limits
\* (the other jobs' queue has none); Lim.conc its concurrency (running jobs
\* of the queue, every worker's), Lim.key[j] the concurrency key of job j
\* (NoKey: none, not limited by key), Lim.keyConc its key_concurrency
\* (running jobs per key), Lim.rate its rate (claims per window of one
\* period).  0: no such limit.  Lim.jobs = {} switches the feature off.
CONSTANTS Lim

Final     == {"completed", "failed", "dead", "cancelled"}
NoKey     == "none"     \* unique_key IS NULL
Doomed    == {"failed", "dead", "cancelled"}
\* A keyed call that inserted no row: its ENQUEUE met the key and its next
\* statement is pending (conflict), or it was answered with the job that
\* holds the key (folded).  Like absent and pruned, not a state of a row.
Calls     == {"conflict", "folded"}
States    == {"absent", "blocked", "available", "running", "pruned"} \cup Final \cup Calls
Phases    == {"claimed", "run", "locked", "effect", "aborted", "done"}
Workflows == \E j \in Jobs : Deps[j] # {}

\* Claims per job are bounded: every claim uses an attempt, except those that
\* RELEASE or SNOOZE give back, and REQUEUE hands out a fresh set.
\* With Isolation, REAP gives back at most MaxAttempts attempts of a job that
\* never started (refunds).
MaxClaims == (RequeueBudget + 1) * MaxAttempts + ReleaseBudget + SnoozeBudget
             + (IF Isolation THEN MaxAttempts ELSE 0)

ASSUME
    /\ IsFiniteSet(Jobs) /\ IsFiniteSet(Workers)
    /\ Concurrency \in Nat \ {0} /\ MaxAttempts \in Nat \ {0}
    /\ NoWorker \notin Workers /\ NoJob \notin Jobs
    /\ {CrashBudget, FreezeBudget, ReleaseBudget, SnoozeBudget, RequeueBudget,
        CancelBudget, PruneBudget, CancelRequestBudget, CronSyncBudget, MaxTick} \subseteq Nat
    /\ {Atomic, TxnBound, Isolation, CancelRunning, MissedAll} \subseteq BOOLEAN
    /\ Crashers \subseteq Jobs /\ (Crashers # {} => Isolation)
    /\ Deps \in [Jobs -> SUBSET Jobs] /\ RunAnyway \subseteq Jobs
    /\ Gates \subseteq Jobs /\ ContinueOnTimeout \subseteq Gates
    /\ SignalBudget \in Nat /\ Checkpoints \in BOOLEAN
    /\ Uniq.states \subseteq States /\ Uniq.replace \subseteq Jobs
    /\ \A j \in Jobs : Uniq.key[j] # NoKey => Deps[j] = {}   \* refused at the edge
    /\ Lim.jobs \subseteq Jobs /\ {Lim.conc, Lim.keyConc, Lim.rate} \subseteq Nat

VARIABLES
    \* ---- conveyor_job, one row per job ----
    jstate,     \* state ("absent": not inserted yet; "pruned": deleted by PRUNE)
    attempt,    \* attempt
    owner,      \* lease_owner
    version,    \* lease_version: the fencing token
    expired,    \* lease_expires_at < now() (database time, abstract)
    lockedBy,   \* the claim (gid) whose open guarded transaction holds the row
                \* lock (SELECT ... FOR UPDATE of LOCK_FOR_EFFECT); 0: none
    isolated,   \* isolated
    cancelReq,  \* cancel_requested_at IS NOT NULL
    pending,    \* pending_dependencies
    cause,      \* the dependency whose failure cancelled the job (CANCEL_DEPENDENTS)
    \* ---- conveyor_ledger and the handler's business table ----
    ledger,     \* the claim whose ledger row (job, effect key) committed; 0: none.
                \* The unique (job, effect key) rule: there is at most one.
    business,   \* committed business rows written by guarded effects (0..2)
    \* ---- the workers ----
    held,       \* held[w]: the attempts worker w believes it holds (a set of records)
    frozen,     \* frozen[w]: SIGSTOP
    \* ---- ghost state, for the properties only ----
    claims,     \* number of claims of the job so far: the latest claim's id (gid)
    holder,     \* the claim that holds the lease (0: none)
    liveGid,    \* the claim whose lease has not expired in real time (0: none)
    completer,  \* the claim whose COMPLETE landed (0: none)
    lostTo,     \* attempts of the job ended by another job's crash (Isolation)
    alarms,     \* writes that landed although the protocol should refuse them
    left,       \* the budgets that remain
    \* ---- cron: one schedule (conveyor_cron row) and its jobs ----
    now,        \* the clock: ticks 1..now are due
    nextTick,   \* conveyor_cron.next_tick_at
    seen,       \* seen[w]: the tick worker w's scheduler read as due (0: none)
    expect,     \* expect[w]: the next_tick_at it read with it
    cronJobs    \* cronJobs[t]: jobs inserted for tick t

\* ---- gates and checkpoints (issue 27)
VARIABLES
    outcomes,   \* ghost: outcomes (signal, rejection, condition, timeout) of the gate
                \* since it last began to wait (REQUEUE of a gate starts a new wait)
    signalsLeft, \* signals the environment may still send
    ckpt,       \* conveyor_ledger: the claim whose checkpoint record committed; 0: none
    ckptCount,  \* ghost: checkpoint records committed for the job's step (0..2)
    stepEffect  \* ghost: committed business writes of the checkpointed step (0..2)

\* ---- crash containment: what a worker may have started (Isolation)
VARIABLES
    mayStart,   \* conveyor_worker.may_start of worker w's current process:
                \* the jobs it declared it may start (DECLARE_STARTS)
    refunds,    \* attempts REAP gave back because they never started (the
                \* job's errors entries marked unstarted)
    orphan      \* orphan[j].dead: j's lease is in the row of a worker process
                \* that died (the restarted process has a row of its own);
                \* .listed: that dead row's may_start lists j (real); ghost:
                \* .ran, the lease holder's handler started; .victim, the lease
                \* was lost to another job's crash (its Start killed the worker)

\* ---- flow control
VARIABLES
    rateLog,    \* the queue's rate log: claims it records in the current window
    winClaims   \* ghost: limited jobs that started running in the current window,
                \* by whatever statement

row    == <<jstate, attempt, owner, version, expired, lockedBy, isolated,
            cancelReq, pending, cause, ledger, business>>
ghost  == <<claims, holder, liveGid, completer, lostTo, alarms>>
cron   == <<now, nextTick, seen, expect, cronJobs>>
waits  == <<outcomes, signalsLeft, ckpt, ckptCount, stepEffect>>
flow   == <<rateLog, winClaims>>
starts == <<mayStart, refunds, orphan>>
vars   == <<row, held, frozen, ghost, left, cron, starts>>
allVars == <<vars, waits, flow>>

FlowTypeOK ==
    /\ rateLog   \in 0..(Cardinality(Jobs) * MaxClaims)
    /\ winClaims \in 0..(Cardinality(Jobs) * MaxClaims)

FlowInit == rateLog = 0 /\ winClaims = 0

Alive == [dead |-> FALSE, listed |-> FALSE, ran |-> FALSE, victim |-> FALSE]

StartsTypeOK ==
    /\ mayStart \in [Workers -> SUBSET Jobs]
    /\ refunds  \in [Jobs -> 0..MaxAttempts]
    /\ orphan   \in [Jobs -> [dead : BOOLEAN, listed : BOOLEAN, ran : BOOLEAN, victim : BOOLEAN]]

StartsInit ==
    /\ mayStart = [w \in Workers |-> {}]
    /\ refunds  = [j \in Jobs |-> 0]
    /\ orphan   = [j \in Jobs |-> Alive]

WaitsTypeOK ==
    /\ outcomes    \in [Jobs -> 0..2]
    /\ signalsLeft \in 0..SignalBudget
    /\ ckpt        \in [Jobs -> 0..MaxClaims]
    /\ ckptCount   \in [Jobs -> 0..2]
    /\ stepEffect  \in [Jobs -> 0..2]

WaitsInit ==
    /\ outcomes    = [j \in Jobs |-> 0]
    /\ signalsLeft = SignalBudget
    /\ ckpt        = [j \in Jobs |-> 0]
    /\ ckptCount   = [j \in Jobs |-> 0]
    /\ stepEffect  = [j \in Jobs |-> 0]

\* iso: the worker took it by CLAIM_ISOLATED (its belief); wasIso: ghost, the
\* row was isolated when it was claimed (what the statement really took);
\* decl: the worker listed the job in its may_start (DECLARE_STARTS) under this
\* lease (without Isolation every attempt starts at once: declared).
Attempt == [job : Jobs, tok : 0..MaxClaims, gid : 1..MaxClaims, phase : Phases,
            told : BOOLEAN, iso : BOOLEAN, wasIso : BOOLEAN, decl : BOOLEAN]

TypeOK ==
    /\ jstate    \in [Jobs -> States]
    /\ attempt   \in [Jobs -> 0..MaxAttempts]
    /\ owner     \in [Jobs -> Workers \cup {NoWorker}]
    /\ version   \in [Jobs -> 0..MaxClaims]
    /\ expired   \in [Jobs -> BOOLEAN]
    /\ lockedBy  \in [Jobs -> 0..MaxClaims]
    /\ isolated  \in [Jobs -> BOOLEAN]
    /\ cancelReq \in [Jobs -> BOOLEAN]
    /\ pending   \in [Jobs -> 0..Cardinality(Jobs)]
    /\ cause     \in [Jobs -> Jobs \cup {NoJob}]
    /\ ledger    \in [Jobs -> 0..MaxClaims]
    /\ business  \in [Jobs -> 0..2]
    /\ held      \in [Workers -> SUBSET Attempt]
    /\ \A w \in Workers : Cardinality(held[w]) <= Concurrency
    /\ frozen    \in [Workers -> BOOLEAN]
    /\ claims    \in [Jobs -> 0..MaxClaims]
    /\ holder    \in [Jobs -> 0..MaxClaims]
    /\ liveGid   \in [Jobs -> 0..MaxClaims]
    /\ completer \in [Jobs -> 0..MaxClaims]
    /\ lostTo    \in [Jobs -> 0..MaxAttempts]
    /\ now \in 0..MaxTick /\ nextTick \in 1..(MaxTick + 1)
    /\ seen \in [Workers -> 0..MaxTick] /\ expect \in [Workers -> 0..(MaxTick + 1)]
    /\ cronJobs \in [1..MaxTick -> 0..2]
    /\ WaitsTypeOK
    /\ FlowTypeOK
    /\ StartsTypeOK

Init ==
    /\ jstate    = [j \in Jobs |-> "absent"]
    /\ attempt   = [j \in Jobs |-> 0]
    /\ owner     = [j \in Jobs |-> NoWorker]
    /\ version   = [j \in Jobs |-> 0]
    /\ expired   = [j \in Jobs |-> FALSE]
    /\ lockedBy  = [j \in Jobs |-> 0]
    /\ isolated  = [j \in Jobs |-> FALSE]
    /\ cancelReq = [j \in Jobs |-> FALSE]
    /\ pending   = [j \in Jobs |-> 0]
    /\ cause     = [j \in Jobs |-> NoJob]
    /\ ledger    = [j \in Jobs |-> 0]
    /\ business  = [j \in Jobs |-> 0]
    /\ held      = [w \in Workers |-> {}]
    /\ frozen    = [w \in Workers |-> FALSE]
    /\ claims    = [j \in Jobs |-> 0]
    /\ holder    = [j \in Jobs |-> 0]
    /\ liveGid   = [j \in Jobs |-> 0]
    /\ completer = [j \in Jobs |-> 0]
    /\ lostTo    = [j \in Jobs |-> 0]
    /\ alarms    = {}
    /\ left = [crash |-> CrashBudget, freeze |-> FreezeBudget,
               release |-> ReleaseBudget, snooze |-> SnoozeBudget,
               requeue |-> RequeueBudget, cancel |-> CancelBudget,
               prune |-> PruneBudget, request |-> CancelRequestBudget,
               sync |-> CronSyncBudget]
    /\ now = 0 /\ nextTick = 1
    /\ seen = [w \in Workers |-> 0] /\ expect = [w \in Workers |-> 0]
    /\ cronJobs = [t \in 1..MaxTick |-> 0]
    /\ WaitsInit
    /\ FlowInit
    /\ StartsInit

-----------------------------------------------------------------------------
(* Helpers *)

Spend(k)       == left' = [left EXCEPT ![k] = @ - 1]
Replace(w, a, b) == held' = [held EXCEPT ![w] = (@ \ {a}) \cup {b}]
Forget(w, a)   == held' = [held EXCEPT ![w] = @ \ {a}]
Raise(kind, act, j) == {[kind |-> kind, act |-> act, job |-> j]}

\* The WHERE clause that every write about a held job carries:
\*   id = j AND state = 'running' AND lease_owner = w AND lease_version = tok
Fence(w, a) ==
    /\ jstate[a.job] = "running"
    /\ owner[a.job] = w
    /\ version[a.job] = a.tok

\* Each statement's own guard, kept apart so that a mutation can weaken one.
GuardHEARTBEAT(w, a)       == Fence(w, a)
GuardLOCK_FOR_EFFECT(w, a) == Fence(w, a) /\ ~cancelReq[a.job]
GuardCOMPLETE(w, a)        == Fence(w, a) /\ ~cancelReq[a.job]
GuardRETRY(w, a)           == Fence(w, a)
GuardFAIL(w, a)            == Fence(w, a)
GuardSNOOZE(w, a)          == Fence(w, a)
GuardRELEASE(w, a)         == Fence(w, a)
GuardCANCEL_HELD(w, a)     == Fence(w, a) /\ cancelReq[a.job]
\* RECORD_RESULT: id, state = 'completed', lease_owner, lease_version, no cancel request
GuardRECORD_RESULT(w, a) ==
    /\ jstate[a.job] = "completed"
    /\ owner[a.job] = w
    /\ version[a.job] = a.tok
    /\ ~cancelReq[a.job]

\* A write by attempt a landed: it must be the lease holder's (ghost check).
Landed(a, act) == IF holder[a.job] = a.gid THEN {} ELSE Raise("stale", act, a.job)

\* The attempt's own write ended its lease.
EndLease(j, a) ==
    /\ expired' = [expired EXCEPT ![j] = FALSE]
    /\ holder'  = [holder EXCEPT ![j] = 0]
    /\ liveGid' = [liveGid EXCEPT ![j] = IF @ = a.gid THEN 0 ELSE @]

\* What a write that hands a running job back (RETRY, SNOOZE, RELEASE, REAP)
\* makes of it when an operator asked to cancel it: cancelled, not available.
HandBack(j, st) == IF cancelReq[j] THEN "cancelled" ELSE st

AfterFailure(j) == IF attempt[j] >= MaxAttempts THEN "dead" ELSE "available"

-----------------------------------------------------------------------------
(* Workflows: what runs in the same transaction as a state change *)

Sat(x, d, js)  == IF x \in RunAnyway THEN js[d] \in Final ELSE js[d] = "completed"
Unsat(x, js)   == {d \in Deps[x] : ~Sat(x, d, js)}

\* Blocked dependents with policy 'cancel' of the jobs in C, transitively.
RECURSIVE CancelClosure(_, _)
CancelClosure(C, n) ==
    IF n = 0 THEN C
    ELSE CancelClosure(C \cup {x \in Jobs : /\ jstate[x] = "blocked"
                                            /\ x \notin RunAnyway
                                            /\ Deps[x] \cap C # {}}, n - 1)

\* The statement moves job j to state st.  With it, in the same transaction:
\*   UNBLOCK (st = completed): each blocked dependent's pending_dependencies
\*     is decremented; those that reach 0 become available.
\*   CANCEL_DEPENDENTS (st failed, dead or cancelled): blocked dependents with
\*     policy 'cancel' become cancelled, naming the dependency, transitively;
\*     blocked dependents with policy 'run' are decremented like UNBLOCK.
\* The code runs CANCEL_DEPENDENTS one statement per level of the graph (on
\* the ids the level before cancelled), looped in the same transaction; the
\* model takes the closure in one step, as one transaction.
\* Returns the new state, pending and cause columns and the alarms raised.
Moved(j, st) ==
  IF ~Workflows
  THEN [js |-> [jstate EXCEPT ![j] = st], pd |-> pending, cs |-> cause, al |-> {}]
  ELSE
    LET C      == IF st \in Doomed THEN CancelClosure({j}, Cardinality(Jobs)) \ {j}
                                   ELSE {}
        finals == (IF st \in Final THEN {j} ELSE {}) \cup C
        js1    == [x \in Jobs |-> IF x = j THEN st
                                  ELSE IF x \in C THEN "cancelled" ELSE jstate[x]]
        dec(x) == Cardinality({d \in Deps[x] \cap finals : Sat(x, d, js1)})
        pd     == [x \in Jobs |->
                     IF x # j /\ js1[x] = "blocked" THEN pending[x] - dec(x)
                     ELSE pending[x]]
        js     == [x \in Jobs |->
                     IF x # j /\ js1[x] = "blocked" /\ pd[x] = 0 /\ x \notin Gates
                     THEN "available"
                     ELSE js1[x]]
        freed  == {x \in Jobs : x # j /\ js1[x] = "blocked" /\ js[x] = "available"}
        cs     == [x \in Jobs |->
                     IF x \in C THEN CHOOSE d \in Deps[x] : d \in C \cup {j}
                     ELSE cause[x]]
    IN [js |-> js, pd |-> pd, cs |-> cs,
        al |-> {[kind |-> "early", act |-> "UNBLOCK", job |-> x] :
                  x \in {y \in freed : Unsat(y, js) # {}}}]

\* The three statements that run inside another one's transaction, by name:
UNBLOCK(j)               == Moved(j, "completed")
CANCEL_DEPENDENTS(j, st) == Moved(j, st)   \* st \in Doomed

\* Apply the result of Moved, with the alarms of the statement itself.
\* A job newly cancelled by CANCEL_DEPENDENTS must name a dependency that the
\* same statement leaves failed, dead or cancelled.
SetMoved(m, more) ==
    /\ jstate'  = m.js
    /\ pending' = m.pd
    /\ cause'   = m.cs
    /\ alarms'  = alarms \cup m.al \cup more
         \cup {[kind |-> "cause", act |-> "CANCEL_DEPENDENTS", job |-> x] :
                 x \in {y \in Jobs : /\ m.js[y] = "cancelled" /\ jstate[y] # "cancelled"
                                     /\ m.cs[y] # NoJob /\ m.js[m.cs[y]] \notin Doomed}}

\* CANCEL_HELD's effect on the row (the caller clears lease_owner): the
\* holder ends its job cancelled, with CANCEL_DEPENDENTS.
HolderCancels(j, a) ==
    /\ SetMoved(CANCEL_DEPENDENTS(j, "cancelled"), Landed(a, "CANCEL_HELD"))
    /\ EndLease(j, a)
    /\ isolated' = [isolated EXCEPT ![j] = FALSE]

\* REBLOCK_DEPENDENTS, in REQUEUE's transaction, as the code runs it: one
\* statement per level of the graph, looped until a level writes no job that
\* an earlier level has not written (the model runs the loop in one step, as
\* one transaction).  Each statement, for the frontier F:
\*   candidates: the jobs of F that are blocked (a requeued job with
\*     dependencies comes back blocked), and the dependents of F that are
\*     not yet started with policy 'run' (blocked or available: their
\*     dependency is unfinished again), or cancelled because of a dependency
\*     (their last error is DependencyFailed: cause # NoJob; an operator's
\*     cancel leaves another last error, and stays);
\*   their dependencies are share-locked and counted, from the states before
\*     the statement: unfinished (not completed) and unsettled (not final);
\*   written, under the candidate's row lock: a blocked one, a not-yet-started
\*     'run' one, a cancelled one with policy 'run' or with no dependency
\*     failed, dead or cancelled (unfinished = unsettled).  It gets
\*     pending_dependencies = unsettled ('run') or unfinished ('cancel'), and
\*     is blocked while that is above 0, else available.
\* A job cancelled because of a dependency therefore stays cancelled while
\* another dependency of it is failed, dead or cancelled, and its last error
\* still names the dependency that cancelled it; it comes back when that
\* other one is requeued.  The model clears cause when a job comes back:
\* every later way to 'cancelled' but SNOOZE or RELEASE after a cancel
\* request appends another error entry, and a job that got that far ran, so
\* every dependency of it is completed and it is never a candidate again.
RunWaitsAgain == {"blocked", "available"}   \* a 'run' dependent not yet started

Unfinished(x, js) == Cardinality({d \in Deps[x] : js[d] # "completed"})
Unsettled(x, js)  == Cardinality({d \in Deps[x] : js[d] \notin Final})
Recount(x, js)    == IF x \in RunAnyway THEN Unsettled(x, js) ELSE Unfinished(x, js)

ReblockCandidates(F, js, cs) ==
    {x \in F : js[x] = "blocked"}
    \cup {x \in Jobs : /\ Deps[x] \cap F # {}
                       /\ \/ x \in RunAnyway /\ js[x] \in RunWaitsAgain
                          \/ js[x] = "cancelled" /\ cs[x] # NoJob}

ReblockWrites(x, js) ==
    \/ js[x] = "blocked"
    \/ x \in RunAnyway /\ js[x] \in RunWaitsAgain
    \/ js[x] = "cancelled" /\ (x \in RunAnyway \/ Unfinished(x, js) = Unsettled(x, js))

\* st: the columns [js, pd, cs]; F: the frontier; Q: the jobs written so far.
RECURSIVE ReblockLevels(_, _, _)
ReblockLevels(st, F, Q) ==
    IF F = {} THEN st
    ELSE LET U    == {x \in ReblockCandidates(F, st.js, st.cs) : ReblockWrites(x, st.js)}
             n(x) == Recount(x, st.js)
         IN ReblockLevels(
              [js |-> [x \in Jobs |-> IF x \notin U THEN st.js[x]
                                     ELSE IF n(x) > 0 \/ x \in Gates THEN "blocked"
                                     ELSE "available"],
               pd |-> [x \in Jobs |-> IF x \in U THEN n(x) ELSE st.pd[x]],
               cs |-> [x \in Jobs |-> IF x \in U THEN NoJob ELSE st.cs[x]]],
              U \ Q, Q \cup U)

REBLOCK_DEPENDENTS(j, st) == ReblockLevels(st, {j}, {j})

-----------------------------------------------------------------------------
(* Unique jobs: the unique index *)

\* The partial unique index conveyor_job_unique_key_uniq holds the rows for
\* which its predicate is true:
\*   unique_key IS NOT NULL AND unique_states @> ARRAY[state]
\* It reads the row's own state, so every statement that moves a keyed job
\* out of its blocking states frees the key in the same step (the new row
\* version has no entry), and one that moves it back in must find the key
\* free (REQUEUE's guard).  The properties below say what the index is for
\* without reading Indexed, so that a mutation of it is caught.
Indexed(x)  == Uniq.key[x] # NoKey /\ jstate[x] \in Uniq.states
Holders(j)  == {x \in Jobs \ {j} : Uniq.key[x] = Uniq.key[j] /\ Indexed(x)}
KeyTaken(j) == Uniq.key[j] # NoKey /\ Holders(j) # {}

\* INSERT ... ON CONFLICT DO NOTHING: a keyed row whose key the index holds is
\* not inserted; the call goes on to its next statement.
Inserted(j, st) == IF KeyTaken(j) THEN "conflict" ELSE st

-----------------------------------------------------------------------------
(* The protocol statements *)

\* A job may be enqueued once its dependencies exist; one with policy
\* 'cancel' and a dependency already failed, dead or cancelled is refused.
EnqueueAllowed(j) ==
    /\ \A d \in Deps[j] : jstate[d] \notin {"absent", "pruned"}
    /\ j \notin RunAnyway => \A d \in Deps[j] : jstate[d] \notin Doomed

\* LOCK_DEPENDENCIES (SELECT state ... FOR SHARE, held until the caller
\* commits), then INSERT INTO conveyor_job (state, pending_dependencies, ...)
\* and ENQUEUE_DEPENDENCIES (the rows of conveyor_dependency), in the
\* caller's transaction: no dependency completes, fails or is requeued
\* between the count and the commit, so the model takes it as one step.
\* 'blocked' with the count of dependencies not final, or 'available'.
\* A keyed call (unique jobs) whose key the unique index holds inserts no
\* row: ON CONFLICT DO NOTHING (Inserted).
ENQUEUE(j) ==
    /\ jstate[j] = "absent"
    /\ EnqueueAllowed(j)
    /\ LET n == Cardinality(Unsat(j, jstate)) IN
         /\ jstate'  = [jstate EXCEPT ![j] = Inserted(j, IF n > 0 \/ j \in Gates THEN "blocked"
                                                      ELSE "available")]
         /\ pending' = [pending EXCEPT ![j] = n]
    /\ UNCHANGED <<attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   cause, ledger, business, held, frozen, ghost, left, cron>>

\* The new attempt that a claim hands to worker w.
NewAttempt(j, iso) ==
    [job |-> j, tok |-> version[j] + 1, gid |-> claims[j] + 1,
     phase |-> IF Isolation THEN "claimed" ELSE "run", told |-> FALSE, iso |-> iso,
     wasIso |-> isolated[j], decl |-> ~Isolation]

Claimed(w, j, iso) ==
    /\ jstate'  = [jstate EXCEPT ![j] = "running"]
    /\ attempt' = [attempt EXCEPT ![j] = @ + 1]
    /\ owner'   = [owner EXCEPT ![j] = w]
    /\ version' = [version EXCEPT ![j] = @ + 1]
    /\ expired' = [expired EXCEPT ![j] = FALSE]
    /\ held'    = [held EXCEPT ![w] = @ \cup {NewAttempt(j, iso)}]
    /\ claims'  = [claims EXCEPT ![j] = @ + 1]
    /\ holder'  = [holder EXCEPT ![j] = claims[j] + 1]
    /\ liveGid' = [liveGid EXCEPT ![j] = claims[j] + 1]
    \* a second lease while another attempt's lease is still live; a job
    \* that an operator asked to cancel running again; an isolated job taken
    \* by CLAIM, with batch-mates, instead of alone by CLAIM_ISOLATED
    /\ alarms'  = alarms \cup (IF liveGid[j] # 0 THEN Raise("double", "CLAIM", j) ELSE {})
                         \cup (IF cancelReq[j] THEN Raise("rerun", "CLAIM", j) ELSE {})
                         \cup (IF isolated[j] /\ ~iso THEN Raise("isolated", "CLAIM", j) ELSE {})
    /\ UNCHANGED <<lockedBy, isolated, cancelReq, pending, cause, ledger, business,
                   frozen, completer, lostTo, left, cron>>

\* UPDATE ... SET state='running', attempt=attempt+1, lease_owner=w,
\*   lease_version=lease_version+1, lease_expires_at=now()+lease
\* FROM (SELECT id ... WHERE state='available' AND NOT isolated
\*       AND the queue is neither paused nor limited ... FOR UPDATE SKIP LOCKED)
CLAIM(w, j) ==
    /\ ~frozen[w]
    /\ Cardinality(held[w]) < Concurrency
    /\ j \notin Lim.jobs     \* a queue with limits is filtered out, as a paused one
    /\ jstate[j] = "available"
    /\ ~isolated[j]
    /\ Claimed(w, j, FALSE)

\* The same statement for one isolated job, LIMIT 1, taken only by a worker
\* that holds no other isolated job and no claimed job it has not started.
CLAIM_ISOLATED(w, j) ==
    /\ Isolation
    /\ ~frozen[w]
    /\ Cardinality(held[w]) < Concurrency
    /\ j \notin Lim.jobs     \* CLAIM_LIMITED takes those
    /\ \A a \in held[w] : ~a.iso /\ a.phase # "claimed"
    /\ jstate[j] = "available"
    /\ isolated[j]
    /\ Claimed(w, j, TRUE)

-----------------------------------------------------------------------------
(* Flow control: the claim of a queue that has limits *)

\* Ghost: the limited jobs that start running in a step, by whatever
\* statement (so that RateHeld does not read the rate log the guard reads).
CountStarts ==
    winClaims' = winClaims + Cardinality({x \in Lim.jobs : /\ jstate[x] # "running"
                                                          /\ jstate'[x] = "running"})

\* The claim of the jobs S, as Claimed for each (a batch is claimed in one
\* statement; each row gets its own new token).
ClaimedBatch(w, S, iso) ==
    /\ jstate'  = [x \in Jobs |-> IF x \in S THEN "running" ELSE jstate[x]]
    /\ attempt' = [x \in Jobs |-> IF x \in S THEN attempt[x] + 1 ELSE attempt[x]]
    /\ owner'   = [x \in Jobs |-> IF x \in S THEN w ELSE owner[x]]
    /\ version' = [x \in Jobs |-> IF x \in S THEN version[x] + 1 ELSE version[x]]
    /\ expired' = [x \in Jobs |-> IF x \in S THEN FALSE ELSE expired[x]]
    /\ held'    = [held EXCEPT ![w] = @ \cup {NewAttempt(x, iso) : x \in S}]
    /\ claims'  = [x \in Jobs |-> IF x \in S THEN claims[x] + 1 ELSE claims[x]]
    /\ holder'  = [x \in Jobs |-> IF x \in S THEN claims[x] + 1 ELSE holder[x]]
    /\ liveGid' = [x \in Jobs |-> IF x \in S THEN claims[x] + 1 ELSE liveGid[x]]
    /\ alarms'  = alarms \cup
         UNION {(IF liveGid[x] # 0 THEN Raise("double", "CLAIM_LIMITED", x) ELSE {})
                \cup (IF cancelReq[x] THEN Raise("rerun", "CLAIM_LIMITED", x) ELSE {})
                \cup (IF isolated[x] /\ ~iso THEN Raise("isolated", "CLAIM_LIMITED", x) ELSE {})
                : x \in S}
    /\ UNCHANGED <<lockedBy, isolated, cancelReq, pending, cause, ledger, business,
                   frozen, completer, lostTo, left, cron>>

\* The claim of a queue with limits, in the claiming worker's transaction:
\*   SELECT ... FROM conveyor_queue WHERE name = <queue> FOR NO KEY UPDATE
\* then a second statement, whose snapshot is taken after that lock is
\* granted: it counts the queue's rows in state 'running' (every worker's,
\* expired leases that REAP has not taken back included) and those of each
\* concurrency key, reads the rate log's claims in the window, and
\*   UPDATE ... SET state='running', attempt=attempt+1, lease_owner=w,
\*     lease_version=lease_version+1, lease_expires_at=now()+lease
\*   FROM (SELECT id ... WHERE queue = <queue> AND state='available' ...
\*         LIMIT least(batch, concurrency - running, rate - started),
\*         at most key_concurrency - running(key) per key, FOR UPDATE SKIP LOCKED)
\* appending its count to the rate log.  Claims of one queue serialize on
\* the queue's row lock, so the count and the claim are one step.  Which
\* jobs of the room are taken (priority, the round-robin of 'fair' across
\* keys) and how many (the worker's free slots, and jobs claimed ahead of
\* them while the queue's concurrency is far and it has no rate) are free
\* here: S is any batch within the limits.  An isolated job of
\* the queue is taken alone, with CLAIM_ISOLATED's guard.
CLAIM_LIMITED(w, S) ==
    /\ ~frozen[w]
    /\ S # {} /\ S \subseteq Lim.jobs
    /\ Cardinality(held[w]) + Cardinality(S) <= Concurrency
    /\ \A x \in S : jstate[x] = "available"
    /\ LET running == {x \in Lim.jobs : jstate[x] = "running"}
           iso     == \E x \in S : isolated[x]
       IN
       /\ Lim.conc = 0 \/ Cardinality(running) + Cardinality(S) <= Lim.conc
       /\ Lim.keyConc = 0 \/ \A x \in S : Lim.key[x] = NoKey \/
            Cardinality({y \in running \cup S : Lim.key[y] = Lim.key[x]}) <= Lim.keyConc
       /\ Lim.rate = 0 \/ rateLog + Cardinality(S) <= Lim.rate
       /\ iso => Cardinality(S) = 1 /\ \A a \in held[w] : ~a.iso /\ a.phase # "claimed"
       /\ ClaimedBatch(w, S, iso)
    /\ rateLog' = IF Lim.rate = 0 THEN rateLog ELSE rateLog + Cardinality(S)
    /\ CountStarts

\* Time passes into a new window of the rate: the claims logged in the old
\* one no longer count.  (The code's window slides; here it moves at once,
\* at any moment.)
NewWindow ==
    /\ Lim.rate > 0
    /\ rateLog + winClaims > 0
    /\ rateLog' = 0
    /\ winClaims' = 0
    /\ UNCHANGED <<vars, waits>>

FlowStep ==
    \/ \E w \in Workers : \E S \in SUBSET Lim.jobs : CLAIM_LIMITED(w, S)
    \/ NewWindow

\* UPDATE ... SET lease_expires_at = now()+lease
\*   WHERE id, state='running', lease_owner=w, lease_version=tok
\*   FOR UPDATE SKIP LOCKED  (RETURNING the cancel request)
\* A row locked by the worker's own guarded transaction is skipped: neither
\* renewed nor lost.  Zero rows otherwise: the lease is lost; the handler is
\* told and no outcome is written.  A renewal that changes nothing is a
\* stuttering step and is left out.  `guard` is the statement's WHERE clause
\* (HEARTBEAT and HEARTBEAT_PROGRESS each have their own), `act` its name.
Renewal(w, a, guard, act) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase \in {"claimed", "run", "aborted"}
    /\ LET j == a.job IN
       IF guard
       THEN /\ expired[j] \/ liveGid[j] # a.gid \/ (cancelReq[j] /\ ~a.told)
            /\ expired' = [expired EXCEPT ![j] = FALSE]
            /\ liveGid' = [liveGid EXCEPT ![j] = a.gid]
            /\ Replace(w, a, [a EXCEPT !.told = cancelReq[j]])
            /\ alarms'  = alarms \cup Landed(a, act)
       ELSE /\ Forget(w, a)
            /\ UNCHANGED <<expired, liveGid, alarms>>
    /\ UNCHANGED <<jstate, attempt, owner, version, lockedBy, isolated, cancelReq,
                   pending, cause, ledger, business, frozen, claims, holder,
                   completer, lostTo, left, cron>>

HEARTBEAT(w, a) == Renewal(w, a, GuardHEARTBEAT(w, a), "HEARTBEAT")

-----------------------------------------------------------------------------
(* Progress (issue 24): the heartbeat that carries what handlers reported  *)

\* HEARTBEAT with the progress each running handler reported since the last
\* beat (context.set_progress), in the same statement:
\*   UPDATE ... SET lease_expires_at = now()+lease,
\*                  progress = COALESCE(h.progress || {attempt, time}, progress)
\*   WHERE id, state='running', lease_owner=w, lease_version=tok
\*   FOR UPDATE SKIP LOCKED
\* The worker sends it instead of HEARTBEAT when a handler it runs reported
\* progress, so a worker still sends one statement per beat.  Only a running
\* handler reports (phase run, or aborted: PostgreSQL ended its guarded
\* transaction and the handler goes on).  The progress column itself is not
\* modelled: its write lands exactly when the renewal does, and FencedWrites
\* judges that write by the ghost claim id, so a stale attempt's progress is
\* refused like its outcome.
GuardHEARTBEAT_PROGRESS(w, a) == Fence(w, a)

HEARTBEAT_PROGRESS(w, a) ==
    /\ a.phase \in {"run", "aborted"}
    /\ Renewal(w, a, GuardHEARTBEAT_PROGRESS(w, a), "HEARTBEAT_PROGRESS")

\* The first statement of context.atomic():
\*   SELECT id FROM conveyor_job WHERE id, state='running', lease_owner,
\*   lease_version, cancel_requested_at IS NULL FOR UPDATE
\* The row lock is held until the transaction ends.  Zero rows: the handler
\* gets LeaseLost, nothing is committed and the worker writes no outcome.
LOCK_FOR_EFFECT(w, a) ==
    /\ Atomic
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase = "run"
    /\ LET j == a.job IN
       IF GuardLOCK_FOR_EFFECT(w, a)
       THEN /\ lockedBy[j] = 0      \* FOR UPDATE waits for another lock holder
            /\ lockedBy' = [lockedBy EXCEPT ![j] = a.gid]
            /\ Replace(w, a, [a EXCEPT !.phase = "locked"])
            /\ alarms' = alarms \cup Landed(a, "LOCK_FOR_EFFECT")
       ELSE /\ Forget(w, a)
            /\ UNCHANGED <<lockedBy, alarms>>
    /\ UNCHANGED <<jstate, attempt, owner, version, expired, isolated, cancelReq,
                   pending, cause, ledger, business, frozen, claims, holder,
                   liveGid, completer, lostTo, left, cron>>

\* The handler's database work inside context.atomic(): a business row and
\* the ledger row (job, effect key), not yet committed.  The ledger's unique
\* (job, effect key) rule: once a row for the job is committed, the insert
\* raises, and the attempt can only roll back (RETRY or FAIL below).
Effect(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase = "locked"
    /\ ledger[a.job] = 0
    /\ Replace(w, a, [a EXCEPT !.phase = "effect"])
    /\ UNCHANGED <<row, frozen, ghost, left, cron>>

\* The handler returned: the worker's batch writes
\*   UPDATE ... SET state='completed', return_value, finished_at
\*   WHERE id, state='running', lease_owner, lease_version,
\*         cancel_requested_at IS NULL
\* keeping lease_owner, with UNBLOCK in the same transaction.  Inside
\* context.atomic() the same statement commits with the handler's effect;
\* zero rows there roll the effect back.  Either way only the ids COMPLETE
\* really wrote are unblocked.  A completion refused because an operator
\* asked to cancel the job is followed, in the same transaction, by the
\* holder's CANCEL_HELD (its guard: the token and the request), so the job
\* ends cancelled with CANCEL_DEPENDENTS, not completed.
COMPLETE(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase \in {"run", "effect"}
    /\ LET j == a.job
           guarded == a.phase = "effect"
           cancels == ~guarded /\ ~GuardCOMPLETE(w, a) /\ GuardCANCEL_HELD(w, a)
       IN
       /\ IF GuardCOMPLETE(w, a)
          THEN LET m == UNBLOCK(j) IN
               /\ SetMoved(m, Landed(a, "COMPLETE")
                    \cup (IF guarded /\ cancelReq[j]
                          THEN Raise("cancelled effect", "COMPLETE", j) ELSE {}))
               /\ EndLease(j, a)
               /\ completer' = [completer EXCEPT ![j] = a.gid]
               /\ isolated'  = [isolated EXCEPT ![j] = FALSE]
               /\ IF guarded
                  THEN /\ ledger'   = [ledger EXCEPT ![j] = a.gid]
                       /\ business' = [business EXCEPT ![j] = IF @ < 2 THEN @ + 1 ELSE 2]
                       /\ Replace(w, a, [a EXCEPT !.phase = "done"])
                  ELSE /\ Forget(w, a)
                       /\ UNCHANGED <<ledger, business>>
          ELSE IF cancels
          THEN /\ HolderCancels(j, a)
               /\ Forget(w, a)
               /\ UNCHANGED <<completer, ledger, business>>
          ELSE /\ Forget(w, a)
               /\ UNCHANGED <<jstate, pending, cause, expired, holder, liveGid,
                              completer, isolated, ledger, business, alarms>>
       /\ lockedBy' = [lockedBy EXCEPT ![j] = IF guarded THEN 0 ELSE @]
       /\ owner'    = [owner EXCEPT ![j] = IF cancels THEN NoWorker ELSE @]
    /\ UNCHANGED <<attempt, version, cancelReq, frozen, claims, lostTo, left, cron>>

\* After the guarded commit, the batch stores the return value:
\*   UPDATE ... SET return_value WHERE id, state='completed', lease_owner, lease_version
RECORD_RESULT(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase = "done"
    /\ alarms' = alarms \cup
         (IF GuardRECORD_RESULT(w, a) /\ completer[a.job] # a.gid
          THEN Raise("stale", "RECORD_RESULT", a.job) ELSE {})
    /\ Forget(w, a)
    /\ UNCHANGED <<row, frozen, claims, holder, liveGid, completer, lostTo, left, cron>>

\* The handler raised (inside context.atomic() the transaction rolls back
\* first, releasing the row lock); the batch writes
\*   UPDATE ... SET state = CASE WHEN attempt >= max_attempts THEN 'dead'
\*   ELSE 'available' END, run_after = now()+backoff, errors = errors || ...,
\*   lease_owner = NULL, isolated = false
\*   WHERE id, state='running', lease_owner, lease_version
\* with CANCEL_DEPENDENTS when it makes the job dead.
RETRY(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase \in {"run", "locked", "effect", "aborted"}
    /\ LET j == a.job IN
       /\ IF GuardRETRY(w, a)
          THEN /\ SetMoved(Moved(j, HandBack(j, AfterFailure(j))), Landed(a, "RETRY"))
               /\ owner'    = [owner EXCEPT ![j] = NoWorker]
               /\ EndLease(j, a)
               /\ isolated' = [isolated EXCEPT ![j] = FALSE]
          ELSE UNCHANGED <<jstate, pending, cause, alarms, owner, expired, holder,
                           liveGid, isolated>>
       /\ lockedBy' = [lockedBy EXCEPT ![j] = IF lockedBy[j] = a.gid THEN 0 ELSE @]
    /\ Forget(w, a)
    /\ UNCHANGED <<attempt, version, cancelReq, ledger, business, frozen, claims,
                   completer, lostTo, left, cron>>

\* The handler raised Discard:
\*   UPDATE ... SET state='failed', lease_owner = NULL, isolated = false
\*   WHERE id, state='running', lease_owner, lease_version
\* with CANCEL_DEPENDENTS.
FAIL(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase \in {"run", "locked", "effect", "aborted"}
    /\ LET j == a.job IN
       /\ IF GuardFAIL(w, a)
          THEN /\ SetMoved(CANCEL_DEPENDENTS(j, "failed"), Landed(a, "FAIL"))
               /\ owner'    = [owner EXCEPT ![j] = NoWorker]
               /\ EndLease(j, a)
               /\ isolated' = [isolated EXCEPT ![j] = FALSE]
          ELSE UNCHANGED <<jstate, pending, cause, alarms, owner, expired, holder,
                           liveGid, isolated>>
       /\ lockedBy' = [lockedBy EXCEPT ![j] = IF lockedBy[j] = a.gid THEN 0 ELSE @]
    /\ Forget(w, a)
    /\ UNCHANGED <<attempt, version, cancelReq, ledger, business, frozen, claims,
                   completer, lostTo, left, cron>>

\* The handler raised Snooze:
\*   UPDATE ... SET state='available', attempt=attempt-1, run_after=now()+delay,
\*   lease_owner = NULL, isolated = false WHERE id, state='running', owner, version
SNOOZE(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase \in {"run", "locked", "effect"}
    /\ left.snooze > 0
    /\ Spend("snooze")
    /\ LET j == a.job IN
       /\ IF GuardSNOOZE(w, a)
          THEN /\ SetMoved(Moved(j, HandBack(j, "available")), Landed(a, "SNOOZE"))
               /\ attempt'  = [attempt EXCEPT ![j] = @ - 1]
               /\ owner'    = [owner EXCEPT ![j] = NoWorker]
               /\ EndLease(j, a)
               /\ isolated' = [isolated EXCEPT ![j] = FALSE]
          ELSE UNCHANGED <<jstate, pending, cause, alarms, attempt, owner, expired,
                           holder, liveGid, isolated>>
       /\ lockedBy' = [lockedBy EXCEPT ![j] = IF lockedBy[j] = a.gid THEN 0 ELSE @]
    /\ Forget(w, a)
    /\ UNCHANGED <<version, cancelReq, ledger, business, frozen, claims, completer,
                   lostTo, cron>>

\* Graceful shutdown hands an unfinished lease back at once (the attempt is
\* given back; isolated is kept):
\*   UPDATE ... SET state='available', attempt=attempt-1, lease_owner = NULL
\*   WHERE id, state='running', lease_owner, lease_version
\* A row locked by the attempt's own open guarded transaction would make the
\* statement wait for it, so it is not released then.
RELEASE(w, a) ==
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase \in {"claimed", "run", "aborted"}
    /\ left.release > 0
    /\ Spend("release")
    /\ LET j == a.job IN
       IF GuardRELEASE(w, a)
       THEN /\ SetMoved(Moved(j, HandBack(j, "available")), Landed(a, "RELEASE"))
            /\ attempt' = [attempt EXCEPT ![j] = @ - 1]
            /\ owner'   = [owner EXCEPT ![j] = NoWorker]
            /\ EndLease(j, a)
       ELSE UNCHANGED <<jstate, pending, cause, alarms, attempt, owner, expired,
                        holder, liveGid>>
    /\ Forget(w, a)
    /\ UNCHANGED <<version, lockedBy, isolated, cancelReq, ledger, business, frozen,
                   claims, completer, lostTo, cron>>

\* The worker learnt from HEARTBEAT that an operator asked to cancel a job it
\* holds:
\*   UPDATE ... SET state='cancelled', lease_owner = NULL, isolated = false,
\*   errors = errors || 'cancelled while running, by ...', history = ...
\*   WHERE id, state='running', lease_owner, lease_version
\* with CANCEL_DEPENDENTS.  The handler's own outcome then matches nothing.
CANCEL_HELD(w, a) ==
    /\ CancelRunning
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.told
    /\ a.phase \in {"claimed", "run", "aborted"}
    /\ LET j == a.job IN
       IF GuardCANCEL_HELD(w, a)
       THEN /\ HolderCancels(j, a)
            /\ owner' = [owner EXCEPT ![j] = NoWorker]
       ELSE UNCHANGED <<jstate, pending, cause, alarms, owner, expired, holder,
                        liveGid, isolated>>
    /\ Forget(w, a)
    /\ UNCHANGED <<attempt, version, lockedBy, cancelReq, ledger, business, frozen,
                   claims, completer, lostTo, left, cron>>

\* The lease owner's row (FOR SHARE) lists the job: its worker may have
\* started it.  A dead process's row is the one that owns the lease.
Listed(j) == IF orphan[j].dead THEN orphan[j].listed ELSE j \in mayStart[owner[j]]

\* Ghost: the handler of the attempt holding j's lease started.
Ran(j) ==
    IF orphan[j].dead THEN orphan[j].ran
    ELSE \E w \in Workers : \E a \in held[w] :
            a.job = j /\ a.gid = holder[j] /\ a.phase # "claimed"

\* REAP's judgement: the attempt counts (the job may have killed its worker)
\* when the owner listed the job, or when its attempts were given back
\* max_attempts times already.
GuardREAP_STARTED(j) == ~Isolation \/ Listed(j) \/ refunds[j] >= MaxAttempts

\* UPDATE ... SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN
\*   'cancelled' WHEN started AND attempt >= max_attempts THEN 'dead' ELSE
\*   'available' END, attempt = CASE WHEN started THEN attempt ELSE attempt - 1
\*   END, isolated = (no cancel request) AND CASE WHEN started THEN (state
\*   becomes 'available') ELSE isolated END, lease_owner = NULL,
\*   errors = errors || ('lease lost' or 'unstarted')
\* FROM (SELECT ... WHERE state='running' AND lease_expires_at < now()
\*       FOR UPDATE SKIP LOCKED), the owners' conveyor_worker rows FOR SHARE
\* with CANCEL_DEPENDENTS when the job becomes dead or cancelled.  No owner
\* in the guard: the reaper acts for nobody.  SKIP LOCKED: a row locked by a
\* guarded transaction is left alone.  started: GuardREAP_STARTED.  A
\* charged attempt lost to another job's crash counts in lostTo (ghost); an
\* attempt given back whose handler had started raises an alarm.
REAP(j) ==
    /\ jstate[j] = "running"
    /\ expired[j]
    /\ lockedBy[j] = 0
    /\ LET st == HandBack(j, AfterFailure(j)) IN
       IF GuardREAP_STARTED(j)
       THEN /\ SetMoved(Moved(j, st), {})
            /\ isolated' = [isolated EXCEPT ![j] = Isolation /\ st = "available"]
            /\ lostTo'   = [lostTo EXCEPT ![j] = IF orphan[j].victim /\ @ < MaxAttempts
                                                 THEN @ + 1 ELSE @]
            /\ UNCHANGED <<attempt, refunds>>
       ELSE LET gb == HandBack(j, "available") IN
            /\ SetMoved(Moved(j, gb), IF Ran(j) THEN Raise("refund", "REAP", j) ELSE {})
            /\ isolated' = [isolated EXCEPT ![j] = @ /\ gb = "available"]
            /\ attempt'  = [attempt EXCEPT ![j] = @ - 1]
            /\ refunds'  = [refunds EXCEPT ![j] = @ + 1]
            /\ UNCHANGED lostTo
    /\ orphan'  = [orphan EXCEPT ![j] = Alive]
    /\ owner'   = [owner EXCEPT ![j] = NoWorker]
    /\ expired' = [expired EXCEPT ![j] = FALSE]
    /\ holder'  = [holder EXCEPT ![j] = 0]
    /\ UNCHANGED <<version, lockedBy, cancelReq, ledger, business, held,
                   frozen, claims, liveGid, completer, left, cron, mayStart>>

\* An operator gives a failed, dead or cancelled job a fresh set of attempts:
\*   UPDATE ... SET state = CASE WHEN it has dependencies THEN 'blocked'
\*   ELSE 'available' END, attempt = 0, isolated = false,
\*   cancel_requested_at = NULL
\*   WHERE id AND state IN ('failed', 'dead', 'cancelled') AND NOT (policy
\*   'cancel' AND a dependency is failed, dead or cancelled)
\*   AND (unique_key IS NULL OR no other job holds the key)
\* with REBLOCK_DEPENDENTS, which counts the requeued job's dependencies (it
\* is available at 0) and brings back its dependents.  A job refused for a
\* failed dependency comes back when that dependency is requeued.
REQUEUE(j) ==
    /\ left.requeue > 0
    /\ jstate[j] \in Doomed
    /\ ~(j \notin RunAnyway /\ \E d \in Deps[j] : jstate[d] \in Doomed)
    /\ ~KeyTaken(j)     \* unique jobs: refused while another job holds its key
    /\ Spend("requeue")
    /\ LET js00 == [jstate EXCEPT ![j] = IF Deps[j] # {} THEN "blocked" ELSE "available"]
           js0 == IF j \in Gates THEN [js00 EXCEPT ![j] = "blocked"] ELSE js00  \* a gate
           st  == REBLOCK_DEPENDENTS(j, [js |-> js0, pd |-> pending,
                                         cs |-> [cause EXCEPT ![j] = NoJob]])
           \* jobs an operator cancelled (no DependencyFailed last) brought back
           taken == {x \in Jobs \ {j} : /\ jstate[x] = "cancelled" /\ cause[x] = NoJob
                                       /\ st.js[x] # "cancelled"}
       IN /\ jstate'  = st.js
          /\ pending' = st.pd
          /\ cause'   = st.cs
          /\ alarms'  = alarms \cup {[kind |-> "operator", act |-> "REBLOCK_DEPENDENTS",
                                      job |-> x] : x \in taken}
    /\ attempt'   = [attempt EXCEPT ![j] = 0]
    /\ isolated'  = [isolated EXCEPT ![j] = FALSE]
    /\ cancelReq' = [cancelReq EXCEPT ![j] = FALSE]
    /\ UNCHANGED <<owner, version, expired, lockedBy, ledger, business, held, frozen,
                   claims, holder, liveGid, completer, lostTo, cron>>

\* UPDATE ... SET state='cancelled' WHERE id AND state IN ('blocked', 'available')
\* with CANCEL_DEPENDENTS.
CANCEL(j) ==
    /\ left.cancel > 0
    /\ jstate[j] \in {"blocked", "available"}
    /\ Spend("cancel")
    /\ SetMoved(CANCEL_DEPENDENTS(j, "cancelled"), {})
    /\ UNCHANGED <<attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   ledger, business, held, frozen, claims, holder, liveGid,
                   completer, lostTo, cron>>

\* DELETE FROM conveyor_ledger / conveyor_job WHERE state IN (final states)
\* AND finished_at < now() - retention (FOR UPDATE SKIP LOCKED).  The model
\* does not prune a job that another job depends on.
PRUNE(j) ==
    /\ left.prune > 0
    /\ jstate[j] \in Final
    /\ \A x \in Jobs : j \notin Deps[x]
    /\ Spend("prune")
    /\ jstate' = [jstate EXCEPT ![j] = "pruned"]
    /\ ledger' = [ledger EXCEPT ![j] = 0]
    /\ UNCHANGED <<attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   pending, cause, business, held, frozen, ghost, cron>>

\* An operator asks to cancel a running job (any token; no state change):
\*   UPDATE ... SET cancel_requested_at = now(), cancel_requested_by, history
\*   WHERE id AND state = 'running'
\* It waits for the row lock of a guarded transaction.
REQUEST_CANCEL(j) ==
    /\ CancelRunning
    /\ left.request > 0
    /\ jstate[j] = "running"
    /\ lockedBy[j] = 0
    /\ ~cancelReq[j]
    /\ Spend("request")
    /\ cancelReq' = [cancelReq EXCEPT ![j] = TRUE]
    /\ UNCHANGED <<jstate, attempt, owner, version, expired, lockedBy, isolated,
                   pending, cause, ledger, business, held, frozen, ghost, cron>>

\* The scheduler enqueues tick t of the schedule, in one statement guarded
\* by the schedule row it read:
\*   WITH due AS (SELECT id FROM conveyor_cron WHERE id AND enabled AND
\*                next_tick_at = <what it read> FOR UPDATE SKIP LOCKED)
\*   INSERT INTO conveyor_job (..., idempotency_key = 'cron:<name>:<tick UTC>')
\*     SELECT ... FROM due ON CONFLICT (idempotency_key) DO NOTHING,
\*   UPDATE conveyor_cron SET last_tick_at = t, next_tick_at = <after t> FROM due
\* A scheduler that read a row another one has advanced since writes nothing.
CRON_ENQUEUE(w) ==
    /\ ~frozen[w]
    /\ seen[w] # 0
    /\ LET t == seen[w] IN
       IF nextTick = expect[w]
       THEN /\ cronJobs' = [cronJobs EXCEPT ![t] = IF @ = 0 THEN 1 ELSE @]
            /\ nextTick' = t + 1
       ELSE UNCHANGED <<cronJobs, nextTick>>
    /\ seen'   = [seen EXCEPT ![w] = 0]
    /\ expect' = [expect EXCEPT ![w] = 0]
    /\ UNCHANGED <<row, held, frozen, ghost, left, now>>

-----------------------------------------------------------------------------
(* Unique jobs: the statements after a keyed call's ENQUEUE met its key *)

\* The call ends: folded into the job that holds its key (the caller gets
\* that job, created = False), or back to ENQUEUE, which inserts it now.
\* Folding a call while no job holds its key in the blocking states (ghost
\* check, written out) would lose it.
HeldByOther(j) == \E x \in Jobs \ {j} : Uniq.key[x] = Uniq.key[j] /\ jstate[x] \in Uniq.states
Answer(j, fold, more) ==
    /\ jstate' = [jstate EXCEPT ![j] = IF fold THEN "folded" ELSE "absent"]
    /\ alarms' = alarms \cup more
                  \cup (IF fold /\ ~HeldByOther(j) THEN Raise("fold", "ENQUEUE", j) ELSE {})

\* on_duplicate = 'skip': the read of the job holding the key, a statement
\* of its own after the INSERT (a holder that committed while the INSERT
\* waited for it is visible to it):
\*   SELECT ... WHERE unique_key = <key> AND unique_states @> ARRAY[state]
\* Found: the call returns it.  None (it left its states in between): the
\* call is inserted again.
FoldDuplicate(j) ==
    /\ jstate[j] = "conflict"
    /\ j \notin Uniq.replace
    /\ Answer(j, KeyTaken(j), {})
    /\ UNCHANGED <<attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   pending, cause, ledger, business, held, frozen, claims, holder,
                   liveGid, completer, lostTo, left, cron>>

\* on_duplicate = 'replace' (debounce): the holder gets the call's arguments
\* and run_after if it has not started:
\*   UPDATE conveyor_job SET args, kwargs, run_after, ...
\*   WHERE unique_key = <key> AND unique_states @> ARRAY[state]
\*     AND state IN ('blocked', 'available')
\* The guard is re-checked under the row lock, so a CLAIM that committed
\* since the INSERT met the key wins (zero rows).  Then the key is read
\* again: a holder that is running is left alone and the call folded into
\* it (no new job: documented); none, and the call is inserted again.  The
\* replaced row's arguments are not modelled; the alarm says the statement
\* wrote a job that a worker may already run.
ReplaceGuard(x) == jstate[x] \in {"blocked", "available"}
ENQUEUE_REPLACE(j) ==
    /\ jstate[j] = "conflict"
    /\ j \in Uniq.replace
    /\ LET replaced == {x \in Holders(j) : ReplaceGuard(x)} IN
       Answer(j, KeyTaken(j),
              {[kind |-> "replace", act |-> "ENQUEUE_REPLACE", job |-> x] :
                 x \in {y \in replaced : jstate[y] \notin {"blocked", "available"}}})
    /\ UNCHANGED <<attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   pending, cause, ledger, business, held, frozen, claims, holder,
                   liveGid, completer, lostTo, left, cron>>

-----------------------------------------------------------------------------
(* The handler, the server and the environment *)

\* The worker process of w dies (kill -9, or a handler's os._exit), with
\* the attempts C whose handler killed it (at most one): each lease in its row stays with that
\* dead row until REAP, which reads the row's may_start (orphan.listed); the
\* restarted process registers a row of its own, with an empty list.  Ghost:
\* whether the lease holder's handler had started (C's has, at this Start),
\* and whether the lease was lost to another job's crash.
OrphanLeases(w, C) ==
    IF Isolation
    THEN /\ orphan' = [j \in Jobs |->
                        IF jstate[j] = "running" /\ owner[j] = w /\ ~orphan[j].dead
                        THEN [dead   |-> TRUE,
                              listed |-> j \in mayStart[w],
                              ran    |-> \E u \in held[w] :
                                          u.job = j /\ u.gid = holder[j]
                                          /\ (u.phase # "claimed" \/ u \in C),
                              victim |-> \E c \in C : c.job # j]
                        ELSE orphan[j]]
         /\ mayStart' = [mayStart EXCEPT ![w] = {}]
         /\ UNCHANGED refunds
    ELSE UNCHANGED starts

\* The worker lists a claimed job in its row before it may start it:
\*   UPDATE conveyor_worker SET may_start = <the jobs of its declared attempts
\*   and this one> WHERE id = w
\* then, in a later statement of the same transaction (a snapshot after the
\* row's lock, which REAP takes FOR SHARE), reads the job's row: is the lease
\* still running under this owner and token?  Yes: the attempt is declared.
\* No: the worker drops it unstarted (the list it wrote names the job; the
\* job's current lease is not w's).  One step: REAP waits for the row lock.
GuardDECLARE_STARTS(w, a) ==
    /\ jstate[a.job] = "running"
    /\ owner[a.job] = w
    /\ version[a.job] = a.tok

DECLARE_STARTS(w, a) ==
    /\ Isolation
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase = "claimed"
    /\ ~a.decl
    /\ mayStart' = [mayStart EXCEPT ![w] = {b.job : b \in {u \in held[w] : u.decl}} \cup {a.job}]
    /\ IF GuardDECLARE_STARTS(w, a)
       THEN Replace(w, a, [a EXCEPT !.decl = TRUE])
       ELSE Forget(w, a)
    /\ UNCHANGED <<row, frozen, ghost, left, cron, refunds, orphan>>

\* The worker hands a claimed job it has declared to a free handler.  A
\* handler in Crashers kills the worker process (os._exit): every job the
\* worker holds loses its attempt with it (REAP charges those it listed).
Start(w, a) ==
    /\ Isolation
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase = "claimed"
    /\ a.decl
    /\ IF a.job \in Crashers
       THEN LET mine == {u \in held[w] : u.phase \in {"locked", "effect"}}
            IN
            /\ held'     = [held EXCEPT ![w] = {}]
            /\ lockedBy' = [j \in Jobs |->
                              IF \E b \in mine : b.job = j /\ lockedBy[j] = b.gid
                              THEN 0 ELSE lockedBy[j]]
            /\ seen'     = [seen EXCEPT ![w] = 0]
            /\ expect'   = [expect EXCEPT ![w] = 0]
            /\ OrphanLeases(w, {a})
       ELSE /\ Replace(w, a, [a EXCEPT !.phase = "run"])
            /\ UNCHANGED <<lockedBy, seen, expect, starts>>
    /\ UNCHANGED <<jstate, attempt, owner, version, expired, isolated, cancelReq,
                   pending, cause, ledger, business, frozen, claims, holder, liveGid,
                   completer, lostTo, alarms, left, now, nextTick, cronJobs>>

\* PostgreSQL ends a guarded transaction whose session has been idle for
\* longer than idle_in_transaction_session_timeout (or whose statement ran
\* past statement_timeout): the backend exits, the transaction rolls back,
\* the row lock is released.  The worker does not know until it next uses
\* the connection; its commit then fails.
TxnTimeout(w, a) ==
    /\ TxnBound
    /\ a \in held[w]
    /\ a.phase \in {"locked", "effect"}
    /\ lockedBy' = [lockedBy EXCEPT ![a.job] = IF @ = a.gid THEN 0 ELSE @]
    /\ Replace(w, a, [a EXCEPT !.phase = "aborted"])
    /\ UNCHANGED <<jstate, attempt, owner, version, expired, isolated, cancelReq,
                   pending, cause, ledger, business, frozen, ghost, left, cron>>

\* Time passes a lease's expiry: no heartbeat came in time.
Tick(j) ==
    /\ jstate[j] = "running"
    /\ ~expired[j]
    /\ expired' = [expired EXCEPT ![j] = TRUE]
    /\ liveGid' = [liveGid EXCEPT ![j] = 0]
    /\ UNCHANGED <<jstate, attempt, owner, version, lockedBy, isolated, cancelReq,
                   pending, cause, ledger, business, held, frozen, claims, holder,
                   completer, lostTo, alarms, left, cron>>

\* kill -9: the process restarts at once with empty memory.  Its connections
\* close, so PostgreSQL rolls back its open transactions and their row locks
\* go; its leases are left to expire.
Crash(w) ==
    /\ left.crash > 0
    /\ Spend("crash")
    /\ held'     = [held EXCEPT ![w] = {}]
    /\ frozen'   = [frozen EXCEPT ![w] = FALSE]
    /\ lockedBy' = [j \in Jobs |->
                      IF \E b \in held[w] : b.job = j /\ lockedBy[j] = b.gid
                      THEN 0 ELSE lockedBy[j]]
    /\ seen'     = [seen EXCEPT ![w] = 0]
    /\ expect'   = [expect EXCEPT ![w] = 0]
    /\ OrphanLeases(w, {})
    /\ UNCHANGED <<jstate, attempt, owner, version, expired, isolated, cancelReq,
                   pending, cause, ledger, business, ghost, now, nextTick, cronJobs>>

\* SIGSTOP: the worker keeps its beliefs (and its open transactions) but
\* takes no step.  SIGCONT: it resumes with whatever it believed.
Freeze(w) ==
    /\ left.freeze > 0
    /\ ~frozen[w]
    /\ Spend("freeze")
    /\ frozen' = [frozen EXCEPT ![w] = TRUE]
    /\ UNCHANGED <<row, held, ghost, cron>>

Thaw(w) ==
    /\ frozen[w]
    /\ frozen' = [frozen EXCEPT ![w] = FALSE]
    /\ UNCHANGED <<row, held, ghost, left, cron>>

\* Cron: time reaches the next tick.
Clock ==
    /\ now < MaxTick
    /\ now' = now + 1
    /\ UNCHANGED <<row, held, frozen, ghost, left, nextTick, seen, expect, cronJobs>>

\* A scheduler pass reads the schedule row (SELECT ... WHERE next_tick_at <=
\* now()) and picks the tick to enqueue: the next one (missed = 'all') or the
\* latest one that is due (missed = 'latest').
SchedulerRead(w) ==
    /\ ~frozen[w]
    /\ seen[w] = 0
    /\ nextTick <= now
    /\ seen'   = [seen EXCEPT ![w] = IF MissedAll THEN nextTick ELSE now]
    /\ expect' = [expect EXCEPT ![w] = nextTick]
    /\ UNCHANGED <<row, held, frozen, ghost, left, now, nextTick, cronJobs>>

\* The schedule row is rewritten outside the scheduler -- the settings sync
\* at a worker's start, an edit or a re-enable in the admin -- and its
\* next_tick_at recomputed from the clock, back to a tick whose job exists
\* already.  Then only the idempotency key keeps the tick to one job.
CronSync ==
    /\ left.sync > 0
    /\ Spend("sync")
    /\ \E t \in 1..(nextTick - 1) : nextTick' = t
    /\ UNCHANGED <<row, held, frozen, ghost, now, seen, expect, cronJobs>>

\* Every job is final (or was never enqueued, or a refused enqueue) and no
\* tick is left: nothing more happens, which is not a deadlock.
Finished ==
    /\ \A j \in Jobs : \/ jstate[j] \in Final \cup {"pruned", "folded"}
                       \/ jstate[j] = "absent" /\ ~EnqueueAllowed(j)
    /\ now = MaxTick /\ nextTick > MaxTick
    /\ UNCHANGED vars

-----------------------------------------------------------------------------
(* Gates and checkpoints (issue 27) *)

\* A gate is a job no handler runs.  It is inserted 'blocked' and stays
\* 'blocked' when its last upstream step is satisfied (UNBLOCK, CANCEL_DEPENDENTS
\* for policy 'run' and REBLOCK_DEPENDENTS leave it blocked with
\* pending_dependencies = 0 and set its deadline, gate_deadline); so it is
\* never 'available', and CLAIM, which takes only available rows, never takes
\* it.  It waits while it is blocked with pending_dependencies = 0:
Waiting(g) == g \in Gates /\ jstate[g] = "blocked" /\ pending[g] = 0

\* The guards of the three statements that end the wait, kept apart so that
\* a mutation can weaken one:
\*   WHERE id = g AND state = 'blocked' AND pending_dependencies = 0 AND
\*   gate->>'kind' = <the kind> [AND gate->>'signal' = <name>] [AND gate_deadline <= now()]
\* (the kind, the name and the deadline are not modelled: any of the three may
\* end any gate, at any moment, which covers every kind and every clock).
GuardSIGNAL(g)        == Waiting(g)
GuardCONDITION_MET(g) == Waiting(g)
GuardGATE_TIMEOUT(g)  == Waiting(g)

\* The wait ends: the gate becomes st (completed: UNBLOCK releases its
\* dependents; failed: CANCEL_DEPENDENTS settles them), in the same statement.
\* Ghost: the outcome is counted, and one that lands while an upstream step
\* of the gate is unsatisfied raises an alarm.
GateEnds(g, st, act) ==
    /\ SetMoved(Moved(g, st),
                IF Unsat(g, jstate) # {} THEN Raise("gate early", act, g) ELSE {})
    /\ outcomes' = [outcomes EXCEPT ![g] = IF @ < 2 THEN @ + 1 ELSE 2]
    /\ UNCHANGED <<attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   ledger, business, held, frozen, claims, holder, liveGid, completer,
                   lostTo, left, cron, ckpt, ckptCount, stepEffect>>

\* send_signal(gate, name, payload), from a view, the API or the admin:
\*   UPDATE conveyor_job SET state = 'completed', return_value = payload
\*   (a rejection: state = 'failed', errors = errors || SignalRejected)
\*   WHERE <GuardSIGNAL>, with UNBLOCK (or CANCEL_DEPENDENTS).
\* Zero rows: refused with an error that says why (not a gate of that
\* signal, upstream not done, already signalled, timed out, cancelled);
\* nothing changes.
SIGNAL(g) ==
    /\ g \in Gates
    /\ signalsLeft > 0
    /\ signalsLeft' = signalsLeft - 1
    /\ IF GuardSIGNAL(g)
       THEN \E st \in {"completed", "failed"} : GateEnds(g, st, "SIGNAL")
       ELSE UNCHANGED <<row, held, frozen, ghost, left, cron, outcomes, ckpt, ckptCount,
                        stepEffect>>

\* The gates service found a row that matches a wait_until gate's condition,
\* under the gate's row lock (FOR UPDATE SKIP LOCKED, bounded batches):
\*   UPDATE ... SET state = 'completed', return_value = {matched} WHERE <guard>
\* with UNBLOCK; or the condition could not be evaluated (its field is gone):
\* state = 'failed' with a ConditionInvalid entry, with CANCEL_DEPENDENTS.
\* Whether a row matches is the environment's choice.
CONDITION_MET(g) ==
    /\ g \in Gates
    /\ GuardCONDITION_MET(g)
    /\ \E st \in {"completed", "failed"} : GateEnds(g, st, "CONDITION_MET")
    /\ UNCHANGED signalsLeft

\* The gates service, on the database's clock:
\*   WITH due AS (SELECT id ... WHERE state = 'blocked' AND gate_deadline <= now()
\*                ORDER BY gate_deadline LIMIT n FOR UPDATE SKIP LOCKED)
\*   UPDATE ... SET state = CASE WHEN sleep OR on_timeout = 'continue' THEN
\*   'completed' (the timeout marker as return value) ELSE 'failed' END
\* with UNBLOCK or CANCEL_DEPENDENTS.  A timer (workflows.sleep) is a gate
\* whose deadline completes it.
GATE_TIMEOUT(g) ==
    /\ g \in Gates
    /\ GuardGATE_TIMEOUT(g)
    /\ GateEnds(g, IF g \in ContinueOnTimeout THEN "completed" ELSE "failed", "GATE_TIMEOUT")
    /\ UNCHANGED signalsLeft

\* context.checkpoint(name, fn): the handler reads the ledger (no lock); a
\* recorded step returns its value and fn does not run.  Otherwise one
\* guarded transaction: BOUND_TRANSACTION, LOCK_FOR_EFFECT (id, running,
\* owner, token, no cancel request, FOR UPDATE), fn's own writes, and
\*   INSERT INTO conveyor_ledger (job, 'checkpoint:<name>', value, token, worker)
\*   SELECT ... FROM conveyor_job WHERE <the fence> ON CONFLICT DO NOTHING
\* then one commit; the job stays running.  The transaction holds the row
\* lock from its first statement to its commit, so no statement about the
\* job interleaves with it: one step here.  A crash or PostgreSQL's bound
\* inside it is the step not happening.  The lock refused: LeaseLost, nothing
\* commits, no outcome is written.  The record refused by the unique key
\* (job, effect key): the transaction rolls back, fn's writes with it.
GuardCHECKPOINT(w, a) == Fence(w, a) /\ ~cancelReq[a.job]

CHECKPOINT(w, a) ==
    /\ Checkpoints
    /\ ~frozen[w]
    /\ a \in held[w]
    /\ a.phase = "run"
    /\ ckpt[a.job] = 0                   \* the handler's read found no record
    /\ LET j == a.job IN
       IF GuardCHECKPOINT(w, a)
       THEN /\ lockedBy[j] = 0            \* FOR UPDATE waits for another lock holder
            /\ IF ckpt[j] = 0             \* the ledger's unique (job, effect key)
               THEN /\ ckpt'       = [ckpt EXCEPT ![j] = a.gid]
                    /\ ckptCount'  = [ckptCount EXCEPT ![j] = IF @ < 2 THEN @ + 1 ELSE 2]
                    /\ stepEffect' = [stepEffect EXCEPT ![j] = IF @ < 2 THEN @ + 1 ELSE 2]
                    /\ alarms'     = alarms \cup
                         (IF holder[j] # a.gid THEN Raise("stale step", "CHECKPOINT", j)
                          ELSE {})
               ELSE UNCHANGED <<ckpt, ckptCount, stepEffect, alarms>>
            /\ UNCHANGED held
       ELSE /\ Forget(w, a)
            /\ UNCHANGED <<ckpt, ckptCount, stepEffect, alarms>>
    /\ UNCHANGED <<jstate, attempt, owner, version, expired, lockedBy, isolated, cancelReq,
                   pending, cause, ledger, business, frozen, claims, holder, liveGid,
                   completer, lostTo, left, cron, outcomes, signalsLeft>>

WaitStep ==
    \/ \E j \in Jobs : SIGNAL(j) \/ CONDITION_MET(j) \/ GATE_TIMEOUT(j)
    \/ \E w \in Workers : \E a \in held[w] : CHECKPOINT(w, a)

\* A gate's own transitions: its wait ends completed or failed.
GateEdges == {<<"blocked", "completed">>, <<"blocked", "failed">>}

-----------------------------------------------------------------------------
(* The specification *)

\* An attempt's step of progress: its handler starts, locks, writes, ends.
Progress(w, a) ==
    \/ LOCK_FOR_EFFECT(w, a) \/ Effect(w, a) \/ COMPLETE(w, a)
    \/ RETRY(w, a) \/ FAIL(w, a) \/ RECORD_RESULT(w, a)

\* The steps that write what a worker may have started (starts): the others
\* keep it.
StartStep ==
    \/ \E w \in Workers :
         \/ \E a \in held[w] : DECLARE_STARTS(w, a) \/ Start(w, a)
         \/ Crash(w)
    \/ \E j \in Jobs : REAP(j)

WorkerStep(w) ==
    \/ \E a \in held[w] :
         \/ Progress(w, a) \/ HEARTBEAT(w, a) \/ SNOOZE(w, a) \/ RELEASE(w, a)
         \/ CANCEL_HELD(w, a) \/ TxnTimeout(w, a)
         \/ HEARTBEAT_PROGRESS(w, a)
    \/ \E j \in Jobs : CLAIM(w, j) \/ CLAIM_ISOLATED(w, j)
    \/ SchedulerRead(w) \/ CRON_ENQUEUE(w)
    \/ Freeze(w) \/ Thaw(w)

JobStep(j) ==
    \/ ENQUEUE(j) \/ Tick(j) \/ REQUEUE(j) \/ CANCEL(j) \/ PRUNE(j)
    \/ REQUEST_CANCEL(j)
    \/ FoldDuplicate(j) \/ ENQUEUE_REPLACE(j)     \* unique jobs

CoreNext ==
    \/ \E w \in Workers : WorkerStep(w)
    \/ \E j \in Jobs : JobStep(j)
    \/ Clock \/ CronSync
    \/ Finished

\* The core steps keep the gates' and checkpoints' variables; a REQUEUE that
\* brings a gate back from failed, dead or cancelled starts its new wait.
KeepWaits ==
    /\ outcomes' = [g \in Jobs |-> IF jstate[g] \in Doomed /\ jstate'[g] \notin Doomed
                                   THEN 0 ELSE outcomes[g]]
    /\ UNCHANGED <<signalsLeft, ckpt, ckptCount, stepEffect>>

\* Every other step keeps the rate log (the ghost counts what it starts).
KeepFlow == UNCHANGED rateLog /\ CountStarts

Next == (CoreNext /\ KeepWaits /\ KeepFlow /\ UNCHANGED starts)
        \/ (StartStep /\ KeepWaits /\ KeepFlow)
        \/ (WaitStep /\ KeepFlow /\ UNCHANGED starts)
        \/ (FlowStep /\ UNCHANGED <<waits, starts>>)

ClaimSome ==
    \/ \E w \in Workers, j \in Jobs : CLAIM(w, j) \/ CLAIM_ISOLATED(w, j)
    \/ \E w \in Workers : \E S \in SUBSET Lim.jobs : CLAIM_LIMITED(w, S)

\* Fairness, the premises of "no job is lost": time passes; the reaper runs;
\* some free slot claims an available job; a worker that is not frozen makes
\* progress with the jobs it holds (handlers terminate); PostgreSQL enforces
\* the timeout of a guarded transaction whose worker is frozen; schedulers
\* run.  Nothing makes a frozen worker thaw (SIGSTOP may last for ever), and
\* crashes, freezes, releases, snoozes and operator actions are bounded by
\* their budgets.
Fairness ==
    /\ \A j \in Jobs : WF_vars(Tick(j) /\ UNCHANGED starts) /\ WF_vars(REAP(j))
    /\ WF_vars(ClaimSome /\ UNCHANGED starts)
    /\ \A w \in Workers :
         /\ WF_vars(\E a \in held[w] : (Progress(w, a) /\ UNCHANGED starts)
                                       \/ DECLARE_STARTS(w, a) \/ Start(w, a))
         /\ WF_vars(frozen[w] /\ \E a \in held[w] : TxnTimeout(w, a) /\ UNCHANGED starts)
         /\ WF_vars((SchedulerRead(w) \/ CRON_ENQUEUE(w)) /\ UNCHANGED starts)
    /\ WF_vars(Clock /\ UNCHANGED starts)
    /\ \A j \in Jobs : WF_vars(GATE_TIMEOUT(j) /\ UNCHANGED starts)
    /\ WF_allVars(NewWindow)

Spec == Init /\ [][Next]_allVars /\ Fairness

-----------------------------------------------------------------------------
(* Properties *)

Alarmed(kind) == \E r \in alarms : r.kind = kind

\* Attempt a of worker w holds a valid lease: the row names w and a's token,
\* the job is running and the lease has not expired.
\* (Written out, not through Fence: a mutation of the guard must not change
\* what the property means.)
ValidLease(w, a) ==
    /\ jstate[a.job] = "running"
    /\ owner[a.job] = w
    /\ version[a.job] = a.tok
    /\ ~expired[a.job]

\* (a) At most one attempt holds a valid lease on a job, and it is the
\* attempt that made the latest claim; no one believes in a token not yet
\* issued; and no claim is granted while another attempt's lease is still
\* live in real time (ghost liveGid, which REAP does not touch).
LeaseExclusive ==
    /\ \A w1, w2 \in Workers : \A a1 \in held[w1], a2 \in held[w2] :
         (a1.job = a2.job /\ ValidLease(w1, a1) /\ ValidLease(w2, a2))
         => (w1 = w2 /\ a1 = a2)
    /\ \A w \in Workers : \A a \in held[w] :
         /\ ValidLease(w, a) => a.gid = claims[a.job]
         /\ a.tok <= version[a.job]
    /\ \A j \in Jobs : holder[j] # 0 => jstate[j] = "running"
    /\ ~Alarmed("double")

\* (b) Every write a worker makes about a job (heartbeat, lock, outcome,
\* result) lands only if it comes from the attempt that holds the lease --
\* judged by the ghost claim ids, not by the columns the guard compares.
FencedWrites == ~Alarmed("stale")

\* (c) The effect of a guarded transaction is committed at most once, only
\* together with the completion of the job by the same attempt, and a job
\* completed that way has it exactly once.  Ledger rows of a pruned job are
\* deleted with it; its business rows stay.
EffectOnce ==
    \A j \in Jobs :
        /\ business[j] <= 1
        /\ jstate[j] # "pruned" =>
             /\ (business[j] = 1) <=> (ledger[j] # 0)
             /\ ledger[j] # 0 => jstate[j] = "completed" /\ ledger[j] = completer[j]

\* (d) The row lock of a guarded transaction keeps the job with its attempt
\* until the transaction ends: nothing takes the lease of a locked job.
LockHeld ==
    \A w \in Workers : \A a \in held[w] :
        a.phase \in {"locked", "effect"} =>
            /\ lockedBy[a.job] = a.gid
            /\ holder[a.job] = a.gid

\* Crash containment: an isolated job is never claimed by CLAIM; a worker
\* never holds the leases of two jobs that were isolated when claimed (ghost
\* wasIso and holder, not the worker's own beliefs); and so a job loses at
\* most one charged attempt to another job's crash (ghost lostTo, counted by
\* REAP when it charges an attempt whose lease another job's crash ended).
CrashContained ==
    /\ ~Alarmed("isolated")
    /\ \A w \in Workers :
         Cardinality({a \in held[w] : a.wasIso /\ holder[a.job] = a.gid}) <= 1
    /\ \A j \in Jobs : lostTo[j] <= 1

\* A handler runs only a job its worker's row lists: every started attempt
\* whose lease is current (ghost holder) has its job in its worker's
\* may_start; and REAP gives back an attempt only if its handler never
\* started (ghost Ran: the alarm "refund").
StartedDeclared ==
    /\ ~Alarmed("refund")
    /\ Isolation =>
         \A w \in Workers : \A a \in held[w] :
            (a.phase # "claimed" /\ holder[a.job] = a.gid) => a.job \in mayStart[w]

\* Workflows.  A job leaves 'blocked' for 'available' only when each of its
\* dependencies is completed (policy 'cancel') or final (policy 'run'), and
\* an available job (the only kind CLAIM takes) has them so: a requeued
\* dependency makes a not-yet-started 'run' dependent wait again.
DependentsWait ==
    /\ ~Alarmed("early")
    /\ \A x \in Jobs : jstate[x] = "available" => Unsat(x, jstate) = {}

\* A dependent leaves 'blocked' for 'available' only in the statement that
\* makes its last dependency final: a COMPLETE that lands for the attempt
\* holding that dependency's lease (ghost holder: UNBLOCK behind a
\* current-token COMPLETE), or, for policy 'run', a write that makes the
\* dependency failed, dead or cancelled (CANCEL_DEPENDENTS); or, for a gate,
\* the statement that ends its wait.
UnblockFenced ==
    [][\A x \in Jobs :
         (jstate[x] = "blocked" /\ jstate'[x] = "available") =>
           \E d \in Deps[x] :
              \/ /\ jstate[d] = "running" /\ jstate'[d] = "completed"
                 /\ holder[d] # 0 /\ completer'[d] = holder[d]
              \/ /\ x \in RunAnyway
                 /\ jstate[d] \notin Final /\ jstate'[d] \in Doomed
              \/ /\ d \in Gates     \* a gate's wait ends (SIGNAL, CONDITION_MET, GATE_TIMEOUT)
                 /\ jstate[d] = "blocked" /\ jstate'[d] = "completed"]_vars

\* A blocked job's pending_dependencies is the number of its dependencies
\* that are not yet satisfied.
CounterExact ==
    \A x \in Jobs : jstate[x] = "blocked" => pending[x] = Cardinality(Unsat(x, jstate))

\* No blocked job with policy 'cancel' waits on a dependency that failed.
NoDoomedBlocked ==
    \A x \in Jobs : (jstate[x] = "blocked" /\ x \notin RunAnyway)
        => \A d \in Deps[x] : jstate[d] \notin Doomed

\* A job cancelled because of a dependency names, when it is cancelled, a
\* dependency that the same statement leaves failed, dead or cancelled; and
\* while it stays cancelled, one of its dependencies is failed, dead or
\* cancelled (requeueing that one brings it back).  The name is not
\* rewritten: after the named one is requeued, it may be another.
CascadeCause ==
    /\ ~Alarmed("cause")
    /\ \A x \in Jobs : (jstate[x] = "cancelled" /\ cause[x] # NoJob)
         => cause[x] \in Deps[x] /\ \E d \in Deps[x] : jstate[d] \in Doomed

\* A job an operator cancelled stays cancelled until it is requeued itself:
\* REQUEUE of a dependency brings back only jobs a dependency's failure
\* cancelled.
OperatorCancelStands == ~Alarmed("operator")

\* Cancelling a running job: no guarded effect commits after the request,
\* a job with a request is never claimed again (until REQUEUE clears it),
\* and it never ends completed: the request is answered "will end
\* cancelled", so its dependents are settled as for a cancel, never unblocked.
CancelHonoured ==
    /\ ~Alarmed("cancelled effect") /\ ~Alarmed("rerun")
    /\ \A j \in Jobs : cancelReq[j] => jstate[j] # "completed"

\* Cron: at most one job per (schedule, tick), never before its tick.
OneJobPerTick ==
    \A t \in 1..MaxTick : cronJobs[t] <= 1 /\ (cronJobs[t] = 1 => t <= now)

\* A keyed call's pseudo-states (Calls): ENQUEUE met the key, the call is
\* answered with the holder or inserted again.
CallEdges == {<<"absent", "conflict">>, <<"conflict", "folded">>, <<"conflict", "absent">>}

\* The only transitions of DESIGN §3 (plus PRUNE's delete), and available ->
\* blocked: REBLOCK_DEPENDENTS makes a 'run' dependent that no worker has
\* claimed (state available, no lease, under its row lock, which CLAIM's
\* SKIP LOCKED respects) wait again for the dependency that was requeued.
Edges ==
    {<<"absent", "available">>, <<"absent", "blocked">>,
     <<"blocked", "available">>, <<"blocked", "cancelled">>,
     <<"available", "blocked">>,   \* REBLOCK_DEPENDENTS: a 'run' dependent not yet started
     <<"available", "running">>, <<"available", "cancelled">>,
     <<"running", "available">>, <<"running", "completed">>,
     <<"running", "failed">>, <<"running", "dead">>, <<"running", "cancelled">>,
     <<"failed", "available">>, <<"dead", "available">>, <<"cancelled", "available">>,
     <<"failed", "blocked">>, <<"dead", "blocked">>, <<"cancelled", "blocked">>}
    \cup {<<f, "pruned">> : f \in Final}
    \cup CallEdges   \* unique jobs: a keyed call that inserted no row

LegalTransitions ==
    [][\A j \in Jobs : jstate'[j] # jstate[j] =>
         <<jstate[j], jstate'[j]>> \in Edges \cup (IF j \in Gates THEN GateEdges ELSE {})]_vars

\* Unique jobs.  At most one job per unique key is in the key's blocking
\* states (written out, not through Indexed: a mutation of the index must not
\* change what the property means).
UniqueKeyHeld ==
    \A x, y \in Jobs :
        (/\ x # y /\ Uniq.key[x] # NoKey /\ Uniq.key[x] = Uniq.key[y]
         /\ jstate[x] \in Uniq.states /\ jstate[y] \in Uniq.states) => FALSE

\* A call is answered without a job of its own only while another job holds
\* its key in the blocking states: a job that left them freed the key.
DuplicateOfHolder == ~Alarmed("fold")

\* A replace (debounce) writes only a job that has not started.
ReplacePending == ~Alarmed("replace")

\* Liveness: a job that is waiting or running eventually ends final (or is
\* pruned after it did); every tick of the schedule eventually has its job
\* (missed = 'all').
AllEventuallyFinal ==
    \A j \in Jobs :
        [](jstate[j] \in {"blocked", "available", "running"}
             => <>(jstate[j] \in Final \cup {"pruned"}))

EveryTickEnqueued ==
    MissedAll => \A t \in 1..MaxTick : <>(cronJobs[t] >= 1)

\* Gates.  No gate is ever available or running: CLAIM never takes one, and
\* no worker holds one.
GateNeverClaimed ==
    \A g \in Gates :
        /\ jstate[g] \notin {"available", "running"}
        /\ \A w \in Workers : \A a \in held[w] : a.job # g

\* A gate's wait ends at most once (one of signal, rejection, condition,
\* timeout); a second signal, or a signal after the timeout, is refused.
GateOnce == \A g \in Gates : outcomes[g] <= 1

\* A gate's wait ends only after its own upstream steps are satisfied (a
\* signal that comes earlier is refused).  Its dependents run only after it
\* ends: DependentsWait, since a gate is one of their dependencies.
GateAfterUpstream == ~Alarmed("gate early")

\* Checkpoints.  A step is recorded at most once per job, only by the
\* attempt that holds the lease, and its own writes commit exactly when its
\* record does.
CheckpointOnce ==
    /\ ~Alarmed("stale step")
    /\ \A j \in Jobs : ckptCount[j] <= 1 /\ stepEffect[j] = ckptCount[j]

\* Flow control, written out (not through CLAIM_LIMITED's count): the rows
\* of the limited queue in state 'running' never exceed its concurrency,
\* those of one concurrency key never its key_concurrency, and no window
\* starts more of its jobs than its rate (ghost winClaims, whatever
\* statement started them).
LimitHeld ==
    Lim.conc > 0 => Cardinality({x \in Lim.jobs : jstate[x] = "running"}) <= Lim.conc

KeyLimitHeld ==
    Lim.keyConc > 0 =>
        \A x \in Lim.jobs :
            Lim.key[x] # NoKey =>
                Cardinality({y \in Lim.jobs : Lim.key[y] = Lim.key[x] /\ jstate[y] = "running"})
                    <= Lim.keyConc

RateHeld == Lim.rate > 0 => winClaims <= Lim.rate

THEOREM Spec => [](LimitHeld /\ KeyLimitHeld /\ RateHeld)
THEOREM Spec => [](GateNeverClaimed /\ GateOnce /\ GateAfterUpstream /\ CheckpointOnce)
THEOREM Spec => [](TypeOK /\ LeaseExclusive /\ FencedWrites /\ EffectOnce /\ LockHeld
                   /\ CrashContained /\ StartedDeclared /\ DependentsWait /\ CounterExact
                   /\ NoDoomedBlocked /\ CascadeCause /\ OperatorCancelStands
                   /\ CancelHonoured /\ OneJobPerTick
                   /\ UniqueKeyHeld /\ DuplicateOfHolder /\ ReplacePending)
THEOREM Spec => LegalTransitions /\ UnblockFenced
THEOREM Spec => AllEventuallyFinal /\ EveryTickEnqueued
=============================================================================
