//go:build tasklease_failpoint_time_tokens

package jobs

// timeTokensOnly: see failpoint_off.go. This build is broken on purpose.
const timeTokensOnly = true
