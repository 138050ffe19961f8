//go:build unix

package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// The documentation's commands and links, checked against the repository:
// every shell block of README.md and docs/*.md is run by a test (marked
// <!-- readme-test: NAME -->, see readme_test.go) or by CI (marked
// <!-- ci-run -->, each command a line of .ci/run), and every relative link
// of the Markdown files names a file that exists, and a heading that exists
// when it has an #anchor. The checkers take an fs.FS rooted at the
// repository, so they are tested on small fixtures as well as on the tree.

// commandDocs are the files whose shell blocks must be run: README.md and
// docs/*.md.
func commandDocs(fsys fs.FS) ([]string, error) {
	docs, err := fs.Glob(fsys, "docs/*.md")
	if err != nil {
		return nil, err
	}
	sort.Strings(docs)
	return append([]string{"README.md"}, docs...), nil
}

// linkDocs are the files whose relative links must resolve: the command
// docs, the changelog and the READMEs of bench/ and deploy/kubernetes/.
func linkDocs(fsys fs.FS) ([]string, error) {
	docs, err := commandDocs(fsys)
	if err != nil {
		return nil, err
	}
	return append(docs, "CHANGELOG.md", "bench/README.md", "deploy/kubernetes/README.md"), nil
}

// commandLangs are the fenced block languages that hold commands.
var commandLangs = map[string]bool{"sh": true, "bash": true, "console": true, "shell": true}

// mdBlock is a fenced code block of a Markdown file.
type mdBlock struct {
	file   string
	line   int    // of the opening fence, from 1
	lang   string // the info string's first word
	test   string // the NAME of a <!-- readme-test: NAME --> marker before it
	ciRun  bool   // marked <!-- ci-run -->
	marker int    // the marker's line, 0 without one
	body   string // the lines between the fences, the fence's indent removed
}

func (b mdBlock) pos() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var (
	testMarker  = regexp.MustCompile(`^<!--\s*readme-test:\s*(\S+)\s*-->$`)
	ciRunMarker = regexp.MustCompile(`^<!--\s*ci-run\s*-->$`)
	fenceOpen   = regexp.MustCompile("^(\\s*)(`{3,}|~{3,})\\s*([^`\\s]*)")
)

// mdDoc is a Markdown file split into its code blocks and its other lines.
type mdDoc struct {
	name    string
	lines   []string // every line
	code    []bool   // lines[i] is a fence or inside a code block
	blocks  []mdBlock
	strayed []string // markers followed by no code block
}

func parseMarkdown(name, text string) *mdDoc {
	d := &mdDoc{name: name, lines: strings.Split(text, "\n")}
	d.code = make([]bool, len(d.lines))
	var (
		open   *mdBlock
		fence  string // the opening fence's run of ` or ~
		indent int
		body   []string
		// the last marker seen and its line (index), pending a block
		pendingTest  string
		pendingCI    bool
		pendingLine  int
		pendingValid bool
	)
	for i, l := range d.lines {
		if open != nil {
			d.code[i] = true
			t := strings.TrimSpace(l)
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				open.body = strings.Join(body, "")
				d.blocks = append(d.blocks, *open)
				open = nil
				continue
			}
			n := len(l) - len(strings.TrimLeft(l, " "))
			body = append(body, l[min(n, indent):]+"\n")
			continue
		}
		if m := fenceOpen.FindStringSubmatch(l); m != nil {
			d.code[i] = true
			open = &mdBlock{file: name, line: i + 1, lang: strings.ToLower(m[3])}
			fence, indent, body = m[2], len(m[1]), nil
			if pendingValid {
				open.test, open.ciRun, open.marker = pendingTest, pendingCI, pendingLine+1
				pendingValid = false
			}
			continue
		}
		t := strings.TrimSpace(l)
		switch m := testMarker.FindStringSubmatch(t); {
		case m != nil:
			d.strayMarker(pendingValid, pendingLine)
			pendingTest, pendingCI, pendingLine, pendingValid = m[1], false, i, true
		case ciRunMarker.MatchString(t):
			d.strayMarker(pendingValid, pendingLine)
			pendingTest, pendingCI, pendingLine, pendingValid = "", true, i, true
		case t == "":
			// a blank line between a marker and its block is fine
		default:
			d.strayMarker(pendingValid, pendingLine)
			pendingValid = false
		}
	}
	d.strayMarker(pendingValid, pendingLine)
	if open != nil { // an unclosed fence runs to the end of the file
		open.body = strings.Join(body, "")
		d.blocks = append(d.blocks, *open)
	}
	return d
}

