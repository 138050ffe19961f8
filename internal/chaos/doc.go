// Package chaos is the chaos soak of tasklease as deployed: several
// `runner serve` processes on a real Redis topology (topology.go: one
// server, Sentinel, Cluster), an http job (bulk) whose downstream checks
// fencing tokens, an exec job (sync) whose stage daemonises helpers and
// sometimes outlives its timeout, a limited job (limited: two http stages
// holding a slot of the limiter "remote", whose downstream also fences
// each write by its slot and slot token), and a cron schedule on bulk for
// every subject. It submits and cancels at random through the runners' APIs
// while it SIGKILLs runners (the cron leader mid-fan-out among them),
// SIGSTOPs them past their lease TTL, pauses Redis writes past it, breaks
// one runner's network to every Redis node at a time (network.go: a
// toxiproxy proxy per runner and node), and makes the topology's Redis
// faults happen (restarts, a lost disk,
// failovers), each ending an epoch. Then it checks:
//
//  0. every Redis fault is one it made (no failover of the Sentinels' own);
//  1. no key is stuck;
//  2. tokens never go backwards (also across every Redis fault);
//  3. no descendant of an exec stage survives its stage or its runner;
//  4. every subject gets exactly one request per cron occurrence;
//  5. no two executions of a key overlap unless the older one was refused;
//  6. every accepted request is reflected in a run that ended or is still
//     active (accepted.go; requests a Redis fault may have lost excepted);
//  7. no stage of a run executes again once the run is done (rerun.go);
//  8. a paused scope's runs are never granted (pause.go);
//  9. never more than N (Options.Limit) executions of the limited job have
//     writes accepted at once, each counted from its first accepted write
//     to its last (limit.go);
//  10. every run's history — what each runner saw of its grants, advances
//     and finishes, from their history logs — is linearizable (porcupine,
//     histories.go; runs near a Redis fault left out).
//
// Run does all of it and returns a Report; `go run ./cmd/chaos` and
// TestChaosE2E (cmd/runner) are thin wrappers around it. The harness needs
// Linux (it finds the processes a runner started through /proc); elsewhere
// Run returns an error.
package chaos
