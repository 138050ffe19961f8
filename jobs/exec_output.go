package jobs

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
)

// lineLogger logs each complete line written to it; a partial line waits
// for its end or for flush. Lines are capped so a command without newlines
// cannot grow it without bound.
type lineLogger struct {
	log    *slog.Logger
	level  slog.Level
	stream string
	buf    []byte
}

const lineLoggerMax = 4 << 10

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > lineLoggerMax {
		l.emit(l.buf)
		l.buf = l.buf[:0]
	}
	return len(p), nil
}

func (l *lineLogger) flush() {
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = nil
	}
}

func (l *lineLogger) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(line) > lineLoggerMax {
		line = line[:lineLoggerMax]
	}
	l.log.LogAttrs(context.Background(), l.level, "exec output", slog.String("stream", l.stream), slog.String("line", string(line)))
}

// tailBuffer is an io.Writer keeping the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

// Write keeps the tail of p; it never fails, so the command is never cut
// off from its stderr.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the kept tail, trimmed, as valid UTF-8 (the cut may split
// a character).
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(strings.ToValidUTF8(string(t.buf), "\uFFFD"))
}