func (d *mdDoc) strayMarker(pending bool, line int) {
	if pending {
		d.strayed = append(d.strayed, fmt.Sprintf("%s:%d: %s is followed by no code block", d.name, line+1, strings.TrimSpace(d.lines[line])))
	}
}

func readDoc(fsys fs.FS, name string) (*mdDoc, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, err
	}
	return parseMarkdown(name, string(b)), nil
}

// markedBlocks returns the blocks marked <!-- readme-test: NAME --> in
// README.md and docs/*.md by name; a name marked twice, in one file or
// two, is an error.
func markedBlocks(fsys fs.FS) (map[string]mdBlock, error) {
	files, err := commandDocs(fsys)
	if err != nil {
		return nil, err
	}
	out := map[string]mdBlock{}
	var dups []string
	for _, f := range files {
		d, err := readDoc(fsys, f)
		if err != nil {
			return nil, err
		}
		for _, b := range d.blocks {
			if b.test == "" {
				continue
			}
			if prev, ok := out[b.test]; ok {
				dups = append(dups, fmt.Sprintf("%s: readme-test %s is marked at %s too", b.pos(), b.test, prev.pos()))
				continue
			}
			out[b.test] = b
		}
	}
	if len(dups) > 0 {
		return nil, fmt.Errorf("duplicate readme-test names:\n%s", strings.Join(dups, "\n"))
	}
	return out, nil
}

// shellCommand is a ci-run block's line as a command: "" for a blank or
// comment line (and, in a console block, for output: a command line starts
// with "$ "), else the line without its prompt, a trailing comment and
// surrounding blanks.
func shellCommand(line string, console bool) string {
	t := strings.TrimSpace(line)
	if console {
		if !strings.HasPrefix(t, "$ ") {
			return ""
		}
		t = strings.TrimSpace(t[2:])
	}
	return strings.TrimSpace(stripShellComment(t))
}

// stripShellComment drops a comment that starts a line or follows a blank,
// outside quotes.
func stripShellComment(s string) string {
	var quote rune
	prev, escaped := ' ', false
	for i, r := range s {
		switch {
		case escaped:
			escaped = false
		case r == '\\' && quote != '\'':
			escaped = true
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && unicode.IsSpace(prev):
			return s[:i]
		}
		prev = r
	}
	return s
}

// checkCommandBlocks reports every shell block of README.md and docs/*.md
// that no test and no CI step runs: a block must be marked
// <!-- readme-test: NAME --> with NAME one of consumed (a test runs it), or
// <!-- ci-run --> with each command one of ciRun's lines. It also reports
// consumed names without a block, markers that mark nothing runnable, and
// names marked twice.
func checkCommandBlocks(fsys fs.FS, consumed []string) []string {
	var problems []string
	files, err := commandDocs(fsys)
	if err != nil {
		return []string{err.Error()}
	}
	ci := map[string]bool{}
	if b, err := fs.ReadFile(fsys, ".ci/run"); err != nil {
		problems = append(problems, err.Error())
	} else {
		for _, l := range strings.Split(string(b), "\n") {
			if c := shellCommand(l, false); c != "" {
				ci[c] = true
			}
		}
	}
	seen := map[string]string{}
	for _, f := range files {
		d, err := readDoc(fsys, f)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		problems = append(problems, d.strayed...)
		for _, b := range d.blocks {
			if !commandLangs[b.lang] {
				if b.marker != 0 {
					problems = append(problems, fmt.Sprintf("%s: a %q block is marked to run (line %d), but only sh, bash and console blocks are commands", b.pos(), b.lang, b.marker))
				}
				continue
			}
			switch {
			case b.test != "":
				if prev, ok := seen[b.test]; ok {
					problems = append(problems, fmt.Sprintf("%s: readme-test %s is marked at %s too", b.pos(), b.test, prev))
				}
				seen[b.test] = b.pos()
				if !slices.Contains(consumed, b.test) {
					problems = append(problems, fmt.Sprintf("%s: <!-- readme-test: %s --> names no test's block (readmeTestBlocks in readme_test.go: %s)", b.pos(), b.test, strings.Join(consumed, ", ")))
				}
				if b.lang != "sh" && b.lang != "bash" {
					problems = append(problems, fmt.Sprintf("%s: readme-test %s is a %s block; the tests run sh or bash blocks", b.pos(), b.test, b.lang))
				}
			case b.ciRun:
				n := 0
				for j, l := range strings.Split(b.body, "\n") {
					c := shellCommand(l, b.lang == "console")
					if c == "" {
						continue
					}
					n++
					if !ci[c] {
						problems = append(problems, fmt.Sprintf("%s:%d: %q (a <!-- ci-run --> block's command) is no line of .ci/run", b.file, b.line+1+j, c))
					}
				}
				if n == 0 {
					problems = append(problems, fmt.Sprintf("%s: a <!-- ci-run --> block with no command", b.pos()))
				}
			default:
				problems = append(problems, fmt.Sprintf("%s: a ```%s block that nothing runs: mark it <!-- readme-test: NAME --> (a test in cmd/runner runs it) or <!-- ci-run --> (each command a line of .ci/run)", b.pos(), b.lang))
			}
		}
	}
	for _, name := range consumed {
		if _, ok := seen[name]; !ok {
			problems = append(problems, fmt.Sprintf("readme-test %s: no sh block of README.md or docs/*.md is marked <!-- readme-test: %s -->", name, name))
		}
	}
	return problems
}

