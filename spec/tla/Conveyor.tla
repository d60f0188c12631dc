------------------------------ MODULE Conveyor ------------------------------
(***************************************************************************)
(* The django-conveyor lease protocol.                                     *)
(*                                                                         *)
(* One row of conveyor_job per job, a set of workers that each run a few   *)
(* handler slots, a reaper, and an environment that kills workers (-9),    *)
(* freezes them (SIGSTOP) and lets leases expire.  Every action is one SQL *)
(* statement, executed atomically by PostgreSQL, and carries the name of   *)
(* the statement constant in django_conveyor/protocol.py that it models:   *)
(*                                                                         *)
(*   ENQUEUE  CLAIM  HEARTBEAT  COMPLETE (= LOCK_FOR_EFFECT + COMPLETE in  *)
(*   one transaction)  RETRY  FAIL  RELEASE  REAP                          *)
(*                                                                         *)
(* A worker's local belief (the job and token a slot thinks it holds) is   *)
(* kept apart from the row, so a worker that was frozen, or whose lease    *)
(* expired while it was slow, is a zombie: it still believes, and still    *)
(* tries to write its outcome with its old token.                          *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Jobs,           \* job ids
    Workers,        \* worker ids (lease_owner values)
    Slots,          \* handler slots per worker (its concurrency)
    MaxAttempts,    \* conveyor_job.max_attempts
    CrashBudget,    \* kill -9 events per behaviour
    FreezeBudget,   \* SIGSTOP events per behaviour
    ReleaseBudget,  \* graceful hand-backs (shutdowns) per behaviour
    NoWorker,       \* lease_owner IS NULL
    NoJob,          \* a slot that believes it holds nothing
    CheckVersion    \* TRUE: the real COMPLETE.  FALSE: a broken COMPLETE
                    \* whose WHERE clause forgot "AND lease_version = %s"

ASSUME
    /\ IsFiniteSet(Jobs) /\ IsFiniteSet(Workers) /\ IsFiniteSet(Slots)
    /\ MaxAttempts \in Nat \ {0}
    /\ {CrashBudget, FreezeBudget, ReleaseBudget} \subseteq Nat
    /\ NoWorker \notin Workers
    /\ NoJob \notin Jobs
    /\ CheckVersion \in BOOLEAN

VARIABLES
    \* ---- the database row, conveyor_job ----
    jstate,         \* state column
    attempt,        \* attempt column
    owner,          \* lease_owner
    version,        \* lease_version: the fencing token
    expired,        \* lease_expires_at < now() (abstract time)
    effects,        \* ledger rows written by the job's handler
    \* ---- the workers ----
    view,           \* view[w][s]: the job and token slot s of w believes it holds
    frozen,         \* frozen[w]: w was sent SIGSTOP
    \* ---- history, for the invariants only ----
    writes,         \* every outcome/effect write that landed
    \* ---- environment budgets ----
    crashesLeft, freezesLeft, releasesLeft

rowVars    == <<jstate, attempt, owner, version, expired, effects>>
workerVars == <<view, frozen>>
budgetVars == <<crashesLeft, freezesLeft, releasesLeft>>
vars       == <<rowVars, workerVars, writes, budgetVars>>

States     == {"absent", "available", "running", "completed", "failed", "dead"}
Final      == {"completed", "failed", "dead"}
MaxVersion == MaxAttempts + ReleaseBudget   \* claims per job are bounded by this
Empty      == [job |-> NoJob, tok |-> 0]
View       == [job : Jobs \cup {NoJob}, tok : 0..MaxVersion]
Write      == [job : Jobs, kind : {"complete", "retry", "fail", "release"},
               by : Workers, token : 0..MaxVersion,
               rowOwner : Workers \cup {NoWorker}, rowVersion : 0..MaxVersion]

TypeOK ==
    /\ jstate  \in [Jobs -> States]
    /\ attempt \in [Jobs -> 0..MaxAttempts]
    /\ owner   \in [Jobs -> Workers \cup {NoWorker}]
    /\ version \in [Jobs -> 0..MaxVersion]
    /\ expired \in [Jobs -> BOOLEAN]
    /\ effects \in [Jobs -> Nat]
    /\ view    \in [Workers -> [Slots -> View]]
    /\ frozen  \in [Workers -> BOOLEAN]
    /\ writes  \subseteq Write
    /\ crashesLeft  \in 0..CrashBudget
    /\ freezesLeft  \in 0..FreezeBudget
    /\ releasesLeft \in 0..ReleaseBudget

Init ==
    /\ jstate  = [j \in Jobs |-> "absent"]
    /\ attempt = [j \in Jobs |-> 0]
    /\ owner   = [j \in Jobs |-> NoWorker]
    /\ version = [j \in Jobs |-> 0]
    /\ expired = [j \in Jobs |-> FALSE]
    /\ effects = [j \in Jobs |-> 0]
    /\ view    = [w \in Workers |-> [s \in Slots |-> Empty]]
    /\ frozen  = [w \in Workers |-> FALSE]
    /\ writes  = {}
    /\ crashesLeft  = CrashBudget
    /\ freezesLeft  = FreezeBudget
    /\ releasesLeft = ReleaseBudget

-----------------------------------------------------------------------------
(* Helpers *)

Holds(w, s) == view[w][s].job # NoJob
JobOf(w, s) == view[w][s].job
TokOf(w, s) == view[w][s].tok

\* The WHERE clause of HEARTBEAT, COMPLETE, RETRY, FAIL and RELEASE:
\*   id = j AND state = 'running' AND lease_owner = w AND lease_version = tok
Fence(w, s, j) ==
    /\ jstate[j] = "running"
    /\ owner[j] = w
    /\ version[j] = TokOf(w, s)

CompleteGuard(w, s, j) ==
    IF CheckVersion THEN Fence(w, s, j)
                    ELSE jstate[j] = "running" /\ owner[j] = w

\* The slot forgets its job: outcome written, write rejected, or lease lost.
Forget(w, s) == view' = [view EXCEPT ![w][s] = Empty]

\* The row leaves 'running': the lease columns are cleared.
EndLease(j) ==
    /\ owner'   = [owner EXCEPT ![j] = NoWorker]
    /\ expired' = [expired EXCEPT ![j] = FALSE]

\* A write landed: remember the token it was written with and the row's
\* lease columns at that moment.
Record(w, s, j, kind) ==
    writes' = writes \cup {[job |-> j, kind |-> kind, by |-> w,
                            token |-> TokOf(w, s), rowOwner |-> owner[j],
                            rowVersion |-> version[j]]}

