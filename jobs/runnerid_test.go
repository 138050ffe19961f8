package jobs

import (
	"errors"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
)

// A runner id becomes a field of lease values, history events and the
// scripts' configuration argument: the separators those use are refused.
func TestRunnerIDRefusesSeparators(t *testing.T) {
	e := newEnv(t, redistest.StartMini(t).Client(t), Config{Prefix: "rid", Jobs: []Job{clJob(hsScope, Stage{Name: "only", Handler: &counter{}})}})
	for _, id := range []string{"a b", "a|b", "a\x1fb", "a\x1eb", "a\nb", "a\x00b"} {
		if _, err := NewRunner(e.reg, RunnerConfig{ID: id}); !errors.Is(err, ErrConfig) {
			t.Errorf("NewRunner(ID %q) = %v, want ErrConfig", id, err)
		}
	}
	if _, err := NewRunner(e.reg, RunnerConfig{ID: "pod-7.eu_west"}); err != nil {
		t.Errorf("NewRunner(ID pod-7.eu_west) = %v", err)
	}
}
