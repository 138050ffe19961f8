// Package wait holds the one context-aware sleep the background services
// (fetch back-off, cron batch retries) share.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends; it reports whether the full d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
