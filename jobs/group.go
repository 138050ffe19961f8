package jobs

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrInvalidGroup: a submit's fair-share group (SubmitOptions.Group) is too
// long or holds a space, a '|' or a character that is not printable.
var ErrInvalidGroup = errors.New("jobs: invalid group")

// GroupMax bounds SubmitOptions.Group, in bytes.
const GroupMax = 64

// ValidateGroup checks a fair-share group: "" (none), or at most GroupMax
// bytes of printable UTF-8 without spaces and without '|' (the request
// argument of submit.lua carries it after a '|').
func ValidateGroup(g string) error {
	if g == "" {
		return nil
	}
	bad := len(g) > GroupMax || !utf8.ValidString(g) || strings.ContainsFunc(g, func(r rune) bool {
		return r == '|' || unicode.IsSpace(r) || !unicode.IsPrint(r)
	})
	if bad {
		return fmt.Errorf("%w: %q (want at most %d bytes, printable, without spaces or '|')", ErrInvalidGroup, g, GroupMax)
	}
	return nil
}
