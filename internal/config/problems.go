package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every error that describes an invalid
// configuration, so callers can tell "fix the file" (exit 2) from "cannot
// read the file".
var ErrInvalid = errors.New("config: invalid")

// maxProblems bounds the list so a garbage file still gives a readable
// answer.
const maxProblems = 100

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Path locates the value, e.g. "jobs.course_sync.stages[1].exec",
	// "schedules[0].cron" or "runner.leaseTTL". Map keys that are not plain
	// words are quoted: jobs["Bad Scope"]. Empty for problems of the file as
	// a whole (YAML syntax, ${...} expansion).
	Path string
	// Message says what is wrong and, where it helps, what is expected.
	Message string
	// Line is the 1-based line of the value in the YAML text (after ${ENV}
	// expansion), or 0 when unknown, e.g. for a config built in Go.
	Line int
}

// String returns "path: message", or the message alone when there is no
// path.
func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// Problems lists every problem of a config at once, so a user fixes the
// file in one pass instead of one error per run.
type Problems []Problem

// Error returns one line per problem, "path: message".
func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns ErrInvalid, so errors.Is(err, ErrInvalid) holds.
func (ps Problems) Unwrap() error { return ErrInvalid }

// Is reports whether target is ErrInvalid.
func (ps Problems) Is(target error) bool { return target == ErrInvalid }

// problemSet collects problems while a config is decoded and validated.
type problemSet struct {
	list []Problem
	// lines maps the path of every key seen in the YAML to its line, so
	// validation problems found later still point into the file.
	lines map[string]int
	// set holds the paths whose value was given, not null and well typed:
	// an explicit "concurrency: 0" is an error, an absent one takes the
	// default.
	set map[string]bool
	// broken holds the paths that could not be decoded. Validation stays
	// quiet about them and everything below them: "expected an integer"
	// needs no "must be at least 1" after it.
	broken map[string]bool
}

func newProblemSet() *problemSet {
	return &problemSet{lines: map[string]int{}, set: map[string]bool{}, broken: map[string]bool{}}
}

// add records a problem at a known line.
func (s *problemSet) add(path string, line int, format string, args ...any) {
	s.list = append(s.list, Problem{Path: path, Line: line, Message: fmt.Sprintf(format, args...)})
}

// decodeErr records a problem that left the value at path undecoded.
func (s *problemSet) decodeErr(path string, line int, format string, args ...any) {
	s.add(path, line, format, args...)
	s.broken[path] = true
	delete(s.set, path)
}

// addf records a validation problem, finding its line from the path or its
// nearest recorded ancestor; nothing if the value was not decoded.
func (s *problemSet) addf(path string, format string, args ...any) {
	for p := path; p != ""; p = parentPath(p) {
		if s.broken[p] {
			return
		}
	}
	s.add(path, s.line(path), format, args...)
}

func (s *problemSet) line(path string) int {
	for path != "" {
		if l, ok := s.lines[path]; ok {
			return l
		}
		path = parentPath(path)
	}
	return 0
}

// result sorts the problems into file order, drops repeats (a merged
// anchor can report the same thing twice) and caps the list; nil when
// there is nothing wrong.
func (s *problemSet) result() error {
	if len(s.list) == 0 {
		return nil
	}
	ps := slices.Clone(s.list)
	slices.SortStableFunc(ps, func(a, b Problem) int {
		// Unknown lines go last rather than first: they are the rare
		// cross-cutting ones.
		la, lb := a.Line, b.Line
		if la == 0 {
			la = int(^uint(0) >> 1)
		}
		if lb == 0 {
			lb = int(^uint(0) >> 1)
		}
		return cmp.Compare(la, lb)
	})
	seen := make(map[[2]string]bool, len(ps))
	out := ps[:0]
	for _, p := range ps {
		k := [2]string{p.Path, p.Message}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, p)
	}
	if len(out) > maxProblems {
		n := len(out) - maxProblems
		out = append(out[:maxProblems], Problem{Message: fmt.Sprintf("... and %d more problems", n)})
	}
	return Problems(out)
}

// plainKey reports whether a map key can appear in a path unquoted.
func plainKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// keyPath appends a map key to a path.
func keyPath(parent, key string) string {
	if !plainKey(key) {
		if len(key) > 64 {
			key = key[:64] + "..."
		}
		return parent + "[" + strconv.Quote(key) + "]"
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// indexPath appends a list index to a path.
func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

// parentPath strips the last element of a path. It may be fooled by a
// quoted key holding '[' or '.', which only costs a line number.
func parentPath(p string) string {
	var i int
	if strings.HasSuffix(p, "]") {
		i = strings.LastIndexByte(p, '[')
	} else {
		i = strings.LastIndexByte(p, '.')
	}
	if i <= 0 || i >= len(p) {
		return ""
	}
	return p[:i]
}
