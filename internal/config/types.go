package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as a Go duration string
// ("15s", "500ms", "1h30m"). Bare numbers are rejected: "timeout: 15" could
// mean seconds or nanoseconds, and guessing wrong is silent.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes d as a duration string, so a dumped config loads back.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML accepts a non-negative duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	return problemsErr(d.decodeNode(n))
}

// decodeNode implements nodeDecoder.
func (d *Duration) decodeNode(n *yaml.Node) []Problem {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		return []Problem{{Line: n.Line, Message: "expected a duration such as \"15s\", got " + describe(n)}}
	}
	switch t := n.ShortTag(); t {
	case "!!int", "!!float":
		return []Problem{{Line: n.Line, Message: fmt.Sprintf("expected a duration with a unit such as %q, got the bare number %s", truncate(n.Value, 20)+"s", truncate(n.Value, 40))}}
	case "!!str":
	default:
		return []Problem{{Line: n.Line, Message: "expected a duration such as \"15s\", got " + describe(n)}}
	}
	v, err := parseDuration(n.Value)
	if err != nil {
		return []Problem{{Line: n.Line, Message: err.Error()}}
	}
	*d = Duration(v)
	return nil
}

// parseDuration parses a non-negative Go duration with a helpful error.
func parseDuration(s string) (time.Duration, error) {
	v, err := time.ParseDuration(s)
	if err != nil {
		msg := fmt.Sprintf("invalid duration %q: want a Go duration such as \"15s\", \"500ms\" or \"1h30m\"", truncate(s, 40))
		if strings.HasSuffix(strings.TrimSpace(s), "d") {
			msg += " (there is no day unit: write \"168h\" for 7 days)"
		}
		return 0, errors.New(msg)
	}
	if v < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return v, nil
}

// Subjects are the subjects a schedule submits for: every subject ever
// submitted for the scope (All, written "all"), or a fixed List.
type Subjects struct {
	// All: every subject known for the scope.
	All bool
	// List of subjects, when not All.
	List []string
}

// IsZero reports whether no subjects are given.
func (s Subjects) IsZero() bool { return !s.All && len(s.List) == 0 }

// MarshalYAML writes "all" or the list.
func (s Subjects) MarshalYAML() (any, error) {
	if s.All {
		return "all", nil
	}
	return s.List, nil
}

// UnmarshalYAML accepts the string "all" or a list of subjects.
func (s *Subjects) UnmarshalYAML(n *yaml.Node) error {
	return problemsErr(s.decodeNode(n))
}

// decodeNode implements nodeDecoder. Subject syntax is checked by
// validation, which knows the full path.
func (s *Subjects) decodeNode(n *yaml.Node) []Problem {
	switch {
	case n.Kind == yaml.ScalarNode && n.Value == "all" && n.ShortTag() == "!!str":
		*s = Subjects{All: true}
		return nil
	case n.Kind == yaml.SequenceNode:
		var ps []Problem
		list := make([]string, 0, len(n.Content))
		for i, e := range n.Content {
			if e.Kind == yaml.AliasNode && e.Alias != nil {
				e = e.Alias
			}
			if e.Kind != yaml.ScalarNode || isNull(e) {
				ps = append(ps, Problem{Path: indexPath("", i), Line: e.Line, Message: "expected a subject, got " + describe(e)})
				continue
			}
			list = append(list, e.Value)
		}
		*s = Subjects{List: list}
		return ps
	}
	return []Problem{{Line: n.Line, Message: `expected "all" or a list of subjects such as [u42, u43], got ` + describe(n)}}
}

// problemsErr turns decodeNode's problems into an error for UnmarshalYAML.
func problemsErr(ps []Problem) error {
	if len(ps) == 0 {
		return nil
	}
	return Problems(ps)
}

// truncate shortens s for messages.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
