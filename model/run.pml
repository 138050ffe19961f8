/*
 * A key's run across runners: the state machine of DESIGN §3 as the Lua
 * scripts make it, for Spin (https://spinroot.com). Each step below (an
 * inline, all of it in one `atomic`) is one script; what happens between
 * steps is a runner's own code, which any other step may interleave
 * with, which may crash, and whose lease may expire under it (paused,
 * partitioned, renewals late) while it runs on.
 *
 * Checked (model_test.go; docs/correctness.md#the-model):
 *   safety  a lease is granted only when none is live, with a token above
 *           every earlier one; no stage of a run is accepted downstream
 *           once the run's checkpoint is past it (no repeated done stage);
 *           a run ends at most once
 *   LTL     under weak fairness: `ends`: a key with an active run (an
 *           accepted request) always reaches an end, done, failed or
 *           cancelled, so no key stays blocked and no trigger is lost;
 *           `followups`: a follow-up a queue or replace request left is
 *           always started
 *
 * Bounded so the check is exhaustive: NR runners (2; -DNR=3), NS stages,
 * NSUB requests of any policy and one cancel, at most NR-1 runners
 * crashing and NR leases expiring under a live holder, MAXATT attempts a
 * run, one pause and resume of the scope.
 *
 * With -DSCRIPT the model runs the steps of script.pml (next to it) in
 * order instead, as a simulation (spin -DSCRIPT run.pml), printing the
 * state after each: model_test.go runs the same steps on the real
 * scripts and compares.
 *
 * The -D flags BROKEN_* make the mistakes the checks must catch.
 */

#ifndef NR
#define NR 2
#endif
#ifndef NSUB
#define NSUB 3
#endif
#define NS 2
#define MAXATT 2

mtype = { IDLE, QUEUED, RUNNING, RETRYING, DONE, FAILED, CANCELLED };
mtype = { JOIN, SKIP, QUEUE, REPLACE };  /* conflict policies */
mtype = { STARTED, JOINED, SKIPPED, FOLLOWUP, REPLACED, GRANTED, BUSY, ACCEPTED, REFUSED, OK, LOST, NONE };

/* What a step answered: kept only in a SCRIPT run (elsewhere it would
 * only multiply the states). */
#ifdef SCRIPT
#define SAY(x) said = x
#define OTHERWISE(x) :: else -> said = x
#else
#define SAY(x) skip
#define OTHERWISE(x)
#endif

/* The run record, its lease and fence counter (one partition's keys). */
mtype status = IDLE;
byte runId = 0;        /* the record's run; a follow-up is a new one */
byte holder = 0;       /* the runner holding the lease, 0: none (never granted, released, expired) */
byte leaseTok = 0;     /* the live lease's fencing token */
byte fence = 0;        /* the last token granted */
byte completed = 0;    /* the checkpoint: stages done in this run */
byte attempts = 0;
bool followUp = false; /* a queue or replace request waits for the run's end */
bool cancel = false;   /* the cancel flag of the run */
bool paused = false;   /* the scope is paused: nothing is claimed */

/* The fencing downstream: the highest token it accepted. */
byte storeTok = 0;

/* Each runner's own memory: the lease it believes it holds, the run and
 * the stage it is on. */
byte tokOf[NR + 1];
byte runOf[NR + 1];
byte stageOf[NR + 1];

/* What the last step answered (for SCRIPT), and ghost state. */
mtype said = NONE;
byte lastEnded = 0;    /* the last run that ended */
bool dead[NR + 1];     /* a crashed runner's lease expires on its own */
byte crashes = 0;
byte cutoffs = 0;      /* leases expired under a live holder */
byte submits = 0;

#define active (status == QUEUED || status == RUNNING || status == RETRYING)
#define terminal (status == DONE || status == FAILED || status == CANCELLED)
#define holds(me) (holder == me && leaseTok == tokOf[me])

/* A run ends: released, and a waiting follow-up starts as a new run. */
inline endRun(how) {
	assert(active);
	assert(lastEnded < runId); lastEnded = runId;  /* a run ends once */
	holder = 0;
	if
	:: followUp ->
#ifndef BROKEN_LOSE_FOLLOWUP
		runId++; status = QUEUED; completed = 0; attempts = 0;
		followUp = false; cancel = false
#else
		status = how
#endif
	:: else -> status = how
	fi
}

inline newRun() {
	runId++; status = QUEUED; completed = 0; attempts = 0; cancel = false
}

/* submit.lua with conflict policy pol. */
inline submit(pol) {
	atomic {
		if
		:: !active -> newRun(); SAY(STARTED)
		:: active && pol == JOIN -> SAY(JOINED)
		:: active && pol == SKIP -> SAY(SKIPPED)
		:: active && pol == QUEUE -> followUp = true; SAY(FOLLOWUP)
		:: active && pol == REPLACE ->
			followUp = true; SAY(REPLACED);
			if
			:: status == RUNNING -> cancel = true  /* its holder ends it */
			:: else -> endRun(CANCELLED)           /* waiting: at once */
			fi
		fi
	}
}

/* cancel.lua through the registry: a queued or retrying run ends at once,
 * a running one is flagged for its holder (or the claim that recovers
 * it); a waiting follow-up is dropped too (docs/policies.md: the user
 * asked for the task to stop; a replace's cancel keeps it). */
inline cancelRun() {
	atomic {
		if
		:: status == QUEUED || status == RETRYING -> followUp = false; endRun(CANCELLED); SAY(OK)
		:: status == RUNNING -> followUp = false; cancel = true; SAY(OK)
		OTHERWISE(NONE)
		fi
	}
}

/* claim.lua: grant a queued run, or recover a running one whose lease
 * expired (a cancelled one ends instead; past maxAttempts it fails); the
 * runner resumes at the checkpoint (checkpoints.Decide). */
