//go:build !tasklease_failpoint_ignore_loss

package leasing

// ignoreLoss is a failpoint: built with the tag
// tasklease_failpoint_ignore_loss (failpoint_on.go), a Keeper that loses
// its lease records the loss but does not stop the work. The chaos
// command's network faults must then find overlapping executions
// (docs/correctness.md#network-faults), which shows they bite. In every
// other build it is this false constant, and the branch is compiled away.
const ignoreLoss = false
