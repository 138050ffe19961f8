//go:build !tasklease_failpoint_time_tokens

package jobs

// timeTokensOnly is a failpoint: built with the tag
// tasklease_failpoint_time_tokens (failpoint_on.go), a runner sends no
// token floor (grantFloor is 0), so tokens come from Redis TIME and the
// key's last token alone. The chaos command's lagging promotions must then
// find tokens that went backwards (docs/correctness.md#clock-faults),
// which shows they bite. In every other build it is this false constant,
// and the branch is compiled away.
const timeTokensOnly = false