\* Attempts used up: a retry or a reaped lease makes the job dead.
AfterFailure(j) == IF attempt[j] >= MaxAttempts THEN "dead" ELSE "available"

-----------------------------------------------------------------------------
(* The protocol statements *)

\* INSERT INTO conveyor_job (..., state) VALUES (..., 'available')
ENQUEUE(j) ==
    /\ jstate[j] = "absent"
    /\ jstate' = [jstate EXCEPT ![j] = "available"]
    /\ UNCHANGED <<attempt, owner, version, expired, effects,
                   workerVars, writes, budgetVars>>

\* UPDATE ... SET state='running', attempt=attempt+1, lease_owner=w,
\*   lease_version=lease_version+1, lease_expires_at=now()+lease
\* FROM (SELECT id ... WHERE state='available' ... FOR UPDATE SKIP LOCKED)
CLAIM(w, s, j) ==
    /\ ~frozen[w]
    /\ ~Holds(w, s)
    /\ jstate[j] = "available"
    /\ jstate'  = [jstate EXCEPT ![j] = "running"]
    /\ attempt' = [attempt EXCEPT ![j] = @ + 1]
    /\ owner'   = [owner EXCEPT ![j] = w]
    /\ version' = [version EXCEPT ![j] = @ + 1]
    /\ expired' = [expired EXCEPT ![j] = FALSE]
    /\ view'    = [view EXCEPT ![w][s] = [job |-> j, tok |-> version[j] + 1]]
    /\ UNCHANGED <<effects, frozen, writes, budgetVars>>

\* UPDATE ... SET lease_expires_at = now()+lease
\*   WHERE id=j AND state='running' AND lease_owner=w AND lease_version=tok
\* Zero rows: the lease is lost; the handler is told and writes nothing.
HEARTBEAT(w, s) ==
    /\ ~frozen[w]
    /\ Holds(w, s)
    /\ LET j == JobOf(w, s) IN
         IF Fence(w, s, j)
         THEN /\ expired' = [expired EXCEPT ![j] = FALSE]
              /\ UNCHANGED view
         ELSE /\ Forget(w, s)
              /\ UNCHANGED expired
    /\ UNCHANGED <<jstate, attempt, owner, version, effects,
                   frozen, writes, budgetVars>>

