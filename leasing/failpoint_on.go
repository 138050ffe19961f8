//go:build tasklease_failpoint_ignore_loss

package leasing

// ignoreLoss: see failpoint_off.go. This build is broken on purpose.
const ignoreLoss = true
