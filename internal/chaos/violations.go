//go:build linux

package chaos

import (
	"fmt"
	"sort"
	"sync"
)

// The checks, as violations are filed under them (Report.ViolationsByCheck).
const (
	checkFaults     = "0 every Redis fault is the harness's"
	checkStuck      = "1 no stuck key"
	checkTokens     = "2 tokens never go backwards"
	checkDescendant = "3 no surviving descendant"
	checkOnce       = "4 exactly once per occurrence"
	checkOverlap    = "5 no overlapping executions"
	checkAccepted   = "6 every accepted request is reflected"
	checkRerun      = "7 no stage runs again once its run is done"
	checkPause      = "8 a paused scope's runs are never granted"
	checkLimit      = "9 never more than N accepted concurrent writers"
	checkHistories  = "10 every run's history is linearizable"
)

// detailsPerCheck is how many violations of one check the report details.
const detailsPerCheck = 8

// violations collects what the checker found, by check.
type violations struct {
	mu sync.Mutex
	by map[string][]string
}

func (v *violations) add(check, format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.by == nil {
		v.by = map[string][]string{}
	}
	v.by[check] = append(v.by[check], fmt.Sprintf(format, args...))
}

func (v *violations) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, l := range v.by {
		n += len(l)
	}
	return n
}

// of returns the violations of check.
func (v *violations) of(check string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.by[check]
}

// byCheck counts the violations of each violated check.
func (v *violations) byCheck() map[string]int {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]int, len(v.by))
	for c, l := range v.by {
		out[c] = len(l)
	}
	return out
}

// details renders the first detailsPerCheck violations of each check, in
// check order, each naming its check and how many it has.
func (v *violations) details() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	checks := make([]string, 0, len(v.by))
	for c := range v.by {
		checks = append(checks, c)
	}
	sort.Strings(checks)
	out := []string{}
	for _, c := range checks {
		l := v.by[c]
		for i, msg := range l[:min(len(l), detailsPerCheck)] {
			out = append(out, fmt.Sprintf("check %q (%d of %d): %s", c, i+1, len(l), msg))
		}
	}
	return out
}