// repoFS is the repository the test runs in.
func repoFS(t *testing.T) fs.FS {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return os.DirFS(root)
}

func TestDocsCommandBlocksAreRun(t *testing.T) {
	for _, p := range checkCommandBlocks(repoFS(t), readmeTestBlocks) {
		t.Error(p)
	}
}

// inlineCode matches a code span: a run of backticks and the same run.
var inlineCode = regexp.MustCompile("(`+)")

// stripInlineCode blanks out the code spans of a line (links in them are
// text), keeping the other columns where they were.
func stripInlineCode(l string) string {
	var b strings.Builder
	for {
		loc := inlineCode.FindStringIndex(l)
		if loc == nil {
			b.WriteString(l)
			return b.String()
		}
		run := l[loc[0]:loc[1]]
		rest := l[loc[1]:]
		end := -1
		for off := 0; ; {
			k := strings.Index(rest[off:], run)
			if k < 0 {
				break
			}
			k += off
			// the closing run is exactly as long
			if k+len(run) < len(rest) && rest[k+len(run)] == '`' {
				off = k + len(run)
				for off < len(rest) && rest[off] == '`' {
					off++
				}
				continue
			}
			end = k
			break
		}
		if end < 0 { // no closing run: literal backticks
			b.WriteString(l[:loc[1]])
			l = rest
			continue
		}
		b.WriteString(l[:loc[0]])
		b.WriteString(strings.Repeat(" ", len(run)+end+len(run)))
		l = rest[end+len(run):]
	}
}

var (
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	refDef     = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	urlScheme  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})(?:\s+(.*?))?\s*$`)
	setextLine = regexp.MustCompile(`^ {0,3}(=+|-+)\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:[^>]*\s)?(?:id|name)="([^"]+)"`)
)

// anchors are the ids GitHub gives a Markdown file's headings (and its
// explicit <a id|name="..."> anchors).
func (d *mdDoc) anchors() map[string]bool {
	out := map[string]bool{}
	used := map[string]int{}
	add := func(text string) {
		slug := githubSlug(text)
		id := slug
		if n := used[slug]; n > 0 {
			id = fmt.Sprintf("%s-%d", slug, n)
		}
		used[slug]++
		out[id] = true
	}
	for i, l := range d.lines {
		if d.code[i] {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			text := regexp.MustCompile(`\s+#+$`).ReplaceAllString(" "+m[2], "")
			add(strings.TrimSpace(text))
			continue
		}
		if i > 0 && setextLine.MatchString(l) && !d.code[i-1] {
			prev := strings.TrimSpace(d.lines[i-1])
			if prev != "" && !atxHeading.MatchString(d.lines[i-1]) && !strings.HasPrefix(prev, "|") &&
				!strings.HasPrefix(prev, "-") && !strings.HasPrefix(prev, "*") && !strings.HasPrefix(prev, ">") &&
				(i < 2 || strings.TrimSpace(d.lines[i-2]) == "" || d.code[i-2]) {
				add(prev)
			}
		}
	}
	return out
}

