//go:build linux

package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// proc is one process as /proc/<pid>/stat describes it.
type proc struct {
	pid, ppid int
	state     byte // R, S, D, Z, T, X, ...
	// start is the start time in clock ticks since boot: with pid, it
	// names one process even after the pid is reused.
	start uint64
}

// dead reports whether p is a zombie (or being torn down): it runs no code
// and only needs reaping.
func (p proc) dead() bool { return p.state == 'Z' || p.state == 'X' || p.state == 'x' }

// parseStat parses the contents of /proc/<pid>/stat. The command name, in
// parentheses, may itself hold spaces and parentheses, so the fields are
// read after the last ')'.
func parseStat(b []byte) (proc, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return proc{}, errors.New("no (comm)")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return proc{}, fmt.Errorf("pid: %w", err)
	}
	// Field 3 (state) onwards; starttime is field 22.
	f := bytes.Fields(b[end+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return proc{}, fmt.Errorf("%d fields after comm", len(f))
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return proc{}, fmt.Errorf("ppid: %w", err)
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return proc{}, fmt.Errorf("starttime: %w", err)
	}
	return proc{pid: pid, ppid: ppid, state: f[0][0], start: start}, nil
}

// readProcFile reads a small /proc file with three system calls where
// os.ReadFile makes about seven (stat, non-blocking mode, the poller): a
// pod that dies with hundreds of stages has each of their supervisors read
// dozens of these at once, on a host where a system call may cost
// microseconds of a virtual machine's exit.
func readProcFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// readStat reads one process; false if it is gone (or unreadable).
func readStat(root string, pid int) (proc, bool) {
	b, err := readProcFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return proc{}, false
	}
	p, err := parseStat(b)
	return p, err == nil && p.pid == pid
}

// readProcs lists the processes under root (normally /proc). Processes
// that exit while it reads are skipped. It fails only if root cannot be
// listed.
func readProcs(root string) ([]proc, error) {
	d, err := os.Open(root)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	ps := make([]proc, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			continue // not a process directory
		}
		if p, ok := readStat(root, pid); ok {
			ps = append(ps, p)
		}
	}
	return ps, nil
}

// descendantsOf returns the live (not zombie) descendants of pid in ps, by
// following parent links down from pid: children, their children, and so
// on. Zombies are left out — they run nothing and their parent (or, for an
// orphan, the subreaper) reaps them — but the walk still descends through
// them in case a listing caught a parent mid-exit.
func descendantsOf(ps []proc, pid int) []proc {
	children := make(map[int][]proc, len(ps))
	for _, p := range ps {
		if p.pid != p.ppid { // a malformed self-parent must not loop
			children[p.ppid] = append(children[p.ppid], p)
		}
	}
	var out []proc
	seen := map[int]bool{pid: true}
	queue := []int{pid}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, c := range children[cur] {
			if seen[c.pid] {
				continue
			}
			seen[c.pid] = true
			queue = append(queue, c.pid)
			if !c.dead() {
				out = append(out, c)
			}
		}
	}
	return out
}

// descendants lists the live descendants of pid from /proc at root by
// reading every process on the host: the fallback when the kernel keeps no
// children lists (see treeDescendants).
func descendants(root string, pid int) ([]proc, error) {
	ps, err := readProcs(root)
	if err != nil {
		return nil, err
	}
	return descendantsOf(ps, pid), nil
}

// hasChildrenLists reports whether the kernel publishes each thread's
// children (/proc/<pid>/task/<tid>/children, CONFIG_PROC_CHILDREN, on by
// default in the common distributions' kernels).
func hasChildrenLists(root string, pid int) bool {
	_, err := os.Stat(filepath.Join(root, strconv.Itoa(pid), "task", strconv.Itoa(pid), "children"))
	return err == nil
}

// treeDescendants lists the live descendants of pid by following the
// kernel's children lists down from pid. It reads only the tree's own
// entries, so its cost grows with the tree, not with the processes on the
// host: a host with a thousand processes and a hundred stages being
// cleaned up at once makes a hundred small walks, not a hundred full scans
// (issue 1/6 measured the full scans starving the surviving runners). The
// lists are not a snapshot — a child forked or re-parented during the walk
// may be missed — which the callers handle as they handle a full scan's
// races: by walking again until no descendant is left. Zombies are left
// out; a process that exits mid-walk is skipped, and the children it had
// are re-parented to the subreaper, where the next walk finds them.
func treeDescendants(root string, pid int) ([]proc, error) {
	kids, err := childrenOf(root, pid)
	if err != nil {
		return nil, err
	}
	var out []proc
	seen := map[int]bool{pid: true}
	for len(kids) > 0 {
		c := kids[len(kids)-1]
		kids = kids[:len(kids)-1]
		if seen[c] {
			continue
		}
		seen[c] = true
		p, ok := readStat(root, c)
		if !ok {
			continue
		}
		if !p.dead() {
			out = append(out, p)
		}
		more, _ := childrenOf(root, c) // gone since: nothing more to find there
		kids = append(kids, more...)
	}
	return out, nil
}

// childrenOf reads the children of every thread of pid (a child belongs
// to the thread that forked it, and an orphan to whichever thread of the
// subreaper the kernel picked).
func childrenOf(root string, pid int) ([]int, error) {
	taskDir := filepath.Join(root, strconv.Itoa(pid), "task")
	d, err := os.Open(taskDir)
	if err != nil {
		return nil, err
	}
	tids, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	var kids []int
	for _, tid := range tids {
		b, err := readProcFile(filepath.Join(taskDir, tid, "children"))
		if err != nil {
			continue // the thread exited
		}
		for _, f := range bytes.Fields(b) {
			if c, err := strconv.Atoi(string(f)); err == nil && c > 0 {
				kids = append(kids, c)
			}
		}
	}
	return kids, nil
}

// signalProc sends sig to p unless its pid now names another process. With
// a pidfd (Linux 5.3+) the check is exact: the pidfd pins the process that
// held the pid when it was opened, and the start time read afterwards says
// whether that is still p. Without one it narrows the window to a stat
// read. A process that is gone is not an error.
func signalProc(root string, p proc, sig syscall.Signal) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return
		}
		// ENOSYS (old kernel) or a seccomp filter: best effort.
		if cur, ok := readStat(root, p.pid); ok && cur.start == p.start {
			_ = syscall.Kill(p.pid, sig)
		}
		return
	}
	defer unix.Close(fd)
	if cur, ok := readStat(root, p.pid); !ok || cur.start != p.start {
		return // exited, and the pid was taken by another process
	}
	_ = unix.PidfdSendSignal(fd, sig, nil, 0)
}