\* LOCK_FOR_EFFECT + COMPLETE, one transaction: lock the row guarded by the
\* token, apply the handler's ORM writes (the effect), then
\*   UPDATE ... SET state='completed' WHERE id, state='running', owner, version
\* If the guard fails the transaction rolls back, effect included.
COMPLETE(w, s) ==
    /\ ~frozen[w]
    /\ Holds(w, s)
    /\ LET j == JobOf(w, s) IN
         IF CompleteGuard(w, s, j)
         THEN /\ jstate'  = [jstate EXCEPT ![j] = "completed"]
              /\ effects' = [effects EXCEPT ![j] = @ + 1]
              /\ EndLease(j)
              /\ Record(w, s, j, "complete")
         ELSE UNCHANGED <<jstate, effects, owner, expired, writes>>
    /\ Forget(w, s)
    /\ UNCHANGED <<attempt, version, frozen, budgetVars>>

\* UPDATE ... SET state = CASE WHEN attempt >= max_attempts THEN 'dead'
\*   ELSE 'available' END, run_after = now()+backoff, errors = errors || ...
\*   WHERE id, state='running', lease_owner, lease_version
RETRY(w, s) ==
    /\ ~frozen[w]
    /\ Holds(w, s)
    /\ LET j == JobOf(w, s) IN
         IF Fence(w, s, j)
         THEN /\ jstate' = [jstate EXCEPT ![j] = AfterFailure(j)]
              /\ EndLease(j)
              /\ Record(w, s, j, "retry")
         ELSE UNCHANGED <<jstate, owner, expired, writes>>
    /\ Forget(w, s)
    /\ UNCHANGED <<attempt, version, effects, frozen, budgetVars>>

\* The handler raised Discard:
\*   UPDATE ... SET state='failed' WHERE id, state='running', owner, version
FAIL(w, s) ==
    /\ ~frozen[w]
    /\ Holds(w, s)
    /\ LET j == JobOf(w, s) IN
         IF Fence(w, s, j)
         THEN /\ jstate' = [jstate EXCEPT ![j] = "failed"]
              /\ EndLease(j)
              /\ Record(w, s, j, "fail")
         ELSE UNCHANGED <<jstate, owner, expired, writes>>
    /\ Forget(w, s)
    /\ UNCHANGED <<attempt, version, effects, frozen, budgetVars>>

\* Graceful shutdown hands an unfinished lease back at once:
\*   UPDATE ... SET state='available', attempt=attempt-1
\*   WHERE id, state='running', lease_owner, lease_version
\* (the hand-back does not use up an attempt).
RELEASE(w, s) ==
    /\ ~frozen[w]
    /\ Holds(w, s)
    /\ releasesLeft > 0
    /\ releasesLeft' = releasesLeft - 1
    /\ LET j == JobOf(w, s) IN
         IF Fence(w, s, j)
         THEN /\ jstate'  = [jstate EXCEPT ![j] = "available"]
              /\ attempt' = [attempt EXCEPT ![j] = @ - 1]
              /\ EndLease(j)
              /\ Record(w, s, j, "release")
         ELSE UNCHANGED <<jstate, attempt, owner, expired, writes>>
    /\ Forget(w, s)
    /\ UNCHANGED <<version, effects, frozen, crashesLeft, freezesLeft>>

\* UPDATE ... SET state = CASE WHEN attempt >= max_attempts THEN 'dead'
\*   ELSE 'available' END, lease_owner = NULL, errors = errors || 'lease lost'
\*   WHERE state='running' AND lease_expires_at < now()   (database time)
\* No owner in the guard: the reaper acts for nobody.
REAP(j) ==
    /\ jstate[j] = "running"
    /\ expired[j]
    /\ jstate' = [jstate EXCEPT ![j] = AfterFailure(j)]
    /\ EndLease(j)
    /\ UNCHANGED <<attempt, version, effects, workerVars, writes, budgetVars>>

-----------------------------------------------------------------------------
(* The environment *)

\* Time passes a lease's expiry: no heartbeat came in time.
Tick(j) ==
    /\ jstate[j] = "running"
    /\ ~expired[j]
    /\ expired' = [expired EXCEPT ![j] = TRUE]
    /\ UNCHANGED <<jstate, attempt, owner, version, effects,
                   workerVars, writes, budgetVars>>

\* kill -9: the process restarts at once with empty memory; its leases
\* are simply left to expire.
Crash(w) ==
    /\ crashesLeft > 0
    /\ crashesLeft' = crashesLeft - 1
    /\ view'   = [view EXCEPT ![w] = [s \in Slots |-> Empty]]
    /\ frozen' = [frozen EXCEPT ![w] = FALSE]
    /\ UNCHANGED <<rowVars, writes, freezesLeft, releasesLeft>>

