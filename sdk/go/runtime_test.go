package cella_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	cella "github.com/cella-dev/cella-go"
)

// Isolation runtimes: a create names one, the sandbox says which it runs on, an unknown one
// is a 400 naming the field, and templates list theirs.

func TestRuntimeNamespace(t *testing.T) {
	sb := newSandbox(t, &cella.CreateOptions{Runtime: "namespace"})
	if got := sb.Info().Runtime; got != "namespace" {
		t.Fatalf("runtime %q, want namespace", got)
	}
	if sb.Info().Memory != nil {
		t.Fatalf("memory %q: this server does not send it", *sb.Info().Memory)
	}
}

func TestRuntimeGVisorRunsOnGVisorsKernel(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	sb := newSandbox(t, &cella.CreateOptions{Runtime: "gvisor"})
	if got := sb.Info().Runtime; got != "gvisor" {
		t.Fatalf("runtime %q, want gvisor", got)
	}
	info, err := sb.Refresh(ctx)
	if err != nil || info.Runtime != "gvisor" {
		t.Fatalf("refresh: %v %+v", err, info)
	}
	res, err := sb.Commands.Run(ctx, "cat /proc/version; dmesg 2>/dev/null | head -3", nil)
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	first := strings.SplitN(res.Stdout, "\n", 2)[0]
	if first == strings.TrimSpace(string(host)) {
		t.Fatalf("the host's kernel inside: %q", first)
	}
	if !strings.Contains(res.Stdout, "gVisor") && !strings.Contains(res.Stdout, "4.4.0") {
		t.Fatalf("not gVisor's kernel: %q", res.Stdout)
	}
	if _, err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMemoryWhilePaused(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	for runtime, want := range map[string]string{"namespace": "in_ram", "gvisor": "on_disk"} {
		sb := newSandbox(t, &cella.CreateOptions{Runtime: runtime})
		info, err := sb.Pause(ctx)
		if err != nil || info.State != "paused" || info.Memory == nil || *info.Memory != want {
			t.Fatalf("%s paused: %+v %v, want memory %q", runtime, info, err, want)
		}
		info, err = sb.Resume(ctx)
		if err != nil || info.State != "running" || info.Memory != nil {
			t.Fatalf("%s resumed: %+v %v, want no memory field", runtime, info, err)
		}
		if res, err := sb.Commands.Run(ctx, "echo ok", nil); err != nil || res.Stdout != "ok\n" {
			t.Fatalf("%s: a command after the resume: %+v %v", runtime, res, err)
		}
	}
}

func TestRuntimeUnknownIsA400NamingTheField(t *testing.T) {
	_, err := cella.NewClient().Sandboxes.Create(ctxFor(t, time.Minute), &cella.CreateOptions{Size: size, Runtime: "vm"})
	var e *cella.Error
	if !errors.As(err, &e) || !cella.IsInvalidRequest(err) || e.Code != "INVALID_REQUEST" {
		t.Fatalf("want a 400 INVALID_REQUEST, got %v", err)
	}
	if e.Field() != "runtime" || !strings.Contains(e.Message, "vm") {
		t.Fatalf("the field is not named: %v %v", e.Message, e.Details)
	}
}

func TestOneShotRunOnGVisor(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	c := cella.NewClient()
	res, err := c.Sandboxes.Run(ctx, "echo hi > out.txt; cat /proc/version; dmesg 2>/dev/null | head -3", &cella.RunOptions{
		Size: size, Runtime: "gvisor", Artifacts: []string{"out.txt"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if first := strings.SplitN(res.Stdout, "\n", 2)[0]; first == strings.TrimSpace(string(host)) {
		t.Fatalf("the host's kernel inside: %q", first)
	}
	if !strings.Contains(res.Stdout, "gVisor") && !strings.Contains(res.Stdout, "4.4.0") {
		t.Fatalf("not gVisor's kernel: %q", res.Stdout)
	}
	if len(res.Artifacts) != 1 || !strings.HasSuffix(res.Artifacts[0].Path, "/out.txt") {
		t.Fatalf("artifacts: %+v", res.Artifacts)
	}
	if data, err := c.Artifacts.Read(ctx, res.Artifacts[0].ID); err != nil || string(data) != "hi\n" {
		t.Fatalf("the artifact: %q %v", data, err)
	}
	info, err := c.Sandboxes.Get(ctx, res.SandboxID)
	if err != nil || info.Runtime != "gvisor" || info.State != "destroyed" {
		t.Fatalf("the run's sandbox: %+v %v", info, err)
	}

	_, err = c.Sandboxes.Run(ctx, "true", &cella.RunOptions{Size: size, Runtime: "vm"})
	var e *cella.Error
	if !errors.As(err, &e) || !cella.IsInvalidRequest(err) || e.Status != 400 {
		t.Fatalf("want a 400 INVALID_REQUEST, got %v", err)
	}
	if e.Field() != "runtime" || !strings.Contains(e.Message, "vm") {
		t.Fatalf("the field is not named: %v %v", e.Message, e.Details)
	}
}

func TestTemplatesListTheirRuntimes(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	c := cella.NewClient()
	base, err := c.Templates.Get(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	if len(base.Runtimes) == 0 || base.Runtimes[0] != "namespace" {
		t.Fatalf("base runtimes %v: want namespace first", base.Runtimes)
	}
	all, err := c.Templates.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tpl := range all {
		if tpl.ID == "base" && !contains(tpl.Runtimes, "gvisor") {
			t.Fatalf("base runtimes in the list %v: want gvisor too", tpl.Runtimes)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// A snapshot with memory of a gvisor sandbox: a sandbox made from it continues where the
// source was (a variable of the code interpreter is still there).
func TestSnapshotWithMemoryContinuesWhereTheSourceWas(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc (gVisor) is not installed: no gvisor sandboxes here")
	}
	ctx := ctxFor(t, 4*time.Minute)
	c := cella.NewClient()
	sb := newSandbox(t, &cella.CreateOptions{Runtime: "gvisor"})
	if ex, err := sb.RunCode(ctx, "counter = 41", nil); err != nil || !ex.OK {
		t.Fatalf("a cell: %+v %v", ex, err)
	}
	snap, err := sb.CreateSnapshot(ctx, &cella.SnapshotOptions{Memory: true})
	if err != nil || !snap.Memory || snap.SandboxID != sb.ID() {
		t.Fatalf("snapshot with memory: %+v %v", snap, err)
	}
	defer func() {
		if _, err := c.Snapshots.Delete(ctx, snap.ID); err != nil {
			t.Errorf("deleting the snapshot: %v", err)
		}
	}()
	if got, err := c.Snapshots.Get(ctx, snap.ID); err != nil || !got.Memory {
		t.Fatalf("get: %+v %v", got, err)
	}
	if ex, err := sb.RunCode(ctx, "counter = 0", nil); err != nil || !ex.OK {
		t.Fatalf("a cell: %+v %v", ex, err)
	}
	from := newSandbox(t, &cella.CreateOptions{SnapshotID: snap.ID})
	if from.ID() == sb.ID() || from.Info().Runtime != "gvisor" {
		t.Fatalf("a sandbox from the snapshot: %+v", from.Info())
	}
	if ex, err := from.RunCode(ctx, "counter + 1", nil); err != nil || ex.Text() != "42" {
		t.Fatalf("the variable in the new sandbox: %+v %v", ex, err)
	}
	if ex, err := sb.RunCode(ctx, "counter", nil); err != nil || ex.Text() != "0" {
		t.Fatalf("the source went on: %+v %v", ex, err)
	}
	// A fork of a gvisor sandbox carries its memory too, as it is now.
	forks, fork, err := sb.Fork(ctx, 1, nil)
	if err != nil || len(forks) != 1 || !fork.ProcessesCopied || !fork.FilesystemCopied {
		t.Fatalf("fork: %+v %+v %v", forks, fork, err)
	}
	defer killSandbox(t, forks[0])
	if ex, err := forks[0].RunCode(ctx, "counter + 2", nil); err != nil || ex.Text() != "2" {
		t.Fatalf("the variable in the fork: %+v %v", ex, err)
	}
}

func TestSnapshotWithMemoryOfANamespaceSandboxIsA400(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, &cella.CreateOptions{Runtime: "namespace"})
	_, err := sb.CreateSnapshot(ctx, &cella.SnapshotOptions{Memory: true})
	var e *cella.Error
	if !errors.As(err, &e) || !cella.IsInvalidRequest(err) || e.Status != 400 || e.Code != "INVALID_REQUEST" {
		t.Fatalf("want a 400 INVALID_REQUEST, got %v", err)
	}
	if e.Field() != "memory" || !strings.Contains(e.Message, "namespace") {
		t.Fatalf("the field is not named: %v %v", e.Message, e.Details)
	}
	snaps, err := cella.NewClient().Snapshots.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		if s.SandboxID == sb.ID() {
			t.Fatalf("a snapshot was made: %+v", s)
		}
	}
	if info, err := sb.Refresh(ctx); err != nil || info.State != "running" {
		t.Fatalf("the sandbox after: %+v %v", info, err)
	}
}
