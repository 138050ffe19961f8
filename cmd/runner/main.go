// Command runner runs a tasklease runner (serve), checks a config
// (validate), and talks to a runner's HTTP API (submit, status, tasks,
// history, cancel).
//
// Exit codes: 0 ok, 1 run failed, 2 bad usage or config, 3 Redis (or the
// server) unreachable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/tasklease/tasklease/jobs"
)

// Exit codes (docs/cli.md).
const (
	exitOK          = 0
	exitRunFailed   = 1
	exitUsage       = 2
	exitUnreachable = 3
)

// exitError carries an exit code to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

const usage = `usage: runner <command> [flags]

commands:
  serve     [--config FILE] [--listen ADDR] [--redis URL]   run a runner (embedded Redis and demo jobs by default)
  validate  --config FILE                                   check a config; exit 0, or list every problem and exit 2
  submit    SUBJECT SCOPE [--source S] [--policy P] [--delay D] [--group G] [--wait] submit a run (--wait follows it until it ends)
  status    SUBJECT SCOPE                                   show a task
  tasks     [--status S] [--scope S] [--subject S] [--prefix P] [--limit N]
  history   SUBJECT SCOPE [--limit N]
  cancel    SUBJECT SCOPE
  scopes                                                    per job: paused, counts by status, finished in the last hour
  pause     SCOPE                                           stop claiming the scope's runs (requests still queue)
  resume    SCOPE                                           claim them again; re-queue what waited
  runners                                                   live and recently gone runners
  limiters                                                  fleet-wide limiters: slots in use, rate, waiting runs, hold
  schedules                                                 next occurrence, last fan-out, leader
  token     --subject S [--ttl 15m] [--scopes a,b] [--actions read,submit] [--config FILE]
                                                            mint a subject token (HS256) from http.subjectTokens.hmacSecret or TASKLEASE_APP_SECRET

client commands take --server URL (default $TASKLEASE_SERVER, else http://127.0.0.1:8080) and read the token from TASKLEASE_TOKEN.
exit codes: 0 ok, 1 run failed, 2 bad usage or config, 3 Redis or server unreachable.
`

func main() {
	// The exec stage supervisor (hidden, not in the usage): this binary
	// re-executed by its own exec stages. First, before any signal handling.
	if len(os.Args) > 1 && os.Args[1] == jobs.SuperviseCommand {
		os.Exit(jobs.SuperviseMain(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns its exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		err = cmdServe(ctx, rest, stdout, stderr)
	case "validate":
		err = cmdValidate(rest, stdout, stderr)
	case "token":
		err = cmdToken(rest, stdout, stderr)
	case "submit", "status", "tasks", "history", "cancel", "scopes", "pause", "resume", "runners", "limiters", "schedules":
		err = cmdClient(ctx, cmd, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "runner: unknown command %q\n\n%s", cmd, usage)
		return exitUsage
	}
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitUsage
	}
	fmt.Fprintln(stderr, "runner:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitRunFailed
}

// parseArgs parses flags that may appear before, between or after the
// positional arguments ("submit u42 course_sync --wait").
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, &exitError{code: exitUsage, err: err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