var (
	mdLinkText = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)`)
	mdHTMLTag  = regexp.MustCompile(`<[^>]+>`)
	mdUnder    = regexp.MustCompile(`(^|[^\p{L}\p{N}_])_{1,2}([^_]+?)_{1,2}($|[^\p{L}\p{N}_])`)
)

// githubSlug is the anchor GitHub gives a heading: its text as rendered
// (links as their text, no code backticks, emphasis or tags), lowercased,
// every character but letters, digits, marks, '-', '_' and space dropped,
// and each space a '-'.
func githubSlug(heading string) string {
	s := mdLinkText.ReplaceAllString(heading, "$1")
	s = mdHTMLTag.ReplaceAllString(s, "")
	s = mdUnder.ReplaceAllString(s, "$1$2$3")
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsNumber(r) || unicode.In(r, unicode.Mn, unicode.Mc, unicode.Me):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// checkLinks reports, as file:line, every relative link of files (inline
// [text](path#anchor), images, reference definitions; not in code) whose
// path is no file or directory of fsys, or whose #anchor into a Markdown
// file is none of its headings. Links with a scheme (https:, mailto:) are
// not checked.
func checkLinks(fsys fs.FS, files []string) []string {
	var problems []string
	docs := map[string]*mdDoc{}
	doc := func(name string) (*mdDoc, error) {
		if d, ok := docs[name]; ok {
			return d, nil
		}
		d, err := readDoc(fsys, name)
		if err != nil {
			return nil, err
		}
		docs[name] = d
		return d, nil
	}
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		d, err := doc(f)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for i, l := range d.lines {
			if d.code[i] {
				continue
			}
			l = stripInlineCode(l)
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
				targets = append(targets, m[1])
			}
			if m := refDef.FindStringSubmatch(l); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				target = strings.TrimSuffix(strings.TrimPrefix(target, "<"), ">")
				if urlScheme.MatchString(target) || strings.HasPrefix(target, "//") {
					continue
				}
				where := fmt.Sprintf("%s:%d: [...](%s)", f, i+1, target)
				p, anchor, hasAnchor := strings.Cut(target, "#")
				p, _, _ = strings.Cut(p, "?")
				p, err := url.PathUnescape(p)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", where, err))
					continue
				}
				dest := f // a bare #anchor is into the file itself
				if p != "" {
					if strings.HasPrefix(p, "/") {
						dest = path.Clean(strings.TrimPrefix(p, "/"))
					} else {
						dest = path.Join(path.Dir(f), p)
					}
					if dest == ".." || strings.HasPrefix(dest, "../") {
						problems = append(problems, where+": points outside the repository")
						continue
					}
					st, err := fs.Stat(fsys, dest)
					if err != nil {
						problems = append(problems, fmt.Sprintf("%s: no file or directory %s", where, dest))
						continue
					}
					if st.IsDir() {
						continue
					}
				}
				if !hasAnchor || !strings.HasSuffix(strings.ToLower(dest), ".md") {
					continue
				}
				if anchor, err = url.PathUnescape(anchor); err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", where, err))
					continue
				}
				a, ok := anchors[dest]
				if !ok {
					dd, err := doc(dest)
					if err != nil {
						problems = append(problems, fmt.Sprintf("%s: %v", where, err))
						continue
					}
					a = dd.anchors()
					anchors[dest] = a
				}
				if !a[anchor] {
					problems = append(problems, fmt.Sprintf("%s: %s has no heading #%s", where, dest, anchor))
				}
			}
		}
	}
	return problems
}

func TestDocsLinks(t *testing.T) {
	fsys := repoFS(t)
	files, err := linkDocs(fsys)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkLinks(fsys, files) {
		t.Error(p)
	}
}

// The checkers on small trees: what they must refuse, and what they must
// let pass.

func TestDocsCommandBlocksChecker(t *testing.T) {
	ci := "#!/usr/bin/env bash\nset -e\ngo vet ./...   # vet\n\tgo test -race ./...\n"
	good := fstest.MapFS{
		".ci/run": {Data: []byte(ci)},
		"README.md": {Data: []byte("# x\n\n<!-- readme-test: a/serve -->\n```sh\nrunner serve\n```\n\n" +
			"<!-- ci-run -->\n\n```sh\n# what CI runs\ngo vet ./...\ngo test -race ./...   # everything\n```\n\n" +
			"```yaml\nredis: {}\n```\n\n```go\nfmt.Println()\n```\n\n```\nplain\n```\n")},
		"docs/more.md": {Data: []byte("  <!-- readme-test: b/client -->\n  ```bash\n  curl x\n  ```\n\n" +
			"<!-- ci-run -->\n```console\n$ go vet ./...\nok\n```\n")},
	}
	consumed := []string{"a/serve", "b/client"}
	if p := checkCommandBlocks(good, consumed); len(p) > 0 {
		t.Errorf("a good tree: %q", p)
	}
	blocks, err := markedBlocks(good)
	if err != nil {
		t.Fatal(err)
	}
	if got := blocks["b/client"].body; got != "curl x\n" {
		t.Errorf("b/client's body %q, want the indent removed", got)
	}
	if got := blocks["a/serve"]; got.file != "README.md" || got.line != 4 {
		t.Errorf("a/serve at %s", got.pos())
	}

	bad := func(name string, files map[string]string, consumed []string, want ...string) {
		t.Helper()
		fsys := fstest.MapFS{}
		for k, v := range good {
			fsys[k] = v
		}
		for k, v := range files {
			fsys[k] = &fstest.MapFile{Data: []byte(v)}
		}
		got := checkCommandBlocks(fsys, consumed)
		if len(got) != len(want) {
			t.Errorf("%s: got %d problems, want %d: %q", name, len(got), len(want), got)
			return
		}
		for i, w := range want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: problem %q lacks %q", name, got[i], w)
			}
		}
	}
	bad("unmarked block", map[string]string{"docs/new.md": "text\n\n```sh\ngo run ./cmd/runner serve\n```\n"}, consumed,
		"docs/new.md:3: a ```sh block that nothing runs")
	bad("unmarked console block", map[string]string{"docs/new.md": "```console\n$ ls\n```\n"}, consumed,
		"docs/new.md:1: a ```console block that nothing runs")
	bad("marker after text", map[string]string{"docs/new.md": "<!-- ci-run -->\nsome text\n```bash\ngo vet ./...\n```\n"}, consumed,
		"docs/new.md:1: <!-- ci-run --> is followed by no code block", "docs/new.md:3: a ```bash block that nothing runs")
	bad("a command CI does not run", map[string]string{"docs/new.md": "<!-- ci-run -->\n```sh\ngo vet ./...\ngo test ./...\n```\n"}, consumed,
		`docs/new.md:4: "go test ./..." (a <!-- ci-run --> block's command) is no line of .ci/run`)
	bad("a part of a CI line", map[string]string{"docs/new.md": "<!-- ci-run -->\n```sh\ngo vet\n```\n"}, consumed,
		`docs/new.md:3: "go vet"`)
	bad("an unknown test name", map[string]string{"docs/new.md": "<!-- readme-test: c/other -->\n```sh\nls\n```\n"}, consumed,
		"docs/new.md:2: <!-- readme-test: c/other --> names no test's block")
	bad("a name in two files", map[string]string{"docs/new.md": "<!-- readme-test: a/serve -->\n```sh\nls\n```\n"}, consumed,
		"docs/new.md:2: readme-test a/serve is marked at README.md:4 too")
	bad("a consumed name without block", nil, append(slices.Clone(consumed), "c/gone"),
		"readme-test c/gone: no sh block")
	bad("a marked yaml block", map[string]string{"docs/new.md": "<!-- ci-run -->\n```yaml\na: 1\n```\n"}, consumed,
		`docs/new.md:2: a "yaml" block is marked to run (line 1)`)
	if _, err := markedBlocks(fstest.MapFS{
		"README.md":    {Data: []byte("<!-- readme-test: x -->\n```sh\nls\n```\n")},
		"docs/more.md": {Data: []byte("<!-- readme-test: x -->\n```sh\npwd\n```\n")},
	}); err == nil || !strings.Contains(err.Error(), "docs/more.md:2: readme-test x is marked at README.md:2 too") {
		t.Errorf("markedBlocks of a name in two files: %v", err)
	}
}

