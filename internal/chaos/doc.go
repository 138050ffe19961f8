// Package chaos is the chaos soak of tasklease as deployed: several
// `runner serve` processes on a real Redis, an http job (bulk) whose
// downstream checks fencing tokens, an exec job (sync) whose stage
// daemonises helpers, and a cron schedule on bulk for every subject. It
// submits and cancels at random through the runners' APIs while it SIGKILLs
// runners (the cron leader mid-fan-out among them), SIGSTOPs them past their
// lease TTL, and restarts Redis empty once. Then it checks:
//
//  1. no key is stuck;
//  2. tokens never go backwards (also across the data loss);
//  3. no descendant of an exec stage survives its stage or its runner;
//  4. every subject gets exactly one request per cron occurrence;
//  5. no two executions of a key overlap unless the older one was refused.
//
// Run does all of it and returns a Report; `go run ./cmd/chaos` and
// TestChaosE2E (cmd/runner) are thin wrappers around it. The harness needs
// Linux (it finds the processes a runner started through /proc); elsewhere
// Run returns an error.
package chaos
