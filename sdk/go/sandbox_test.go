package cella_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	cella "github.com/cella-dev/cella-go"
)

func TestCreateExecAndLifecycle(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	c := cella.NewClient()
	sb := newSandbox(t, &cella.CreateOptions{Metadata: map[string]string{"suite": "go"}, Env: map[string]string{"GREETING": "hi"}})
	if sb.State() != "running" || !sb.Info().Ready {
		t.Fatalf("a waiting create answers a running sandbox: %+v", sb.Info())
	}
	res, err := sb.Commands.Run(ctx, `echo "$GREETING from $(whoami)"; echo oops >&2; exit 3`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || res.Stdout != "hi from user\n" || res.Stderr != "oops\n" {
		t.Fatalf("exec: %+v", res)
	}
	// argv, cwd, stdin, root.
	in := "piped"
	res, err = sb.Commands.Run(ctx, "", &cella.CommandOptions{Argv: []string{"cat"}, Stdin: &in, User: "root", Cwd: "/tmp"})
	if err != nil || res.Stdout != "piped" || res.ExitCode != 0 {
		t.Fatalf("argv exec: %+v %v", res, err)
	}
	// Check turns an exit code into a *CommandExitError.
	_, err = sb.Commands.Run(ctx, "exit 5", &cella.CommandOptions{Check: true})
	var exitErr *cella.CommandExitError
	if !errors.As(err, &exitErr) || exitErr.Result.ExitCode != 5 {
		t.Fatalf("Check: %v", err)
	}

	// Listing by metadata, connect, timeout, usage.
	found, err := c.Sandboxes.List(ctx, &cella.ListOptions{Metadata: map[string]string{"suite": "go"}})
	if err != nil {
		t.Fatal(err)
	}
	if !containsSandbox(found, sb.ID()) {
		t.Fatalf("%s not listed by its metadata: %v", sb.ID(), found)
	}
	again, err := c.Sandboxes.Connect(ctx, sb.ID())
	if err != nil || again.ID() != sb.ID() {
		t.Fatalf("connect: %v", err)
	}
	info, err := sb.SetTimeout(ctx, 20*time.Minute)
	if err != nil || info.TimeoutSec != 1200 {
		t.Fatalf("set timeout: %+v %v", info, err)
	}
	u, err := sb.Usage(ctx)
	if err != nil || u.SandboxID != sb.ID() || u.State != "running" {
		t.Fatalf("usage: %+v %v", u, err)
	}

	// Pause and resume; a paused sandbox refuses commands with SANDBOX_NOT_RUNNING.
	if info, err := sb.Pause(ctx); err != nil || info.State != "paused" {
		t.Fatalf("pause: %+v %v", info, err)
	}
	_, err = sb.Commands.Run(ctx, "true", nil)
	if !cella.IsSandboxNotRunning(err) || !errors.Is(err, cella.ErrConflict) {
		t.Fatalf("exec on a paused sandbox: %v", err)
	}
	if info, err := sb.Resume(ctx); err != nil || info.State != "running" {
		t.Fatalf("resume: %+v %v", info, err)
	}
	if info, err := sb.Kill(ctx); err != nil || info.State != "destroyed" {
		t.Fatalf("kill: %+v %v", info, err)
	}
}

func TestCreateByResources(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	c := cella.NewClient()
	sb, err := c.Sandboxes.Create(ctx, &cella.CreateOptions{CPUCount: 1, MemoryMB: 1024, DiskSizeMB: 4096, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer killSandbox(t, sb)
	if i := sb.Info(); i.Size != "xs" || i.CPUCount != 1 || i.MemoryMB != 1024 || i.ResourceContract.ContractID != "sandbox/xs@v1" {
		t.Fatalf("the contract's size: %+v", i)
	}
	_, err = c.Sandboxes.Create(ctx, &cella.CreateOptions{CPUCount: 3, MemoryMB: 1024, DiskSizeMB: 4096})
	var e *cella.Error
	if !errors.As(err, &e) || !cella.IsInvalidRequest(err) || e.Field() != "cpu_count" || e.Details["contracts"] == nil {
		t.Fatalf("resources of no contract: %v", err)
	}
	_, err = c.Sandboxes.Create(ctx, &cella.CreateOptions{CPUCount: 1})
	if !errors.As(err, &e) || e.Field() != "memory_mb" {
		t.Fatalf("one of the three alone: %v", err)
	}
}

func TestKillByID(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	c := cella.NewClient()
	sb := newSandbox(t, nil)
	if _, err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	// A paused sandbox is destroyed by its id alone, without being resumed first.
	info, err := c.Sandboxes.Kill(ctx, sb.ID())
	if err != nil || info.ID != sb.ID() || info.State != "destroyed" {
		t.Fatalf("kill by id: %+v %v", info, err)
	}
	if got, err := c.Sandboxes.Get(ctx, sb.ID()); err != nil || got.State != "destroyed" {
		t.Fatalf("after the kill: %+v %v", got, err)
	}
	if again, err := c.Sandboxes.Kill(ctx, sb.ID()); err != nil || again.State != "destroyed" {
		t.Fatalf("a second kill: %+v %v", again, err)
	}
	if _, err := c.Sandboxes.Kill(ctx, "sbnosuchsandbox000000"); !cella.IsNotFound(err) {
		t.Fatalf("kill of a missing id: %v", err)
	}
}

func containsSandbox(list []cella.SandboxInfo, id string) bool {
	for _, s := range list {
		if s.ID == id {
			return true
		}
	}
	return false
}

func TestStreamedCommandAndProcesses(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	sb := newSandbox(t, nil)

	st, err := sb.Commands.Stream(ctx, `for i in 1 2 3; do echo "line $i"; sleep 0.2; done; printf '\377' >&2; exit 4`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var chunks []cella.OutputChunk
	for st.Next() {
		chunks = append(chunks, st.Current())
	}
	res, err := st.Result()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 4 || res.Stdout != "line 1\nline 2\nline 3\n" || res.Stderr != "\xff" {
		t.Fatalf("streamed result: %+v", res)
	}
	if len(chunks) < 3 {
		t.Fatalf("the output came in %d pieces, not as it was written: %+v", len(chunks), chunks)
	}

	// Over a channel.
	st, err = sb.Commands.Stream(ctx, "echo a; echo b >&2; echo c", nil)
	if err != nil {
		t.Fatal(err)
	}
	byStream := map[string]string{}
	for ch := range st.Chan() {
		byStream[ch.Stream] += ch.Text()
	}
	if err := st.Err(); err != nil || byStream["stdout"] != "a\nc\n" || byStream["stderr"] != "b\n" {
		t.Fatalf("chan: %q %v", byStream, err)
	}

	// Closing the stream early kills the command.
	st, err = sb.Commands.Stream(ctx, "echo started; exec sleep 321", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Next() || st.Current().Text() != "started\n" {
		t.Fatalf("first chunk: %v", st.Err())
	}
	if r, err := sb.Commands.Run(ctx, "pgrep -f 'sleep 32[1]'", nil); err != nil || strings.TrimSpace(r.Stdout) == "" {
		t.Fatalf("the streamed command runs while its stream is open: %+v %v", r, err)
	}
	st.Close()
	gone := false
	for i := 0; i < 100 && !gone; i++ {
		r, err := sb.Commands.Run(ctx, "pgrep -f 'sleep 32[1]' || true", nil)
		if err != nil {
			t.Fatal(err)
		}
		gone = strings.TrimSpace(r.Stdout) == ""
		if !gone {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !gone {
		t.Fatal("the command of a closed stream still runs")
	}

	// Streamed into writers.
	var out, errOut bytes.Buffer
	res, err = sb.Commands.Run(ctx, "echo to-out; echo to-err >&2", &cella.CommandOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || out.String() != "to-out\n" || errOut.String() != "to-err\n" || res.Stdout != "to-out\n" {
		t.Fatalf("writers: %q %q %+v %v", out.String(), errOut.String(), res, err)
	}

	// A streamed error before the stream starts is an ordinary typed error.
	_, err = sb.Commands.Stream(ctx, "true", &cella.CommandOptions{Cwd: "relative"})
	if !cella.IsInvalidRequest(err) {
		t.Fatalf("a relative cwd: %v", err)
	}

	// A background process: stdin, output, wait.
	p, err := sb.Commands.Start(ctx, "cat; echo done", &cella.CommandOptions{Tag: "cat"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Info.Tag == nil || *p.Info.Tag != "cat" || p.Info.State != "running" {
		t.Fatalf("start: %+v", p.Info)
	}
	if _, err := p.SendStdin(ctx, []byte("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	res, err = p.Wait(ctx)
	if err != nil || res.Stdout != "hello\ndone\n" || res.ExitCode != 0 {
		t.Fatalf("wait: %+v %v", res, err)
	}
	procs, err := sb.Commands.List(ctx)
	if err != nil || len(procs) != 1 || procs[0].State != "exited" {
		t.Fatalf("list: %+v %v", procs, err)
	}
	// A signal to a process that exited is a conflict; Kill says false.
	if killed, err := p.Kill(ctx); err != nil || killed {
		t.Fatalf("kill of an exited process: %v %v", killed, err)
	}
	long, err := sb.Commands.Start(ctx, "sleep 600", nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = long.Wait(short)
	cancel()
	if !cella.IsTimeout(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait that runs out of time: %v", err)
	}
	st, err = long.Output(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, err := long.Signal(ctx, "TERM"); err != nil {
		t.Fatal(err)
	}
	res, err = long.Wait(ctx)
	if err != nil || res.ExitCode != 128+15 {
		t.Fatalf("a process killed by SIGTERM: %+v %v", res, err)
	}
}

func TestFilesRoundTripOf10MiB(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	sb := newSandbox(t, nil)

	data := make([]byte, 10<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])

	e, err := sb.Files.Write(ctx, "/home/user/big/blob.bin", bytes.NewReader(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.Size != int64(len(data)) || e.Type != "file" {
		t.Fatalf("entry: %+v", e)
	}
	res, err := sb.Commands.Run(ctx, "sha256sum /home/user/big/blob.bin | cut -d' ' -f1", nil)
	if err != nil || strings.TrimSpace(res.Stdout) != want {
		t.Fatalf("the sandbox's checksum %q, want %q (%v)", res.Stdout, want, err)
	}
	r, err := sb.Files.Read(ctx, "/home/user/big/blob.bin")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, r)
	r.Close()
	if err != nil || n != int64(len(data)) || hex.EncodeToString(h.Sum(nil)) != want {
		t.Fatalf("download: %d bytes, %v", n, err)
	}

	// An upload through an io.Writer (chunked), with a mode.
	w := sb.Files.Writer(ctx, "/home/user/script.sh", &cella.WriteOptions{Mode: 0o755})
	io.WriteString(w, "#!/bin/sh\n")
	io.WriteString(w, "echo run\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Entry() == nil || w.Entry().Mode == "" {
		t.Fatalf("entry of the writer: %+v", w.Entry())
	}
	if res, err := sb.Commands.Run(ctx, "/home/user/script.sh", nil); err != nil || res.Stdout != "run\n" {
		t.Fatalf("the uploaded script: %+v %v", res, err)
	}

	// List, stat, mkdir, move, remove, exists.
	if _, err := sb.Files.MakeDir(ctx, "/home/user/a/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Files.WriteText(ctx, "/home/user/a/b/n.txt", "note", nil); err != nil {
		t.Fatal(err)
	}
	moved, err := sb.Files.Rename(ctx, "/home/user/a/b/n.txt", "/home/user/a/m.txt")
	if err != nil || moved.Path != "/home/user/a/m.txt" {
		t.Fatalf("move: %+v %v", moved, err)
	}
	l, err := sb.Files.List(ctx, "/home/user/a", true, 0)
	if err != nil || len(l.Entries) != 2 || l.Truncated {
		t.Fatalf("list: %+v %v", l, err)
	}
	if txt, err := sb.Files.ReadText(ctx, "/home/user/a/m.txt"); err != nil || txt != "note" {
		t.Fatalf("read: %q %v", txt, err)
	}
	if err := sb.Files.Remove(ctx, "/home/user/a", false); !cella.IsConflict(err) {
		t.Fatalf("removing a directory that is not empty: %v", err)
	}
	if err := sb.Files.Remove(ctx, "/home/user/a", true); err != nil {
		t.Fatal(err)
	}
	if ok, err := sb.Files.Exists(ctx, "/home/user/a"); err != nil || ok {
		t.Fatalf("exists after remove: %v %v", ok, err)
	}
	_, err = sb.Files.Read(ctx, "/home/user/nothing")
	if !cella.IsNotFound(err) {
		t.Fatalf("a missing file: %v", err)
	}
}

func TestFilesReadRange(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, nil)
	if _, err := sb.Files.WriteText(ctx, "/home/user/digits.txt", "0123456789", nil); err != nil {
		t.Fatal(err)
	}
	for rng, want := range map[string]string{"2-4": "234", "bytes=7-": "789", "-3": "789", "8-99": "89"} {
		got, err := sb.Files.ReadRange(ctx, "/home/user/digits.txt", rng)
		if err != nil || string(got) != want {
			t.Fatalf("range %q: %q %v, want %q", rng, got, err, want)
		}
	}
	_, err := sb.Files.ReadRange(ctx, "/home/user/digits.txt", "10-")
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 416 || e.Code != cella.CodeRangeNotSatisfiable || e.Details["size"] != float64(10) {
		t.Fatalf("a range past the end: %v", err)
	}
}

func TestWatch(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, nil)
	if _, err := sb.Files.MakeDir(ctx, "/home/user/w"); err != nil {
		t.Fatal(err)
	}
	watch, err := sb.Files.Watch(ctx, "/home/user/w", true)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if _, err := sb.Files.WriteText(ctx, "/home/user/w/new.txt", "x", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Commands.Run(ctx, "mv /home/user/w/new.txt /home/user/w/old.txt", nil); err != nil {
		t.Fatal(err)
	}
	var got []cella.FilesystemEvent
	for watch.Next() {
		got = append(got, watch.Current())
		if watch.Current().Type == "rename" {
			break
		}
	}
	if len(got) < 2 || got[0].Type != "create" || got[0].Path != "/home/user/w/new.txt" {
		t.Fatalf("events: %+v (%v)", got, watch.Err())
	}
	last := got[len(got)-1]
	if last.Type != "rename" || last.From != "/home/user/w/new.txt" || last.Path != "/home/user/w/old.txt" {
		t.Fatalf("rename event: %+v", last)
	}
	watch.Close()
	if watch.Next() || watch.Err() != nil {
		t.Fatalf("a closed watch ends without an error: %v", watch.Err())
	}
}

func TestCodeInterpreterRichOutput(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	sb := newSandbox(t, &cella.CreateOptions{Size: "small"})

	ex, err := sb.Code.Run(ctx, "total = sum(range(10))\ntotal", nil)
	if err != nil || !ex.OK || ex.Text() != "45" {
		t.Fatalf("a cell: %+v %v", ex, err)
	}
	ex, err = sb.Code.Run(ctx, "total * 2", nil)
	if err != nil || ex.Text() != "90" {
		t.Fatalf("the context persists: %+v %v", ex, err)
	}
	ex, err = sb.Code.Run(ctx, "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()", nil)
	if err != nil || !ex.OK {
		t.Fatalf("a plot: %+v %v", ex, err)
	}
	pngs, err := ex.PNGs()
	if err != nil || len(pngs) != 1 || !bytes.HasPrefix(pngs[0], []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("the figure as a PNG: %d images, %v (%+v)", len(pngs), err, ex.Outputs)
	}
	ex, err = sb.Code.Run(ctx, "1/0", nil)
	if err != nil || ex.OK || ex.Error == nil || ex.Error.Name != "ZeroDivisionError" {
		t.Fatalf("a failing cell: %+v %v", ex, err)
	}
	ex, err = sb.Code.Run(ctx, "[1, 2, 3].map(x => x * 2)", &cella.RunCodeOptions{Language: "javascript"})
	if err != nil || !ex.OK || ex.Text() != "[ 2, 4, 6 ]" {
		t.Fatalf("javascript: %+v %v", ex, err)
	}
	if _, err := sb.Code.CreateContext(ctx, "work", ""); err != nil {
		t.Fatal(err)
	}
	ctxs, err := sb.Code.Contexts(ctx, "python")
	if err != nil || len(ctxs) != 2 {
		t.Fatalf("contexts: %+v %v", ctxs, err)
	}
	if r, err := sb.Code.ResetContext(ctx, "work", ""); err != nil || !r.Changed {
		t.Fatalf("reset context: %+v %v", r, err)
	}
	kernels, err := sb.Code.State(ctx)
	if err != nil || len(kernels) != 2 {
		t.Fatalf("state: %+v %v", kernels, err)
	}
	if _, err := sb.Code.Run(ctx, "x", &cella.RunCodeOptions{Language: "cobol"}); !cella.IsInvalidRequest(err) {
		t.Fatalf("an unknown language: %v", err)
	} else if e := new(cella.Error); !errors.As(err, &e) || e.Code != cella.CodeUnknownLanguage {
		t.Fatalf("code of an unknown language: %v", err)
	}
	if _, err := sb.Code.Reset(ctx, "python"); err != nil {
		t.Fatal(err)
	}
}

func TestPTY(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, nil)
	term, err := sb.PTY(ctx, &cella.PTYOptions{Command: "read line; echo \"got $line\"; stty size; exit 7", Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if err := term.Ping([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, err := term.Write([]byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(term)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "got typed") || !strings.Contains(string(out), "30 100") {
		t.Fatalf("terminal output: %q", out)
	}
	if code, ok := term.ExitCode(); !ok || code != 7 {
		t.Fatalf("exit code: %v %v", code, ok)
	}
	// A sandbox that does not exist: the error comes before the upgrade, typed.
	ghost, err := cella.NewClient().Sandboxes.Connect(ctx, "sb000000000000000000")
	if !cella.IsNotFound(err) || ghost != nil {
		t.Fatalf("connect to nothing: %v", err)
	}
}