func TestDocsLinksChecker(t *testing.T) {
	fsys := fstest.MapFS{
		"README.md": {Data: []byte("# Project\n\n" +
			"See [stages](docs/stages.md), [the guarantee](docs/stages.md#exec-stages-the-supervisors-guarantee),\n" +
			"[upgrading](CHANGELOG.md#upgrade-notes), [a dir](deploy/kubernetes/), [top](#project), ![shot](docs/shot.png \"title\").\n" +
			"[API](#http-api-v1) and [faults](#correctness-under-faults) and [the second](#faults-1) and [code](#runnerexecstarts).\n" +
			"[web](https://example.com/missing.md#nothing) [mail](mailto:a@b.c) `[not a link](nowhere.md)`\n" +
			"```sh\necho '[in code](nowhere.md)'\n```\n" +
			"## HTTP API (v1)\n\n## Correctness under faults\n\n## Faults\n\n## Faults\n\n### `runner.execStarts`\n" +
			"[ref]: docs/stages.md\n")},
		"docs/stages.md": {Data: []byte("# Stages\n\n## Exec stages: the supervisor's guarantee\n\nBack to the [README](../README.md#project).\n")},
		"docs/shot.png":  {Data: []byte("png")},
		"CHANGELOG.md": {Data: []byte("# Changelog\n\n## [Unreleased]\n\n### Upgrade notes\n\n" +
			"[Unreleased]: https://example.com\n")},
		"deploy/kubernetes/README.md": {Data: []byte("Setext heading\n==============\n\n[up](../../README.md#project) [self](#setext-heading)\n")},
	}
	files := []string{"README.md", "docs/stages.md", "CHANGELOG.md", "deploy/kubernetes/README.md"}
	if p := checkLinks(fsys, files); len(p) > 0 {
		t.Errorf("a good tree: %q", p)
	}
	if got, want := githubSlug("Exec stages: the supervisor's guarantee — **now** [linked](x.md) `code`"), "exec-stages-the-supervisors-guarantee--now-linked-code"; got != want {
		t.Errorf("slug %q, want %q", got, want)
	}

	fsys["docs/new.md"] = &fstest.MapFile{Data: []byte("# New\n\n" +
		"[gone](gone.md) and [anchor](../README.md#no-such-heading)\n" +
		"[up too far](../../x.md) [bad self](#nope) [dir anchor ok](../deploy/kubernetes/#x)\n" +
		"![missing image](img/missing.png)\n" +
		"[ref]: ../missing/\n")}
	got := checkLinks(fsys, append(files, "docs/new.md"))
	want := []string{
		"docs/new.md:3: [...](gone.md): no file or directory docs/gone.md",
		"docs/new.md:3: [...](../README.md#no-such-heading): README.md has no heading #no-such-heading",
		"docs/new.md:4: [...](../../x.md): points outside the repository",
		"docs/new.md:4: [...](#nope): docs/new.md has no heading #nope",
		"docs/new.md:5: [...](img/missing.png): no file or directory docs/img/missing.png",
		"docs/new.md:6: [...](../missing/): no file or directory missing",
	}
	if !slices.Equal(got, want) {
		t.Errorf("a tree with broken links:\ngot  %q\nwant %q", got, want)
	}
}

