package jobs

import (
	"errors"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]Rate{
		"20/s": {Count: 20, Per: time.Second}, "600/m": {Count: 600, Per: time.Minute},
		"1/h": {Count: 1, Per: time.Hour}, "": {},
	} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"20", "0/s", "-1/s", "20/d", "20/ s", "020/s", "1.5/s", "/s", "20/", "1000001/s", "20/S"} {
		if _, err := ParseRate(in); !errors.Is(err, ErrInvalidRate) {
			t.Errorf("ParseRate(%q): %v, want ErrInvalidRate", in, err)
		}
	}
}

// FuzzParseRate: a rate either parses and formats back to itself, or is
// refused with ErrInvalidRate.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"20/s", "1/h", "600/m", "", "0/s", "9999999/h", "20/s/s", "+5/s", " 5/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidRate) {
				t.Fatalf("ParseRate(%q): %v, want ErrInvalidRate", s, err)
			}
			return
		}
		if s == "" {
			return
		}
		if r.Count < 1 || r.interval() <= 0 || r.String() != s {
			t.Fatalf("ParseRate(%q) = %+v (%q)", s, r, r.String())
		}
	})
}
