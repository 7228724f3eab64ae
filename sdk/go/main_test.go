package cella_test

// The suite runs against a real server started by TestMain from $CELLA_BIN (see
// internal/testserver), with real sandboxes. The server has a git forge over a local bare
// repository and a command agent that edits a file and commits, for the task run's test.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cella "github.com/cella-dev/cella-go"
	"github.com/cella-dev/cella-go/internal/testserver"
)

const size = "xs" // every test sandbox is of the smallest size

// uploadLimit is the server's [files] max_upload_bytes: above the 10 MiB round trip, below
// the 413 case's upload.
const uploadLimit = 12 << 20

var (
	srv      *testserver.Server
	repoRoot string // bare repositories of the git forge: repoRoot/acme/web.git
)

const agentScript = `echo "greeting from the agent" > GREETING.txt && git -c user.name=agent -c user.email=agent@example.org add -A && git -c user.name=agent -c user.email=agent@example.org commit -qm "Add the greeting" && echo agent done`

func serverConfig(repos string) string {
	return fmt.Sprintf(`
[files]
max_upload_bytes = %d

[tasks]
runners = 1
heartbeat_interval_sec = 1
grace_sec = 2

[[forges]]
name = "local"
kind = "git"
url_template = "%s/{repository}.git"

[[agents]]
name = "script"
kind = "command"
command = ["bash", "-c", '''%s''']

[[agents]]
name = "sleeper"
kind = "command"
command = ["bash", "-c", "echo sleeper started; exec sleep 300"]
`, uploadLimit, repos, agentScript)
}

func git(dir string, args ...string) error {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.org", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.org")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// makeRepo makes the bare repository acme/web with one commit on main.
func makeRepo(root string) error {
	work, err := os.MkdirTemp("", "cella-go-repo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := git(work, "init", "-q", "-b", "main"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "README.md"), []byte("# web\n"), 0o644); err != nil {
		return err
	}
	if err := git(work, "add", "-A"); err != nil {
		return err
	}
	if err := git(work, "commit", "-q", "-m", "the first commit"); err != nil {
		return err
	}
	bare := filepath.Join(root, "acme", "web.git")
	if err := os.MkdirAll(filepath.Dir(bare), 0o755); err != nil {
		return err
	}
	return git(root, "clone", "-q", "--bare", work, bare)
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the tests start a Cella server, which must run as root")
		return 1
	}
	var err error
	repoRoot, err = os.MkdirTemp("", "cella-go-repos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(repoRoot)
	if err := makeRepo(repoRoot); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv, err = testserver.Start(serverConfig(repoRoot), "cella")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	// The SDK finds the server through the environment, as a user's program would.
	os.Setenv("CELLA_SERVER", srv.URL)
	os.Setenv("CELLA_API_KEY", srv.Key)
	rc := m.Run()
	if left := srv.Stop(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "the tests left sandboxes behind: %v\n", left)
		if rc == 0 {
			rc = 1
		}
	}
	return rc
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newSandbox makes a running sandbox destroyed when the test ends.
func newSandbox(t *testing.T, opts *cella.CreateOptions) *cella.Sandbox {
	t.Helper()
	if opts == nil {
		opts = &cella.CreateOptions{}
	}
	if opts.Size == "" && opts.SnapshotID == "" {
		opts.Size = size
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Minute
	}
	sb, err := cella.NewClient().Sandboxes.Create(ctxFor(t, 2*time.Minute), opts)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { killSandbox(t, sb) })
	return sb
}

func killSandbox(t *testing.T, sb *cella.Sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := sb.Kill(ctx); err != nil && !cella.IsNotFound(err) {
		t.Errorf("destroying %s: %v", sb.ID(), err)
	}
}

// defaultWorkspace is the id of the server's default workspace.
func defaultWorkspace(t *testing.T, c *cella.Client) string {
	t.Helper()
	wss, err := c.Workspaces.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wss {
		if w.Name == "default" {
			return w.ID
		}
	}
	t.Fatal("no default workspace")
	return ""
}