// The checkers on the real tree with one file broken: they see it.
func TestDocsCheckersSeeABrokenTree(t *testing.T) {
	real := repoFS(t)
	readme, err := fs.ReadFile(real, "README.md")
	if err != nil {
		t.Fatal(err)
	}
	broken := overlayFS{base: real, over: fstest.MapFS{"README.md": {Data: append(slices.Clone(readme),
		[]byte("\n[gone](docs/no-such-page.md) [bad anchor](#no-such-heading)\n\n```sh\nrunner unrun\n```\n")...)}}}
	files, err := linkDocs(broken)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(readme), "\n")
	for _, want := range []string{
		fmt.Sprintf("README.md:%d: [...](docs/no-such-page.md): no file", lines+2),
		fmt.Sprintf("README.md:%d: [...](#no-such-heading): README.md has no heading", lines+2),
	} {
		if !slices.ContainsFunc(checkLinks(broken, files), func(p string) bool { return strings.HasPrefix(p, want) }) {
			t.Errorf("checkLinks on the tree with a broken README misses %q", want)
		}
	}
	want := fmt.Sprintf("README.md:%d: a ```sh block that nothing runs", lines+4)
	if !slices.ContainsFunc(checkCommandBlocks(broken, readmeTestBlocks), func(p string) bool { return strings.HasPrefix(p, want) }) {
		t.Errorf("checkCommandBlocks on the tree with a broken README misses %q", want)
	}
}

// overlayFS serves over's files in place of base's.
type overlayFS struct {
	base fs.FS
	over fstest.MapFS
}

func (o overlayFS) Open(name string) (fs.File, error) {
	if _, ok := o.over[name]; ok {
		return o.over.Open(name)
	}
	return o.base.Open(name)
}

// readmeMaxLines keeps README.md the storefront: detail goes to a page
// under docs/ (the README links them).
const readmeMaxLines = 350

func TestREADMEIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: move detail to a page under docs/ and link it", n, readmeMaxLines)
	}
}
