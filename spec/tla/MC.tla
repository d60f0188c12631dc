------------------------------- MODULE MC -------------------------------
(* Definitions that the TLC configurations (the .cfg files) refer to: the model    *)
(* values of the jobs and workers, dependency graphs and symmetry sets.   *)
EXTENDS Conveyor, TLC

CONSTANTS j1, j2, j3, j4, w1, w2, w3

\* No workflows: no job depends on another.
NoDeps == [j \in Jobs |-> {}]

\* A fan-in and a chain: j3 waits for j1 and j2 (policy 'cancel'), j4 waits
\* for j2 and j3 (policy 'run' when j4 \in RunAnyway).
FanInChain == [j \in Jobs |-> IF j = j3 THEN {j1, j2}
                              ELSE IF j = j4 THEN {j2, j3} ELSE {}]

\* Cancelling a running job with a dependent: j2 waits for j1 (policy 'cancel').
CancelChain == [j \in Jobs |-> IF j = j2 THEN {j1} ELSE {}]
\* Gates (issue 27): a chain j1 -> j2 -> j3 in which j2 is a gate.
GateChain == [j \in Jobs |-> IF j = j2 THEN {j1} ELSE IF j = j3 THEN {j2} ELSE {}]

\* Unique jobs (issue 23): off everywhere but in Unique.cfg.
NoUnique == [key |-> [j \in Jobs |-> NoKey], states |-> {}, replace |-> {}]

\* One key for every job's call, held while blocked, available or running;
\* j1's call skips a duplicate, j2's and j3's replace it (debounce).
OneKey == [key |-> [j \in Jobs |-> "k"], states |-> {"blocked", "available", "running"},
           replace |-> {j2, j3}]

\* Jobs and workers are interchangeable (safety runs only).
JobsAndWorkers == {p @@ q : p \in Permutations(Jobs), q \in Permutations(Workers)}
WorkersOnly    == Permutations(Workers)
\* Unique.cfg: j2 and j3 (both replace) are interchangeable, and the workers.
ReplacersAndWorkers == {p @@ q : p \in Permutations({j2, j3}), q \in Permutations(Workers)}

\* Flow control: off everywhere but in Limits.cfg.
NoLimits == [jobs |-> {}, conc |-> 0, key |-> [j \in Jobs |-> NoKey], keyConc |-> 0, rate |-> 0]

\* One queue with every job: at most 2 running, at most 1 running per key (j1
\* and j2 share the key "a"; j3 and j4 have none), at most 2 claims per window.
QueueLimits == [jobs |-> Jobs, conc |-> 2,
                key |-> [j \in Jobs |-> IF j \in {j1, j2} THEN "a" ELSE NoKey],
                keyConc |-> 1, rate |-> 2]

\* Limits.cfg: the key mates j1 and j2 are interchangeable, j3 and j4, and the workers.
KeyMatesAndWorkers == {p @@ q @@ r : p \in Permutations({j1, j2}), q \in Permutations({j3, j4}),
                                     r \in Permutations(Workers)}
=============================================================================
