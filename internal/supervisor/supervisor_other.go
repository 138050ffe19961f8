//go:build !linux

package supervisor

import (
	"fmt"
	"os"
	"runtime"
)

// Main reports that the supervisor needs Linux (a child subreaper and
// /proc) and returns 2. Package jobs never starts it elsewhere.
func Main(args []string) int {
	fmt.Fprintf(os.Stderr, "tasklease supervisor: not supported on %s\n", runtime.GOOS)
	return 2
}
