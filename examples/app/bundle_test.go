package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// requireNodeEnv set to 1 makes missing node_modules a failure instead of
// a skip (.ci/run runs npm ci --prefix examples/app first).
const requireNodeEnv = "TASKLEASE_REQUIRE_NODE"

// The committed bundle web/app.js is what `npm run build` makes of src/,
// React and the client's sources of this commit: esbuild (pinned) gives the
// same bytes for the same input, so a difference means a source changed
// without a rebuild (or the bundle was edited by hand).
func TestBundleIsBuiltFromSource(t *testing.T) {
	if _, err := os.Stat(filepath.Join("node_modules", "esbuild", "package.json")); err != nil {
		if os.Getenv(requireNodeEnv) == "1" {
			t.Fatalf("examples/app/node_modules is not installed and %s=1: npm ci --prefix examples/app", requireNodeEnv)
		}
		t.Skip("examples/app/node_modules is not installed (npm ci --prefix examples/app)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node_modules is installed but node is not on PATH: %v", err)
	}
	out := filepath.Join(t.TempDir(), "app.js")
	if b, err := exec.CommandContext(t.Context(), node, "build.mjs", out).CombinedOutput(); err != nil {
		t.Fatalf("node build.mjs: %v\n%s", err, b)
	}
	fresh, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("web", "app.js"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Fatalf("examples/app/web/app.js (%d bytes) is not the bundle of src/ and the client's sources (%d bytes): "+
			"run `npm run build --prefix examples/app` and commit web/app.js", len(committed), len(fresh))
	}
}
