//go:build !linux

package chaos

import (
	"errors"

	"github.com/tasklease/tasklease/internal/redistest"
)

// Run needs Linux: the harness finds the processes a runner started, and
// checks none outlives it, through /proc.
func Run(t redistest.T, opts Options) (Report, error) {
	return Report{}, errors.New("chaos: the chaos soak needs Linux (it finds a runner's processes through /proc)")
}
