// Package triggers holds tasklease's entry points that are not a person
// pressing a button: cron schedules and the foreground hook. Triggers only
// submit requests through the jobs.Registry (DESIGN §1); they never execute
// work, so a schedule that fires while a foreground sync is running joins
// that run instead of starting a second one.
//
// # Cron without double firing
//
// Every runner builds a Scheduler from the same schedules and runs it
// (DESIGN §8). Two independent mechanisms keep one occurrence from firing
// twice:
//
//   - Leadership. One runner leads, elected with a redsync mutex on
//     "<prefix>:cron:leader" (value: the leader's Owner). A follower tries to
//     acquire it every LeaderTTL/3; the leader extends it every LeaderTTL/3
//     and steps down at once when an extension is refused, fails, or cannot
//     be confirmed before the mutex would expire. IsLeader is false from the
//     moment the leader cannot be sure, so it never fires while unsure. On
//     shutdown the leader unlocks so a successor takes over within
//     LeaderTTL/3; after a crash the successor takes over within about
//     LeaderTTL + LeaderTTL/3.
//   - An idempotency key per occurrence: before fanning out occurrence T of
//     schedule N, the leader sets "<prefix>:cron:fired:<N>:<T.Unix()>" with
//     SET NX (value: its Owner; expiry max(FiredKeyTTLMin, 2 × the
//     schedule's interval)). Only the instance that set the key submits.
//     So even two instances that both believe they lead (a paused leader
//     waking up, a Redis failover) fire each occurrence once — the lesson
//     of asynq's per-instance scheduler and gocron's per-run locks.
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
// "schedule" and the job's default conflict policy; "subjects: all" is
// resolved with Registry.Subjects before the occurrence is claimed. A fan-out
// that started is completed even if leadership is lost meanwhile (nobody else
// will fire that occurrence) and gets FanOutShutdownGrace after shutdown. A
// runner that crashes in the middle of a fan-out leaves that occurrence's
// remaining subjects unfired — at most once per occurrence is the price of
// never firing twice; the next occurrence covers them.
//
// # Foreground
//
// Foreground submits a subject's foreground requests (the app came to the
// foreground), for the given scopes or for every job with Foreground set,
// validating everything before submitting anything.
package triggers
