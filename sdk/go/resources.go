package cella

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"
)

// ---------------------------------------------------------------------------- one-shot runs

// RunFile is a file written into a one-shot run's sandbox before its command.
type RunFile struct {
	// Path is absolute or relative to the run's cwd.
	Path    string
	Content []byte
}

// RunOptions are a one-shot run's fields.
type RunOptions struct {
	// Argv runs a program directly instead of the shell line.
	Argv      []string
	Files     []RunFile
	Artifacts []string
	Timeout   time.Duration
	Env       map[string]string
	Cwd       string
	User      string
	Stdin     *string
	Template  string
	Size      string
	// Runtime is the isolation runtime of the run's sandbox, "namespace" or "gvisor", as in
	// CreateOptions.Runtime (empty: the template's, then the server's default).
	Runtime  string
	Metadata map[string]string
	Network  *NetworkPolicy
	// Check returns a *CommandExitError for an exit code other than 0.
	Check bool
}

// RunResult is a one-shot run's result.
type RunResult struct {
	ExitCode   int            `json:"exit_code"`
	Stdout     string         `json:"stdout"`
	Stderr     string         `json:"stderr"`
	DurationMS int64          `json:"duration_ms"`
	TimedOut   bool           `json:"timed_out"`
	SandboxID  string         `json:"sandbox_id"`
	Artifacts  []ArtifactInfo `json:"artifacts"`
}

// OK is true for exit code 0.
func (r *RunResult) OK() bool { return r.ExitCode == 0 && !r.TimedOut }

// Run makes a one-shot run: a sandbox is created, the files written, the command run, the
// artifacts kept and the sandbox destroyed, in one request.
func (s *SandboxService) Run(ctx context.Context, command string, opts *RunOptions) (*RunResult, error) {
	b := map[string]any{}
	if opts == nil {
		opts = &RunOptions{}
	}
	if command != "" || opts.Argv == nil {
		b["command"] = command
	}
	if opts.Argv != nil {
		b["argv"] = opts.Argv
	}
	if len(opts.Files) > 0 {
		files := make([]map[string]any, 0, len(opts.Files))
		for _, f := range opts.Files {
			if utf8.Valid(f.Content) {
				files = append(files, map[string]any{"path": f.Path, "content": string(f.Content)})
			} else {
				files = append(files, map[string]any{"path": f.Path, "content": base64.StdEncoding.EncodeToString(f.Content), "encoding": "base64"})
			}
		}
		b["files"] = files
	}
	if opts.Artifacts != nil {
		b["artifacts"] = opts.Artifacts
	}
	if opts.Timeout > 0 {
		b["timeout_sec"] = wholeSeconds(opts.Timeout)
	}
	if opts.Env != nil {
		b["env"] = opts.Env
	}
	if opts.Cwd != "" {
		b["cwd"] = opts.Cwd
	}
	if opts.User != "" {
		b["user"] = opts.User
	}
	if opts.Stdin != nil {
		b["stdin"] = *opts.Stdin
	}
	if opts.Template != "" {
		b["template_id"] = opts.Template
	}
	if opts.Size != "" {
		b["size"] = opts.Size
	}
	if opts.Runtime != "" {
		b["runtime"] = opts.Runtime
	}
	if opts.Metadata != nil {
		b["metadata"] = opts.Metadata
	}
	if opts.Network != nil {
		b["network"] = opts.Network
	}
	var r RunResult
	if err := s.c.do(ctx, &request{method: "POST", path: "/sandboxes/run", body: b}, &r); err != nil {
		return nil, err
	}
	if opts.Check && !r.OK() {
		return &r, &CommandExitError{Result: &CommandResult{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, DurationMS: r.DurationMS, TimedOut: r.TimedOut}}
	}
	return &r, nil
}

// ---------------------------------------------------------------------------- snapshots

// SnapshotService is the workspace's snapshots: client.Snapshots.
type SnapshotService struct{ c *Client }

// List answers the snapshots, newest first (every page, or the first limit; 0: all).
func (s *SnapshotService) List(ctx context.Context, limit int) ([]SnapshotInfo, error) {
	return list[SnapshotInfo](ctx, s.c, "/snapshots", nil, limit)
}

