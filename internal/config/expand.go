package config

import (
	"strings"
)

// expandEnv replaces ${NAME} and ${NAME:-default} in the raw config text.
//
// Only these braced forms expand, so "$TASKLEASE_SUBJECT" in an exec
// command reaches the shell untouched, and so does any other ${...} form
// ("${file%.txt}", "${A:?msg}", an unterminated "${" in a comment): the
// shell, not this package, knows what they mean. "$${" is a literal "${"
// for shell commands that need ${NAME} itself. An unset ${NAME} is empty;
// ${NAME:-default} also takes the default when NAME is set but empty (as
// in sh).
//
// Values are inserted as is, before YAML parsing: quote references whose
// value may hold YAML syntax (token: "${TASKLEASE_TOKEN}").
func expandEnv(text string, lookup func(string) (string, bool)) string {
	if !strings.Contains(text, "${") {
		return text
	}
	var b strings.Builder
	b.Grow(len(text))
	for i := 0; i < len(text); {
		if text[i] == '$' {
			if strings.HasPrefix(text[i:], "$${") {
				b.WriteString("${")
				i += 3
				continue
			}
			if n, repl, ok := expandOne(text[i:], lookup); ok {
				b.WriteString(repl)
				i += n
				continue
			}
		}
		b.WriteByte(text[i])
		i++
	}
	return b.String()
}

// expandOne expands the reference at the start of s if it is ${NAME} or
// ${NAME:-default}, returning how many bytes it consumed.
func expandOne(s string, lookup func(string) (string, bool)) (n int, repl string, ok bool) {
	if !strings.HasPrefix(s, "${") {
		return 0, "", false
	}
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return 0, "", false
	}
	name, def, hasDef := strings.Cut(s[2:end], ":-")
	if !validEnvName(name) || strings.Contains(def, "${") || strings.ContainsAny(def, "\n") {
		return 0, "", false
	}
	v, set := lookup(name)
	if hasDef && (!set || v == "") {
		v = def
	}
	return end + 1, v, true
}

// validEnvName checks [A-Za-z_][A-Za-z0-9_]*.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return false
	}
	return true
}
