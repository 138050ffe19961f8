// Package supervisor runs one exec stage command under a supervisor process
// that outlives none of it and lets none of it outlive the stage.
//
// On Linux the supervisor is a child subreaper: every descendant of the
// command that is orphaned — including daemons that double-fork and call
// setsid — is re-parented to it. When the command exits, when the runner
// asks it to stop (SIGTERM) or when the runner dies (DeathSignal, armed by
// the runner as the supervisor's parent-death signal) it kills every
// descendant it finds by walking its own process tree in /proc, reaps them
// all, and only then exits.
// Elsewhere Main only reports that it is unsupported.
//
// The runner (package jobs) starts the supervisor through a host binary:
// `<host> __tasklease-supervise <Options.Args()...>`. This file holds the
// command line and the status protocol both sides share.
//
// # Command line
//
//	[--grace=DURATION] [--ppid=PID] [--status-fd=FD] [--path=FILE] [--dir=DIR] -- ARGV0 [ARG...]
//
// --grace is the SIGTERM→SIGKILL delay for the descendants when the
// supervisor gets SIGTERM (default DefaultGrace). --ppid is the pid the
// supervisor's parent must have once it is running; if it does not, the
// parent already died and nothing is started. --status-fd names an
// inherited pipe the supervisor reports on (see Status). --path is the
// executable to run; without it ARGV0 is looked up in PATH. --dir is the
// command's working directory (a relative --path is relative to it); the
// supervisor's own stays where it was started. The command gets the
// supervisor's environment unchanged.
//
// # Status lines (on --status-fd, one per line)
//
//	started PID          the command is running
//	start-error ERRNO    the command could not be started (exit 126 or 127)
//	exit CODE            the command exited with CODE; every descendant is gone
//	signal SIGNO         the command was killed by SIGNO; every descendant is gone
//
// The supervisor's own exit status is the command's, or 128+SIGNO; the
// status line is what tells "killed by signal 9" from "exit 137".
package supervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultGrace is the SIGTERM→SIGKILL delay when --grace is not given.
const DefaultGrace = 4 * time.Second

// Options is a supervisor command line.
type Options struct {
	// Grace is the delay between SIGTERM and SIGKILL to the descendants
	// when the supervisor is told to stop.
	Grace time.Duration
	// ParentPID, when not zero, is the pid the supervisor's parent must
	// have after it started.
	ParentPID int
	// StatusFD is an inherited file descriptor to report on; -1 for none.
	StatusFD int
	// Path is the executable; empty means Argv[0] looked up in PATH.
	Path string
	// Dir is the command's working directory; empty means the
	// supervisor's.
	Dir string
	// Argv is the command's argument vector. Required.
	Argv []string
}

// Args returns the command line for o, to follow the host's supervise
// subcommand.
func (o Options) Args() []string {
	a := []string{"--grace=" + o.Grace.String()}
	if o.ParentPID > 0 {
		a = append(a, "--ppid="+strconv.Itoa(o.ParentPID))
	}
	if o.StatusFD >= 0 {
		a = append(a, "--status-fd="+strconv.Itoa(o.StatusFD))
	}
	if o.Path != "" {
		a = append(a, "--path="+o.Path)
	}
	if o.Dir != "" {
		a = append(a, "--dir="+o.Dir)
	}
	a = append(a, "--")
	return append(a, o.Argv...)
}

// ParseArgs parses a command line made by Options.Args.
func ParseArgs(args []string) (Options, error) {
	o := Options{Grace: DefaultGrace, StatusFD: -1}
	for i, a := range args {
		if a == "--" {
			o.Argv = args[i+1:]
			if len(o.Argv) == 0 || o.Argv[0] == "" {
				return o, errors.New("no command after --")
			}
			return o, nil
		}
		name, val, ok := strings.Cut(a, "=")
		if !ok {
			return o, fmt.Errorf("argument %q: want --name=value or --", a)
		}
		var err error
		switch name {
		case "--grace":
			o.Grace, err = time.ParseDuration(val)
			if err == nil && o.Grace < 0 {
				err = errors.New("negative")
			}
		case "--ppid":
			o.ParentPID, err = strconv.Atoi(val)
		case "--status-fd":
			o.StatusFD, err = strconv.Atoi(val)
			if err == nil && o.StatusFD < 0 {
				err = errors.New("negative")
			}
		case "--path":
			o.Path = val
		case "--dir":
			o.Dir = val
		default:
			return o, fmt.Errorf("unknown option %s", name)
		}
		if err != nil {
			return o, fmt.Errorf("%s: %q: %w", name, val, err)
		}
	}
	return o, errors.New("missing -- before the command")
}

// Status is what a supervisor reported on its status descriptor.
type Status struct {
	// Started: the command was started, as PID.
	Started bool
	PID     int
	// StartErr is set when the command could not be started.
	StartErr syscall.Errno
	// Ended: the command ended with Code, or was killed by Signal
	// (non-zero), and no descendant of it is left.
	Ended  bool
	Code   int
	Signal syscall.Signal
}

// ReadStatus reads status lines until EOF. A line it does not understand
// is an error, reported after the rest was read. onFirst, when set, is
// called once: at the first line (normally "started" or "start-error") or
// at the end, whichever comes first.
func ReadStatus(r io.Reader, onFirst func()) (Status, error) {
	var st Status
	var bad error
	defer func() {
		if onFirst != nil { // no line at all
			onFirst()
		}
	}()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if onFirst != nil {
			onFirst()
			onFirst = nil
		}
		word, arg, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(arg)
		if err != nil {
			if bad == nil {
				bad = fmt.Errorf("supervisor status line %q", sc.Text())
			}
			continue
		}
		switch word {
		case "started":
			st.Started, st.PID = true, n
		case "start-error":
			st.StartErr = syscall.Errno(n)
		case "exit":
			st.Ended, st.Code = true, n
		case "signal":
			st.Ended, st.Signal = true, syscall.Signal(n)
		default:
			if bad == nil {
				bad = fmt.Errorf("supervisor status line %q", sc.Text())
			}
		}
	}
	if err := sc.Err(); err != nil {
		return st, err
	}
	return st, bad
}
