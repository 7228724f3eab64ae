package cella_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The README's first example, pasted into a module of its own, runs as it is.
func TestReadmeFirstExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## First example")
	if start < 0 {
		t.Fatal("no first example in the README")
	}
	block := text[start:]
	open := strings.Index(block, "```go\n")
	if open < 0 {
		t.Fatal("no go block after the first example's heading")
	}
	block = block[open+len("```go\n"):]
	code := block[:strings.Index(block, "```")]

	sdk, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module readme\n\ngo 1.19\n\nrequire github.com/cella-dev/cella-go v0.0.0\n\nreplace github.com/cella-dev/cella-go => " + sdk + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "run", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run of the README's example: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "hello from sb") || !strings.Contains(string(out), "exit code: 0") || !strings.Contains(string(out), "result: 42") {
		t.Fatalf("the README's example printed:\n%s", out)
	}
}
