package cella_test

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cella "github.com/cella-dev/cella-go"
)

// A task run against a local repository: the server's git forge over a bare repository and
// a command agent that writes a file and commits. The run is followed to its end through
// its events, and the branch it pushed holds the agent's commit.
func TestTaskRunOnALocalRepository(t *testing.T) {
	ctx := ctxFor(t, 4*time.Minute)
	c := cella.NewClient()
	ws := defaultWorkspace(t, c)

	// Task runs are off until the workspace's settings turn them on.
	_, err := c.Tasks.Start(ctx, cella.StartTaskOptions{Repository: "acme/web", Task: "Add a greeting."})
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 403 || e.Details["reason"] != "tasks_disabled" {
		t.Fatalf("a run while tasks are disabled: %#v", err)
	}
	w, err := c.Workspaces.Update(ctx, ws, cella.WorkspaceUpdate{Settings: map[string]any{"tasks_enabled": true, "session_limit_min": 5}})
	if err != nil || !w.Settings.TasksEnabled || w.Settings.SessionLimitMin != 5 {
		t.Fatalf("enable tasks: %+v %v", w, err)
	}
	// The wallet must cover the run's worst case: 402 until it is credited.
	_, err = c.Tasks.Start(ctx, cella.StartTaskOptions{Repository: "acme/web", Task: "Add a greeting."})
	if !errors.As(err, &e) || e.Status != 402 || e.Code != cella.CodeInsufficientFunds || !cella.IsInsufficientFunds(err) {
		t.Fatalf("a run the wallet does not cover: %#v", err)
	}
	if _, err := c.Workspaces.Credit(ctx, ws, "10", "task runs"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tasks.Start(ctx, cella.StartTaskOptions{Repository: "acme/nothere", Task: "x"}); !cella.IsNotFound(err) {
		t.Fatalf("an unknown repository: %v", err)
	}

	task, err := c.Tasks.Start(ctx, cella.StartTaskOptions{Repository: "acme/web", Task: "Add a greeting.", Metadata: map[string]string{"suite": "go"}})
	if err != nil {
		t.Fatal(err)
	}
	if task.State != "queued" || task.BaseBranch != "main" || task.Agent != "script" || task.Forge != "local" {
		t.Fatalf("a started run: %+v", task)
	}

	// The live log, while the run is alive (it may already be over: 410 GONE).
	logCtx, cancelLog := context.WithCancel(ctx)
	logDone := make(chan string, 1)
	go func() {
		var b strings.Builder
		if st, err := c.Tasks.Log(logCtx, task.ID); err == nil {
			for st.Next() {
				b.WriteString(st.Current().Text)
			}
			st.Close()
		} else if !errors.Is(err, cella.ErrGone) {
			b.WriteString("ERROR " + err.Error())
		}
		logDone <- b.String()
	}()

	events, err := c.Tasks.Events(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for events.Next() {
		if ev := events.Current(); ev.Event == "state" {
			states = append(states, ev.State)
		}
	}
	if err := events.Err(); err != nil {
		t.Fatal(err)
	}
	if len(states) == 0 || states[len(states)-1] != "stopped" {
		t.Fatalf("the run's states: %v", states)
	}
	cancelLog()
	if log := <-logDone; strings.HasPrefix(log, "ERROR") {
		t.Fatalf("the live log: %s", log)
	}

	done, err := c.Tasks.Get(ctx, task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != "stopped" || done.StopReason == nil || *done.StopReason != "agent_exit" || done.FailureReason != nil || done.PullRequest != nil {
		t.Fatalf("the run at its end: %+v", done)
	}
	if done.Branch != "cella/"+task.ID {
		t.Fatalf("branch: %q", done.Branch)
	}
	bare := filepath.Join(repoRoot, "acme", "web.git")
	subject, err := exec.Command("git", "--git-dir", bare, "log", "-1", "--format=%s", done.Branch).Output()
	if err != nil || strings.TrimSpace(string(subject)) != "Add the greeting" {
		t.Fatalf("the branch's last commit: %q %v", subject, err)
	}
	content, err := exec.Command("git", "--git-dir", bare, "show", done.Branch+":GREETING.txt").Output()
	if err != nil || string(content) != "greeting from the agent\n" {
		t.Fatalf("the agent's file on the branch: %q %v", content, err)
	}

	// Waiting on an ended run answers at once; cancelling it changes nothing.
	if w, err := c.Tasks.Wait(ctx, task.ID); err != nil || w.State != "stopped" {
		t.Fatalf("wait: %+v %v", w, err)
	}
	if cnl, err := c.Tasks.Cancel(ctx, task.ID); err != nil || cnl.State != "stopped" {
		t.Fatalf("cancel of an ended run: %+v %v", cnl, err)
	}
	if _, err := c.Tasks.Log(ctx, task.ID); !errors.Is(err, cella.ErrGone) {
		t.Fatalf("the log of an ended run: %v", err)
	}
	runs, err := c.Tasks.List(ctx, &cella.TaskListOptions{Repository: "acme/web"})
	if err != nil || len(runs) != 1 || runs[0].ID != task.ID {
		t.Fatalf("list: %+v %v", runs, err)
	}
	if runs, err := c.Tasks.List(ctx, &cella.TaskListOptions{State: "failed"}); err != nil || len(runs) != 0 {
		t.Fatalf("list of failed runs: %+v %v", runs, err)
	}

	// A running run: its live log, then a cancel; its events end in cancelled.
	sl, err := c.Tasks.Start(ctx, cella.StartTaskOptions{Repository: "acme/web", Task: "sleep", Agent: "sleeper"})
	if err != nil {
		t.Fatal(err)
	}
	live, err := c.Tasks.Log(ctx, sl.ID)
	if err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	for live.Next() {
		seen.WriteString(live.Current().Text)
		if strings.Contains(seen.String(), "sleeper started") {
			break
		}
	}
	live.Close()
	if !strings.Contains(seen.String(), "sleeper started") {
		t.Fatalf("the live log: %q %v", seen.String(), live.Err())
	}
	if cur, err := c.Tasks.Get(ctx, sl.ID); err != nil || cur.State != "running" {
		t.Fatalf("a run whose agent writes is running: %+v %v", cur, err)
	}
	if _, err := c.Tasks.Cancel(ctx, sl.ID); err != nil {
		t.Fatal(err)
	}
	end, err := c.Tasks.Wait(ctx, sl.ID)
	if err != nil || end.State != "cancelled" || end.StopReason == nil || *end.StopReason != "cancelled" {
		t.Fatalf("a cancelled running run: %+v %v", end, err)
	}

	// A queued run that is cancelled never starts.
	q, err := c.Tasks.Start(ctx, cella.StartTaskOptions{Repository: "acme/web", Task: "never mind"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tasks.Cancel(ctx, q.ID); err != nil {
		t.Fatal(err)
	}
	end, err = c.Tasks.Wait(ctx, q.ID)
	if err != nil || end.State != "cancelled" {
		t.Fatalf("a cancelled run: %+v %v", end, err)
	}
}

func TestWalletLedgerUsage(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	c := cella.NewClient()
	ws, err := c.Workspaces.Create(ctx, "go-wallet", "developer", "organization")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Workspaces.Get(ctx, ws.ID); err != nil || got.Name != "go-wallet" || got.Plan != "developer" {
		t.Fatalf("get: %+v %v", got, err)
	}
	wallet, err := c.Workspaces.Wallet(ctx, ws.ID)
	if err != nil || wallet.Currency != "USD" || wallet.Balance != "0.000000" {
		t.Fatalf("a new wallet: %+v %v", wallet, err)
	}
	entry, err := c.Workspaces.Credit(ctx, ws.ID, "12.5", "invoice 1")
	if err != nil || entry.Kind != "credit" || entry.Amount != "12.500000" || entry.BalanceAfter != "12.500000" {
		t.Fatalf("credit: %+v %v", entry, err)
	}
	if _, err := c.Workspaces.Credit(ctx, ws.ID, "1e3", "bad"); !cella.IsInvalidRequest(err) {
		t.Fatalf("an amount that is not a decimal: %v", err)
	}
	ledger, err := c.Workspaces.Ledger(ctx, ws.ID, 0)
	if err != nil || len(ledger) != 1 || ledger[0].ID != entry.ID || ledger[0].Reference == nil || *ledger[0].Reference != "invoice 1" {
		t.Fatalf("ledger: %+v %v", ledger, err)
	}
	wallet, err = c.Workspaces.Wallet(ctx, ws.ID)
	if err != nil || wallet.Balance != "12.500000" || wallet.Available != "12.500000" {
		t.Fatalf("the wallet after a credit: %+v %v", wallet, err)
	}
	usage, err := c.Workspaces.Usage(ctx, ws.ID, "", "")
	if err != nil || usage.Currency != "USD" || len(usage.Days) != 0 {
		t.Fatalf("usage: %+v %v", usage, err)
	}
	if _, err := c.Workspaces.Usage(ctx, ws.ID, "yesterday", ""); !cella.IsInvalidRequest(err) {
		t.Fatalf("a bad from: %v", err)
	}
	storage, err := c.Workspaces.Storage(ctx, ws.ID)
	if err != nil || storage.UsedBytes != 0 {
		t.Fatalf("storage: %+v %v", storage, err)
	}
	// A key of that workspace reads its wallet but may not credit it.
	key, err := c.APIKeys.Create(ctx, ws.ID, "go-admin", []string{"admin"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	own := c.WithAPIKey(key.Key)
	if w, err := own.Workspaces.Wallet(ctx, ws.ID); err != nil || w.Balance != "12.500000" {
		t.Fatalf("its own wallet: %+v %v", w, err)
	}
	if _, err := own.Workspaces.Credit(ctx, ws.ID, "1", "self"); !cella.IsForbidden(err) {
		t.Fatalf("a credit by the workspace's own key: %v", err)
	}
	if _, err := own.Workspaces.Wallet(ctx, defaultWorkspace(t, c)); !cella.IsNotFound(err) {
		t.Fatalf("another workspace's wallet: %v", err)
	}
	keys, err := c.APIKeys.List(ctx)
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys: %v", err)
	}
	if members, err := c.Workspaces.Members(ctx, ws.ID); err != nil || len(members) != 0 {
		t.Fatalf("members of a new workspace: %+v %v", members, err)
	}
}
