package cella_test

import (
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	cella "github.com/cella-dev/cella-go"
)

func TestSnapshotsAndFork(t *testing.T) {
	ctx := ctxFor(t, 4*time.Minute)
	c := cella.NewClient()
	sb := newSandbox(t, nil)
	if _, err := sb.Files.WriteText(ctx, "/home/user/kept.txt", "from the source", nil); err != nil {
		t.Fatal(err)
	}
	snap, err := sb.CreateSnapshot(ctx)
	if err != nil || snap.SandboxID != sb.ID() || snap.Memory {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	defer c.Snapshots.Delete(ctx, snap.ID)
	if got, err := c.Snapshots.Get(ctx, snap.ID); err != nil || got.ID != snap.ID {
		t.Fatalf("get: %+v %v", got, err)
	}
	snaps, err := c.Snapshots.List(ctx, 0)
	if err != nil || len(snaps) == 0 || snaps[0].ID != snap.ID {
		t.Fatalf("list: %+v %v", snaps, err)
	}
	from := newSandbox(t, &cella.CreateOptions{SnapshotID: snap.ID})
	if txt, err := from.Files.ReadText(ctx, "/home/user/kept.txt"); err != nil || txt != "from the source" {
		t.Fatalf("a sandbox from the snapshot: %q %v", txt, err)
	}
	forks, info, err := sb.Fork(ctx, 1, map[string]string{"attempt": "b"})
	if err != nil || len(forks) != 1 || !info.FilesystemCopied || info.SourceID != sb.ID() {
		t.Fatalf("fork: %+v %+v %v", forks, info, err)
	}
	defer killSandbox(t, forks[0])
	if forks[0].Info().Metadata["attempt"] != "b" {
		t.Fatalf("the fork's metadata: %v", forks[0].Info().Metadata)
	}
	if txt, err := forks[0].Files.ReadText(ctx, "/home/user/kept.txt"); err != nil || txt != "from the source" {
		t.Fatalf("the fork's files: %q %v", txt, err)
	}
	if _, err := c.Snapshots.Delete(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshots.Get(ctx, snap.ID); !cella.IsNotFound(err) {
		t.Fatalf("a deleted snapshot: %v", err)
	}
}

func TestOneShotRunAndArtifacts(t *testing.T) {
	ctx := ctxFor(t, 3*time.Minute)
	c := cella.NewClient()
	res, err := c.Sandboxes.Run(ctx, "mkdir -p out && sort in.csv > out/sorted.csv && wc -l < in.csv", &cella.RunOptions{
		Size:      size,
		Files:     []cella.RunFile{{Path: "in.csv", Content: []byte("b,2\na,1\n")}, {Path: "bin.dat", Content: []byte{0xff, 0x00}}},
		Artifacts: []string{"out/*.csv", "bin.dat"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "2\n" || len(res.Artifacts) != 2 {
		t.Fatalf("run: %+v", res)
	}
	info, err := c.Sandboxes.Get(ctx, res.SandboxID)
	if err != nil || info.State != "destroyed" {
		t.Fatalf("the run's sandbox: %+v %v", info, err)
	}
	arts, err := c.Artifacts.List(ctx, res.SandboxID, 0)
	if err != nil || len(arts) != 2 {
		t.Fatalf("artifacts: %+v %v", arts, err)
	}
	for _, a := range arts {
		data, err := c.Artifacts.Read(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasSuffix(a.Path, "/out/sorted.csv"):
			if string(data) != "a,1\nb,2\n" {
				t.Fatalf("sorted.csv: %q", data)
			}
		case strings.HasSuffix(a.Path, "/bin.dat"):
			if string(data) != "\xff\x00" {
				t.Fatalf("bin.dat: %q", data)
			}
		default:
			t.Fatalf("an artifact not asked for: %+v", a)
		}
		if _, err := c.Artifacts.Delete(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Artifacts.Read(ctx, arts[0].ID); !cella.IsNotFound(err) {
		t.Fatalf("a deleted artifact: %v", err)
	}
	_, err = c.Sandboxes.Run(ctx, "exit 9", &cella.RunOptions{Size: size, Check: true})
	if ee, ok := err.(*cella.CommandExitError); !ok || ee.Result.ExitCode != 9 {
		t.Fatalf("Check on a run: %v", err)
	}

	// Collecting from a running sandbox.
	sb := newSandbox(t, nil)
	if _, err := sb.Files.WriteText(ctx, "/home/user/report.json", "{}", nil); err != nil {
		t.Fatal(err)
	}
	kept, err := sb.CollectArtifacts(ctx, "*.json")
	if err != nil || len(kept) != 1 || kept[0].Path != "/home/user/report.json" {
		t.Fatalf("collect: %+v %v", kept, err)
	}
	r, err := c.Artifacts.Download(ctx, kept[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}

func TestPreviews(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, &cella.CreateOptions{PrivatePreview: true})
	if _, err := sb.Commands.Start(ctx, "mkdir -p /tmp/site && echo preview-ok > /tmp/site/index.html && exec python3 -m http.server 8000 --directory /tmp/site", nil); err != nil {
		t.Fatal(err)
	}
	exp, err := sb.Expose(ctx, 8000)
	if err != nil || exp.Port != 8000 || exp.Token == nil || !strings.Contains(exp.PathURL, "/preview/"+sb.ID()+"/8000/") {
		t.Fatalf("expose: %+v %v", exp, err)
	}
	var body string
	for i := 0; i < 100; i++ {
		resp, err := http.Get(exp.URL)
		if err == nil {
			b := new(strings.Builder)
			_, _ = ioCopy(b, resp)
			if resp.StatusCode == 200 {
				body = b.String()
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if body != "preview-ok\n" {
		t.Fatalf("the app through its signed preview URL: %q", body)
	}
	tok, err := sb.PreviewToken(ctx, time.Hour, true)
	if err != nil || tok.Token == "" || time.Until(tok.ExpiresAt) > time.Hour+time.Minute {
		t.Fatalf("preview token: %+v %v", tok, err)
	}
	if _, err := sb.Expose(ctx, 0); !cella.IsInvalidRequest(err) {
		t.Fatalf("port 0: %v", err)
	}
}

func TestTemplates(t *testing.T) {
	ctx := ctxFor(t, 4*time.Minute)
	c := cella.NewClient()
	cat, err := c.Templates.List(ctx)
	if err != nil || len(cat) == 0 {
		t.Fatalf("catalog: %+v %v", cat, err)
	}
	base, err := c.Templates.Get(ctx, "base")
	if err != nil || base.ID != "base" || len(base.Sizes) != 5 {
		t.Fatalf("base: %+v %v", base, err)
	}
	build, err := c.Templates.Build(ctx, map[string]any{
		"id": "go-sdk-tpl", "default_size": size,
		"steps": []any{map[string]any{"run": "echo built-by-go > /opt/marker.txt && echo step output"}},
	})
	if err != nil || build.State != "queued" || build.TemplateID != "go-sdk-tpl" {
		t.Fatalf("build: %+v %v", build, err)
	}
	var log strings.Builder
	done, err := c.Templates.WaitBuild(ctx, build, &log)
	if err != nil || done.State != "ready" || !strings.Contains(done.Log, "step output") || log.String() != done.Log {
		t.Fatalf("wait build: %+v %v\n%s", done, err, log.String())
	}
	builds, err := c.Templates.Builds(ctx, "go-sdk-tpl")
	if err != nil || len(builds) != 1 || builds[0].ID != build.ID {
		t.Fatalf("builds: %+v %v", builds, err)
	}
	sb := newSandbox(t, &cella.CreateOptions{Template: "go-sdk-tpl"})
	if txt, err := sb.Files.ReadText(ctx, "/opt/marker.txt"); err != nil || txt != "built-by-go\n" {
		t.Fatalf("a sandbox of the template: %q %v", txt, err)
	}
	if _, err := c.Templates.Delete(ctx, "go-sdk-tpl"); !cella.IsConflict(err) {
		t.Fatalf("deleting a template a sandbox uses: %v", err)
	}
	killSandbox(t, sb)
	if _, err := c.Templates.Delete(ctx, "go-sdk-tpl"); err != nil {
		t.Fatal(err)
	}
	// A build that fails.
	bad, err := c.Templates.Build(ctx, map[string]any{"id": "go-sdk-bad", "steps": []any{map[string]any{"run": "exit 3"}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Templates.WaitBuild(ctx, bad, nil)
	if e, ok := err.(*cella.Error); !ok || e.Code != cella.CodeBuildFailed {
		t.Fatalf("a failed build: %v", err)
	}
	_, _ = c.Templates.Delete(ctx, "go-sdk-bad")
	if imgs, err := c.Images.List(ctx); err != nil || len(imgs) != 0 {
		t.Fatalf("images: %+v %v", imgs, err)
	}
}

func TestUsersAndSessions(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	admin := cella.NewClient()
	u, err := admin.Users.Create(ctx, "ann-go@example.org", "Ann", "a long password")
	if err != nil || u.Email != "ann-go@example.org" {
		t.Fatalf("create user: %+v %v", u, err)
	}
	if _, err := admin.Users.Me(ctx); !cella.IsForbidden(err) {
		t.Fatalf("/me with a key: %v", err)
	}
	jar, _ := cookiejar.New(nil)
	ann := clientWithoutKey(admin.Server(), jar)
	if _, err := ann.Users.SignIn(ctx, "ann-go@example.org", "wrong password"); !cella.IsUnauthorized(err) {
		t.Fatalf("a wrong password: %v", err)
	}
	sess, err := ann.Users.SignIn(ctx, "ann-go@example.org", "a long password")
	if err != nil || sess.User.ID != u.ID || sess.CSRFToken == "" {
		t.Fatalf("sign in: %+v %v", sess, err)
	}
	me, err := ann.Users.Me(ctx)
	if err != nil || me.User.ID != u.ID || len(me.Workspaces) != 1 || me.Workspaces[0].Role != "owner" {
		t.Fatalf("me: %+v %v", me, err)
	}
	// A write as the user (the CSRF token goes along): a sandbox in their own workspace.
	wsID := me.Workspaces[0].Workspace.ID
	if _, err := ann.Workspaces.Update(ctx, wsID, cella.WorkspaceUpdate{Name: "Ann's"}); err != nil {
		t.Fatalf("a write with the session: %v", err)
	}
	members, err := ann.Workspaces.Members(ctx, wsID)
	if err != nil || len(members) != 1 || members[0].UserID != u.ID {
		t.Fatalf("members: %+v %v", members, err)
	}
	// The operator adds Ann to an organization workspace, then changes and removes her.
	org, err := admin.Workspaces.Create(ctx, "go-org", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := admin.Workspaces.AddMember(ctx, org.ID, "ann-go@example.org", "member"); err != nil || m.Role != "member" {
		t.Fatalf("add member: %+v %v", m, err)
	}
	if m, err := admin.Workspaces.UpdateMember(ctx, org.ID, u.ID, "admin"); err != nil || m.Role != "admin" {
		t.Fatalf("update member: %+v %v", m, err)
	}
	if err := admin.Workspaces.RemoveMember(ctx, org.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	if err := ann.Users.SignOut(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ann.Users.Me(ctx); !cella.IsUnauthorized(err) {
		t.Fatalf("/me after sign-out: %v", err)
	}
}