inline claim(me) {
	atomic {
		if
		:: !paused && holder == 0 && (status == QUEUED
#ifndef BROKEN_NO_RECLAIM
		     || status == RUNNING
#endif
		   ) ->
			if
			:: cancel -> endRun(CANCELLED); SAY(NONE)
			:: !cancel && attempts >= MAXATT -> endRun(FAILED); SAY(NONE)
			:: !cancel && attempts < MAXATT ->
				assert(holder == 0);
				fence++; holder = me; leaseTok = fence; tokOf[me] = fence;
				runOf[me] = runId; status = RUNNING; attempts++;
				stageOf[me] = completed; SAY(GRANTED)
			fi
		OTHERWISE(BUSY)
		fi
	}
}

/* The stage's write to the fencing downstream (fence.Guard). */
inline write(me) {
	atomic {
		if
#ifndef BROKEN_UNFENCED_DOWNSTREAM
		:: tokOf[me] >= storeTok ->
#else
		:: true ->
#endif
			storeTok = tokOf[me]; SAY(ACCEPTED);
			/* no repeated done stage */
			assert(runOf[me] != runId || stageOf[me] >= completed)
		:: else -> SAY(REFUSED) /* a newer holder wrote */
		fi
	}
}

/* checkpoint_advance.lua, fenced; the heartbeat's cancel flag ends a
 * cancelled run, and a paused scope parks the run (hands it back). */
inline advance(me) {
	atomic {
		if
#ifndef BROKEN_UNFENCED_ADVANCE
		:: holds(me) && !cancel && !paused ->
#else
		:: !cancel && !paused && runOf[me] == runId ->
#endif
			completed++; stageOf[me]++; SAY(OK)
		:: holds(me) && cancel -> endRun(CANCELLED); SAY(LOST)
		:: holds(me) && !cancel && paused -> holder = 0; status = QUEUED; SAY(LOST)
		:: else -> SAY(LOST) /* lost: nothing may be written */
		fi
	}
}

/* fail.lua, fenced: retry later, or fail past maxAttempts. */
inline fail(me) {
	atomic {
		if
		:: holds(me) && cancel -> endRun(CANCELLED); SAY(OK)
		:: holds(me) && !cancel && attempts < MAXATT -> holder = 0; status = RETRYING; SAY(OK)
		:: holds(me) && !cancel && attempts >= MAXATT -> endRun(FAILED); SAY(OK)
		:: else -> SAY(LOST)
		fi
	}
}

/* finish.lua, fenced: done (or cancelled), released, the follow-up
 * started. */
inline finish(me) {
	atomic {
		if
		:: holds(me) && cancel -> endRun(CANCELLED); SAY(OK)
		:: holds(me) && !cancel -> endRun(DONE); SAY(OK)
		:: else -> SAY(LOST)
		fi
	}
}

/* Redis time passes the live lease's TTL. */
inline expire() {
	atomic { holder = 0; SAY(OK) }
}

/* The retry mover: a due retry goes back to its lane. */
inline retryDue() {
	atomic {
		if
		:: status == RETRYING -> status = QUEUED; SAY(OK)
		OTHERWISE(NONE)
		fi
	}
}

#ifndef SCRIPT

proctype Submitter() {
	do
	:: submits < NSUB ->
		submits++;
		if
		:: submit(JOIN)
		:: submit(SKIP)
		:: submit(QUEUE)
		:: submit(REPLACE)
		fi
	:: submits == NSUB -> break
	od
}

proctype Canceller() {
end:
	atomic { active -> cancelRun() }
}

proctype Pauser() {
	paused = true;
	paused = false
}

proctype RetryMover() {
end:
	do
	:: status == RETRYING -> retryDue()
	od
}

/* Lease expiry: a dead holder's always comes; a live holder's at most NR
 * times in a run of the model. */
proctype Clock() {
end:
	do
	:: atomic { holder != 0 && dead[holder] -> expire() }
	:: atomic { holder != 0 && !dead[holder] && cutoffs < NR -> cutoffs++; expire() }
	od
}

/* A runner may crash at any step but inside a script; a crashed runner
 * stays down (one that comes back is a new runner), and one always
 * survives. */
#define mayCrash (crashes < NR - 1)

proctype Runner(byte me) {
	byte before;
end_idle:
	do
	:: claim(me);
	   if
	   :: holds(me) -> goto work
	   :: else -> skip
	   fi
	:: atomic { mayCrash -> crashes++; dead[me] = true }; goto down
	od;
work:
	do
	:: stageOf[me] == NS -> break
	:: stageOf[me] < NS ->
		write(me);
		if
		:: skip /* the stage succeeded */
		:: fail(me); goto end_idle
		:: atomic { mayCrash -> crashes++; dead[me] = true }; goto down
		fi;
		before = stageOf[me];
		advance(me);
		if
		:: stageOf[me] > before -> skip
		:: else -> goto end_idle
		fi
	od;
	finish(me);
	goto end_idle;
down:
	skip
}

init {
	atomic {
		byte i = 1;
		do
		:: i <= NR -> run Runner(i); i++
		:: else -> break
		od;
		run Submitter(); run Canceller(); run Pauser(); run RetryMover(); run Clock()
	}
}

ltl ends { [] (active -> <> terminal) }
ltl followups { [] (followUp -> <> !followUp) }

#else

/* One line per step, as model_test.go reads it. */
inline report() {
	printf("STATE said=%e status=%e run=%d holder=%d tok=%d completed=%d followUp=%d cancel=%d\n",
		said, status, runId, holder, leaseTok, completed, followUp, cancel)
}

init {
#include "script.pml"
}

#endif
