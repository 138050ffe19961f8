// Package triggers holds tasklease's entry points that are not a person
// pressing a button: cron schedules and the foreground hook. Triggers only
// submit requests through the jobs.Registry (docs/concepts.md); they never execute
// work, so a schedule that fires while a foreground sync is running joins
// that run instead of starting a second one.
//
// # Cron without double firing
//
// Every runner builds a Scheduler from the same schedules and runs it
// (docs/cron.md). Two independent mechanisms keep one occurrence from firing
// twice, and a third makes every subject of an occurrence get exactly one
// request:
//
//   - Leadership. One runner leads, elected with a redsync mutex on
//     "<prefix>:cron:leader" (value: the leader's Owner). A follower tries to
//     acquire it every LeaderTTL/3; the leader extends it every LeaderTTL/3
//     and steps down at once when an extension is refused, fails, or cannot
//     be confirmed before the mutex would expire. IsLeader is false from the
//     moment the leader cannot be sure, so it never fires while unsure. On
//     shutdown the leader unlocks (after its fan-outs recorded their last
//     batch) so a successor takes over within LeaderTTL/3; after a crash the
//     successor takes over within about LeaderTTL + LeaderTTL/3. Each
//     acquisition opens a leadership term, a number that only grows
//     ("<prefix>:cron:term", lua/cron_term.lua: max(previous + 1, Redis time
//     in µs), so it survives the counter expiring or Redis losing data).
//   - An idempotency key per occurrence: before fanning out occurrence T of
//     schedule N, the leader claims it with lua/cron_claim.lua, which sets
//     "{<prefix>:cron:<N>}:fired:<T.Unix()>" (value: its Owner; expiry
//     max(FiredKeyTTLMin, 2 × the schedule's interval)) only if it does not
//     exist, and in the same step writes the schedule's fan-out state (below).
//     Only the instance that claimed submits. So even two instances that
//     both believe they lead (a paused leader waking up, a Redis failover)
//     fire each occurrence once — the lesson of asynq's per-instance
//     scheduler and gocron's per-run locks. All keys of one schedule share
//     the hash tag "{<prefix>:cron:<N>}", so the claim is one script on Redis
//     Cluster too. (The unhashed fired key of the previous release,
//     "<prefix>:cron:fired:<N>:<T>", is still honoured when present, for
//     rolling deploys.)
//   - A resumable fan-out under a fence. The state hash
//     "{<prefix>:cron:<N>}:fanout" holds the schedule's latest claimed
//     occurrence: its position (for "subjects: all" the partition and ZSCAN
//     cursor, for a list the index of the next subject), submitted and
//     duplicate counts, done flag, start and finish times, the owner and the
//     term that may advance it. The fan-out submits a batch
//     (Registry.SubmitMany with the occurrence) and then records it
//     (lua/cron_progress.lua), which is refused unless the caller's term is
//     the state's: a deposed leader that is still running cannot move the
//     cursor. A crash between submit and record re-sends the batch, which is
//     harmless: every task record remembers the occurrence ("occ:<N>") and
//     answers a repeat "duplicate" without writing anything — exactly one
//     request per subject per occurrence, by construction in Redis.
//     Claiming the next occurrence archives the replaced state in
//     "{<prefix>:cron:<N>}:fanouts", the schedule's last 50 fan-outs
//     (GET /v1/schedules shows them as recentOccurrences).
//
// # Resume
//
// Whoever leads — the same runner after a Redis error, a successor after a
// crash, shutdown or lost leadership — finishes an unfinished fan-out before
// firing that schedule's next occurrence: each loop checks on gaining
// leadership and on every wake-up, and the claim itself refuses ("busy")
// while the previous fan-out is unfinished. Resuming adopts the state under
// the new term (lua/cron_adopt.lua), from which moment the old term's writes
// are refused, and continues from its cursor. A fan-out keeps going through
// Redis errors (the batch is retried with backoff, FanOutRetryMin to
// FanOutRetryMax, while its term leads); it stops between batches when Run's
// context ends (the batch in flight gets FanOutShutdownGrace) or leadership
// is lost. Resume bound: a fan-out that started longer ago than its fired
// key's TTL (max(FiredKeyTTLMin, 2 × the interval)) is not resumed but
// abandoned (DecisionAbandoned, logged with its counts): the occurrences
// since then cover its subjects. The state itself expires that long after
// its last batch, so nothing outlives the schedule's activity.
// If a deploy changed the schedule's scope or subject list, a resumed
// fan-out restarts from the beginning (the occurrence answers "duplicate"
// for the subjects it already reached).
//
// A deposed leader's late batch: the fence stops its cursor writes, every
// fan-out checks that it still leads before each batch, and the submit
// script records the latest occurrence that reached each task key and
// answers "duplicate" for that one or an older one. So a leader that pauses
// between its check and its SubmitMany (longer than the leader TTL) cannot
// give a subject a second request: a subject its successor's newer
// occurrence already reached refuses the old batch, and one it did not
// reach gets the old occurrence's one request, which it was owed.
//
// # Occurrences and catch-up
//
// Occurrences are computed locally with robfig/cron in
// SchedulerConfig.Location. "@every D" schedules are anchored to the Unix
// epoch (occurrences at whole multiples of D), not to the process start as
// in robfig/cron, so every runner computes the same occurrence times and the
// idempotency key means the same thing on all of them.
//
// The leader fires the most recent due occurrence it has not fired yet,
// looking back at most the catch-up window, LeaderTTL + LeaderTTL/3 (the
// longest a crashed leader's successor can take to acquire the mutex). In
// steady state that is simply each occurrence as it comes. When a runner
// becomes leader, it therefore fires occurrences from now on plus the most
// recent one inside the window that has no fired key yet — an occurrence that
// fell into the handover gap is not dropped, and one the previous leader
// already fired is not repeated. Older occurrences (the whole cluster was
// down, or several occurrences fell into one gap) are not replayed: a
// schedule is "keep the data fresh", and a burst of late syncs would not
// help. The same rule makes a cold start fire an occurrence that happened at
// most one window ago.
//
// # Fan-out
//
// A claimed occurrence submits one request per subject with source
// "schedule" and the job's default conflict policy, in batches of
// FanOutBatch subjects: an explicit list is sliced; "subjects: all" — the
// subjects requested for the scope by anything but a schedule (a person, the
// app, the API) within the registry's retention — is paged partition by
// partition with ZSCAN (Registry.ScanSubjects), so memory stays about one
// batch whatever the number of subjects. Each batch is one SubmitMany (one
// pipelined round trip of partition scripts) and one cursor write. Status
// reports each schedule's last occurrence and its progress.
//
// # Foreground
//
// Foreground submits a subject's foreground requests (the app came to the
// foreground), for the given scopes or for every job with Foreground set,
// validating everything before submitting anything.
package triggers