// Get reads one snapshot.
func (s *SnapshotService) Get(ctx context.Context, id string) (*SnapshotInfo, error) {
	var out SnapshotInfo
	if err := s.c.do(ctx, &request{method: "GET", path: "/snapshots/" + seg(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete deletes a snapshot and answers it as it was.
func (s *SnapshotService) Delete(ctx context.Context, id string) (*SnapshotInfo, error) {
	var out SnapshotInfo
	if err := s.c.do(ctx, &request{method: "DELETE", path: "/snapshots/" + seg(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ---------------------------------------------------------------------------- artifacts

// ArtifactInfo is a file kept from a sandbox.
type ArtifactInfo struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Path      string    `json:"path"`
	Size      int64     `json:"size"`
	URL       string    `json:"url"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ArtifactService is the files kept from sandboxes: client.Artifacts.
type ArtifactService struct{ c *Client }

// List answers the workspace's artifacts, newest first; sandboxID keeps one sandbox's.
func (s *ArtifactService) List(ctx context.Context, sandboxID string, limit int) ([]ArtifactInfo, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandbox_id", sandboxID)
	}
	return list[ArtifactInfo](ctx, s.c, "/artifacts", q, limit)
}

// Download opens an artifact's bytes as they stream. Close the reader.
func (s *ArtifactService) Download(ctx context.Context, id string) (io.ReadCloser, error) {
	resp, err := s.c.send(ctx, &request{method: "GET", path: "/artifacts/" + seg(id), headers: map[string]string{"Accept": "application/octet-stream"}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Read reads an artifact whole.
func (s *ArtifactService) Read(ctx context.Context, id string) ([]byte, error) {
	r, err := s.Download(ctx, id)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, connError(err)
	}
	return b, nil
}

// Delete deletes an artifact now and answers it as it was.
func (s *ArtifactService) Delete(ctx context.Context, id string) (*ArtifactInfo, error) {
	var out ArtifactInfo
	if err := s.c.do(ctx, &request{method: "DELETE", path: "/artifacts/" + seg(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ---------------------------------------------------------------------------- templates

// TemplateSize is one size of a template in the catalog.
type TemplateSize struct {
	Size             string            `json:"size"`
	State            string            `json:"state"`
	ResourceContract *ResourceContract `json:"resource_contract"`
}

// TemplateInfo is a catalog entry.
type TemplateInfo struct {
	ID          string         `json:"id"`
	Name        string         `json:"name"`
	Product     string         `json:"product"`
	DefaultSize string         `json:"default_size"`
	Primitive   string         `json:"primitive"`
	SDKName     string         `json:"sdk_name"`
	CLIName     string         `json:"cli_name"`
	Readiness   string         `json:"readiness"`
	Sizes       []TemplateSize `json:"sizes"`
	// Runtimes are the runtimes its sandboxes can run on on this server, its default first.
	Runtimes []string `json:"runtimes"`
}

// BuildStep is one step of a template build.
type BuildStep struct {
	Index      int    `json:"index"`
	Kind       string `json:"kind"`
	State      string `json:"state"`
	DurationMS *int64 `json:"duration_ms"`
}

// TemplateBuild is a build of a custom template.
type TemplateBuild struct {
	ID         string      `json:"id"`
	TemplateID string      `json:"template_id"`
	State      string      `json:"state"` // queued, building, ready, failed
	Steps      []BuildStep `json:"steps"`
	Log        string      `json:"log"`
	LogOffset  int64       `json:"log_offset"`
	Error      *string     `json:"error"`
	CreatedAt  time.Time   `json:"created_at"`
	FinishedAt *time.Time  `json:"finished_at"`
}

// Finished is true once the build is ready or failed.
func (b *TemplateBuild) Finished() bool { return b.State == "ready" || b.State == "failed" }

// TemplateService is the template catalog and custom templates: client.Templates.
type TemplateService struct{ c *Client }

// List answers the catalog (built-in templates and the workspace's own).
func (s *TemplateService) List(ctx context.Context) ([]TemplateInfo, error) {
	var out []TemplateInfo
	if err := s.c.do(ctx, &request{method: "GET", path: "/templates"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Get reads one catalog entry.
func (s *TemplateService) Get(ctx context.Context, id string) (*TemplateInfo, error) {
	var out TemplateInfo
	if err := s.c.do(ctx, &request{method: "GET", path: "/templates/" + seg(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Build starts a build of a template spec (see the API reference: id, from, steps, ...)
// and answers it at once, queued; WaitBuild follows it.
func (s *TemplateService) Build(ctx context.Context, spec map[string]any) (*TemplateBuild, error) {
	var out TemplateBuild
	if err := s.c.do(ctx, &request{method: "POST", path: "/templates", body: spec}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Builds lists a template's builds, newest first (without their logs).
func (s *TemplateService) Builds(ctx context.Context, templateID string) ([]TemplateBuild, error) {
	var out []TemplateBuild
	if err := s.c.do(ctx, &request{method: "GET", path: "/templates/" + seg(templateID) + "/builds"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetBuild reads one build, its log from the byte logOffset on.
func (s *TemplateService) GetBuild(ctx context.Context, templateID, buildID string, logOffset int64) (*TemplateBuild, error) {
	q := url.Values{}
	if logOffset > 0 {
		q.Set("log_offset", strconv.FormatInt(logOffset, 10))
	}
	var out TemplateBuild
	if err := s.c.do(ctx, &request{method: "GET", path: "/templates/" + seg(templateID) + "/builds/" + seg(buildID), query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// WaitBuild polls a build until it is ready or failed, writing its log to log (when not
// nil) as it comes; the answer's Log is the whole log. A failed build is returned with an
// *Error of code BUILD_FAILED. The context bounds the wait.
func (s *TemplateService) WaitBuild(ctx context.Context, build *TemplateBuild, log io.Writer) (*TemplateBuild, error) {
	var whole []byte
	offset := int64(0)
	cur := build
	if cur.LogOffset == 0 && cur.Log != "" {
		whole = append(whole, cur.Log...)
		offset = int64(len(cur.Log))
		if log != nil {
			_, _ = io.WriteString(log, cur.Log)
		}
	}
	for !cur.Finished() {
		select {
		case <-ctx.Done():
			return cur, &Error{Code: CodeTimeout, Message: "build " + build.ID + " was not finished in time", cause: ctx.Err()}
		case <-time.After(250 * time.Millisecond):
		}
		next, err := s.GetBuild(ctx, build.TemplateID, build.ID, offset)
		if err != nil {
			return cur, err
		}
		if next.Log != "" {
			whole = append(whole, next.Log...)
			if log != nil {
				_, _ = io.WriteString(log, next.Log)
			}
		}
		offset = next.LogOffset + int64(len(next.Log))
		cur = next
	}
	cur.Log, cur.LogOffset = string(whole), 0
	if cur.State == "failed" {
		msg := "no reason given"
		if cur.Error != nil {
			msg = *cur.Error
		}
		return cur, &Error{Code: CodeBuildFailed, Message: "build " + cur.ID + " of template " + cur.TemplateID + " failed: " + msg,
			Details: map[string]any{"template_id": cur.TemplateID, "build_id": cur.ID}}
	}
	return cur, nil
}

// Delete deletes one of the workspace's templates (409 while sandboxes or snapshots use
// it) and answers its catalog entry as it was.
func (s *TemplateService) Delete(ctx context.Context, id string) (*TemplateInfo, error) {
	var out TemplateInfo
	if err := s.c.do(ctx, &request{method: "DELETE", path: "/templates/" + seg(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ---------------------------------------------------------------------------- images

// ImageInfo is an OCI image imported for templates.
type ImageInfo struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Reference string          `json:"reference"`
	Digest    string          `json:"digest"`
	Layers    json.RawMessage `json:"layers"`
}

// ImageService is the workspace's imported images: client.Images.
type ImageService struct{ c *Client }

// List answers the workspace's images, oldest first.
func (s *ImageService) List(ctx context.Context) ([]ImageInfo, error) {
	var out []ImageInfo
	if err := s.c.do(ctx, &request{method: "GET", path: "/images"}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Import uploads an OCI image layout as a tar stream (size: its length, -1 when unknown)
// under name.
func (s *ImageService) Import(ctx context.Context, name string, tar io.Reader, size int64) (*ImageInfo, error) {
	var out ImageInfo
	err := s.c.do(ctx, &request{method: "POST", path: "/images", query: url.Values{"name": {name}}, body: tar, contentLength: size,
		headers: map[string]string{"Content-Type": "application/x-tar"}}, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete deletes an image and answers it as it was.
func (s *ImageService) Delete(ctx context.Context, id string) (*ImageInfo, error) {
	var out ImageInfo
	if err := s.c.do(ctx, &request{method: "DELETE", path: "/images/" + seg(id)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