\* SIGSTOP: the worker keeps its beliefs but takes no step.
Freeze(w) ==
    /\ freezesLeft > 0
    /\ ~frozen[w]
    /\ freezesLeft' = freezesLeft - 1
    /\ frozen' = [frozen EXCEPT ![w] = TRUE]
    /\ UNCHANGED <<rowVars, view, writes, crashesLeft, releasesLeft>>

\* SIGCONT: it resumes with whatever it believed.
Thaw(w) ==
    /\ frozen[w]
    /\ frozen' = [frozen EXCEPT ![w] = FALSE]
    /\ UNCHANGED <<rowVars, view, writes, budgetVars>>

\* All jobs are final and nothing else happens: not a deadlock.
Finished ==
    /\ \A j \in Jobs : jstate[j] \in Final
    /\ UNCHANGED vars

-----------------------------------------------------------------------------
(* The specification *)

\* The outcome a handler reports when it returns or raises.
Finish(w, s) == COMPLETE(w, s) \/ RETRY(w, s) \/ FAIL(w, s)

ClaimJob(j) == \E w \in Workers, s \in Slots : CLAIM(w, s, j)

Next ==
    \/ \E j \in Jobs : ENQUEUE(j) \/ ClaimJob(j) \/ REAP(j) \/ Tick(j)
    \/ \E w \in Workers :
         \/ Crash(w) \/ Freeze(w) \/ Thaw(w)
         \/ \E s \in Slots : HEARTBEAT(w, s) \/ Finish(w, s) \/ RELEASE(w, s)
    \/ Finished

\* Fairness: the client's INSERT commits; time passes; the reaper runs;
\* an available job is claimed by some free slot; a frozen worker is woken
\* (SIGCONT) in the end; a handler terminates.  Crashes, freezes and
\* releases are bounded by their budgets, so they cannot go on for ever.
Fairness ==
    /\ \A j \in Jobs :
         /\ WF_vars(ENQUEUE(j))
         /\ WF_vars(Tick(j))
         /\ SF_vars(REAP(j))
         /\ SF_vars(ClaimJob(j))
    /\ \A w \in Workers :
         /\ WF_vars(Thaw(w))
         /\ \A s \in Slots : WF_vars(Finish(w, s))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* Properties *)

\* Slot s of w holds a valid lease on j: the row names w and its token, the
\* job is running and the lease has not expired.
ValidLease(w, s, j) ==
    /\ JobOf(w, s) = j
    /\ jstate[j] = "running"
    /\ owner[j] = w
    /\ version[j] = TokOf(w, s)
    /\ ~expired[j]

\* (a) At most one worker (slot) holds an unexpired lease on a job; a token
\* is never handed out twice, and no one believes in a token not yet issued.
LeaseExclusive ==
    /\ \A j \in Jobs : \A w1, w2 \in Workers : \A s1, s2 \in Slots :
         (ValidLease(w1, s1, j) /\ ValidLease(w2, s2, j)) => (w1 = w2 /\ s1 = s2)
    /\ \A w1, w2 \in Workers : \A s1, s2 \in Slots :
         (/\ <<w1, s1>> # <<w2, s2>>
          /\ Holds(w1, s1)
          /\ JobOf(w1, s1) = JobOf(w2, s2))
         => TokOf(w1, s1) # TokOf(w2, s2)
    /\ \A w \in Workers : \A s \in Slots :
         Holds(w, s) => TokOf(w, s) <= version[JobOf(w, s)]

\* (b) Every outcome or effect that landed was written by the current token
\* holder: with the row's lease_version, by the row's lease_owner.
FencedWrites ==
    \A r \in writes : r.token = r.rowVersion /\ r.by = r.rowOwner

\* (c) A completed job's effect is applied exactly once; any other job's
\* effect not at all (a rolled-back transaction leaves nothing).
EffectOnce ==
    \A j \in Jobs :
        /\ effects[j] \in {0, 1}
        /\ (effects[j] = 1 <=> jstate[j] = "completed")

\* Liveness: every job eventually reaches a final state, and stays there.
AllEventuallyFinal == \A j \in Jobs : <>(jstate[j] \in Final)
FinalIsStable      == \A j \in Jobs : [](jstate[j] \in Final => [](jstate[j] \in Final))

THEOREM Spec => [](TypeOK /\ LeaseExclusive /\ FencedWrites /\ EffectOnce)
THEOREM Spec => AllEventuallyFinal
=============================================================================
