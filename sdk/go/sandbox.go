package cella

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"time"
)

// NetworkPolicy is a sandbox's egress policy.
type NetworkPolicy struct {
	// Egress is "allow" (default) or "deny".
	Egress string   `json:"egress,omitempty"`
	Allow  []string `json:"allow,omitempty"`
	Deny   []string `json:"deny,omitempty"`
}

// ResourceContract is a size's published resources.
type ResourceContract struct {
	ContractID      string `json:"contract_id"`
	ContractVersion string `json:"contract_version"`
	Product         string `json:"product"`
	Size            string `json:"size"`
	VCPUs           int    `json:"vcpus"`
	MemoryMB        int    `json:"memory_mb"`
	DiskSizeMB      int    `json:"disk_size_mb"`
}

// SandboxInfo is the sandbox object.
type SandboxInfo struct {
	ID                 string            `json:"id"`
	TenantID           string            `json:"tenant_id"`
	OwnerID            string            `json:"owner_id"`
	TemplateID         string            `json:"template_id"`
	State              string            `json:"state"`
	Size               string            `json:"size"`
	ResourceContract   *ResourceContract `json:"resource_contract"`
	CPUCount           int               `json:"cpu_count"`
	MemoryMB           int               `json:"memory_mb"`
	DiskSizeMB         int               `json:"disk_size_mb"`
	Ready              bool              `json:"ready"`
	ReadyAt            *time.Time        `json:"ready_at"`
	StartedAt          *time.Time        `json:"started_at"`
	PreviewURL         *string           `json:"preview_url"`
	TimeoutSec         int64             `json:"timeout_sec"`
	TimeoutRemainingMS *int64            `json:"timeout_remaining_ms"`
	AlwaysOn           bool              `json:"always_on"`
	Persistent         bool              `json:"persistent"`
	IdleTimeoutSec     int64             `json:"idle_timeout_sec"`
	TotalRuntimeSec    *int64            `json:"total_runtime_sec"`
	Metadata           map[string]string `json:"metadata"`
	CreatedAt          time.Time         `json:"created_at"`
	DestroyedAt        *time.Time        `json:"destroyed_at"`
	StateReason        *string           `json:"state_reason"`
	Network            *NetworkPolicy    `json:"network"`
	Preview            *PreviewSettings  `json:"preview"`
	AutoResume         bool              `json:"auto_resume"`
	ComputeRate        string            `json:"compute_rate"`
	ComputeCost        string            `json:"compute_cost"`
	ModelCost          string            `json:"model_cost"`
	// Runtime is the isolation runtime it runs on: "namespace" or "gvisor".
	Runtime string `json:"runtime"`
	// Memory says where a paused sandbox's memory is ("in_ram" or "on_disk"); nil when the
	// server does not say.
	Memory *string `json:"memory"`
}

// PreviewSettings says who may use a sandbox's previews.
type PreviewSettings struct {
	Public bool `json:"public"`
}

// CreateOptions are the fields of a create; the zero value makes a sandbox of the base
// template, its default size, and waits until it runs.
type CreateOptions struct {
	// Template is the template id (default "base").
	Template string
	// Size is xs, small, medium, large or xl (default: the template's).
	Size string
	// CPUCount, MemoryMB and DiskSizeMB are the compatibility form of Size: all three together,
	// equal to one size's resource contract (1, 1024, 4096 is xs); 0 is not sent.
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	// Timeout is the active-session timeout (rounded up to seconds; default one hour).
	Timeout time.Duration
	// IdleTimeout is the idle timer (0: the server's default; see NoIdleTimeout).
	IdleTimeout time.Duration
	// NoIdleTimeout turns the idle timer off.
	NoIdleTimeout bool
	Metadata      map[string]string
	Env           map[string]string
	Network       *NetworkPolicy
	// Persistent (nil: the server's default, true).
	Persistent *bool
	AlwaysOn   bool
	// NoWait answers at once (202) with the sandbox provisioning; see Sandbox.WaitReady.
	NoWait bool
	// SnapshotID starts from a snapshot's files.
	SnapshotID string
	// Runtime is the isolation runtime, "namespace" or "gvisor" (empty: the template's, then
	// the server's default); gvisor needs runsc on the server.
	Runtime string
	// PrivatePreview makes previews need a preview token.
	PrivatePreview bool
	AutoResume     bool
	ModelAccess    bool
	// Extra adds raw fields to the body.
	Extra map[string]any
}

func (o *CreateOptions) body() map[string]any {
	b := map[string]any{}
	if o == nil {
		return b
	}
	if o.Template != "" {
		b["template_id"] = o.Template
	}
	if o.Size != "" {
		b["size"] = o.Size
	}
	if o.CPUCount != 0 {
		b["cpu_count"] = o.CPUCount
	}
	if o.MemoryMB != 0 {
		b["memory_mb"] = o.MemoryMB
	}
	if o.DiskSizeMB != 0 {
		b["disk_size_mb"] = o.DiskSizeMB
	}
	if o.Timeout > 0 {
		b["timeout_sec"] = wholeSeconds(o.Timeout)
	}
	if o.NoIdleTimeout {
		b["idle_timeout_sec"] = 0
	} else if o.IdleTimeout > 0 {
		b["idle_timeout_sec"] = wholeSeconds(o.IdleTimeout)
	}
	if o.Metadata != nil {
		b["metadata"] = o.Metadata
	}
	if o.Env != nil {
		b["env"] = o.Env
	}
	if o.Network != nil {
		b["network"] = o.Network
	}
	if o.Persistent != nil {
		b["persistent"] = *o.Persistent
	}
	if o.AlwaysOn {
		b["always_on"] = true
	}
	if o.NoWait {
		b["wait"] = false
	}
	if o.SnapshotID != "" {
		b["snapshot_id"] = o.SnapshotID
	}
	if o.Runtime != "" {
		b["runtime"] = o.Runtime
	}
	if o.PrivatePreview {
		b["preview"] = map[string]any{"public": false}
	}
	if o.AutoResume {
		b["auto_resume"] = true
	}
	if o.ModelAccess {
		b["model_access"] = true
	}
	for k, v := range o.Extra {
		b[k] = v
	}
	return b
}

// SandboxService makes and finds sandboxes: client.Sandboxes.
type SandboxService struct{ c *Client }

// Create makes a sandbox and (unless NoWait) waits until it runs.
func (s *SandboxService) Create(ctx context.Context, opts *CreateOptions) (*Sandbox, error) {
	var info SandboxInfo
	if err := s.c.do(ctx, &request{method: "POST", path: "/sandboxes", body: opts.body()}, &info); err != nil {
		return nil, err
	}
	return newSandbox(s.c, &info), nil
}

// Connect attaches to an existing sandbox; a paused or stopped one is resumed first unless
// noResume is true.
func (s *SandboxService) Connect(ctx context.Context, id string, noResume ...bool) (*Sandbox, error) {
	info, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	sb := newSandbox(s.c, info)
	if (len(noResume) == 0 || !noResume[0]) && (info.State == "paused" || info.State == "stopped") {
		if _, err := sb.Resume(ctx); err != nil {
			return nil, err
		}
	}
	return sb, nil
}

// Get reads one sandbox.
func (s *SandboxService) Get(ctx context.Context, id string) (*SandboxInfo, error) {
	var info SandboxInfo
	if err := s.c.do(ctx, &request{method: "GET", path: "/sandboxes/" + seg(id)}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Kill destroys a sandbox by its id, without a handle and without resuming it first
// (idempotent: a destroyed one answers as it is). A missing id is a not-found error.
func (s *SandboxService) Kill(ctx context.Context, id string) (*SandboxInfo, error) {
	var info SandboxInfo
	if err := s.c.do(ctx, &request{method: "DELETE", path: "/sandboxes/" + seg(id)}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// ListOptions filter a sandbox listing.
type ListOptions struct {
	// State keeps one state ("all": every state; empty: the live ones).
	State string
	// Metadata keeps sandboxes whose metadata has every entry given.
	Metadata map[string]string
	// Limit stops after that many (0: every page).
	Limit int
}

// List answers the workspace's sandboxes, newest first, reading every page (or Limit).
func (s *SandboxService) List(ctx context.Context, opts *ListOptions) ([]SandboxInfo, error) {
	q := url.Values{}
	limit := 0
	if opts != nil {
		if opts.State != "" {
			q.Set("state", opts.State)
		}
		for k, v := range opts.Metadata {
			q.Set("metadata."+k, v)
		}
		limit = opts.Limit
	}
	return list[SandboxInfo](ctx, s.c, "/sandboxes", q, limit)
}

// Sandbox is a handle on one sandbox, with its Commands, Files and Code interpreter.
type Sandbox struct {
	c    *Client
	info SandboxInfo

	// Commands runs commands and background processes.
	Commands *Commands
	// Files reads and writes the sandbox's filesystem.
	Files *Files
	// Code is the persistent code interpreter.
	Code *CodeInterpreter
}

func newSandbox(c *Client, info *SandboxInfo) *Sandbox {
	sb := &Sandbox{c: c, info: *info}
	sb.Commands = &Commands{sb: sb}
	sb.Files = &Files{sb: sb}
	sb.Code = &CodeInterpreter{sb: sb}
	return sb
}

// ID is the sandbox's id.
func (sb *Sandbox) ID() string { return sb.info.ID }

// Info is the sandbox as last seen (updated by every call that answers it).
func (sb *Sandbox) Info() SandboxInfo { return sb.info }

// State is the sandbox's state as last seen.
func (sb *Sandbox) State() string { return sb.info.State }

// Client is the client the handle uses.
func (sb *Sandbox) Client() *Client { return sb.c }

func (sb *Sandbox) path(rest ...string) string {
	p := "/sandboxes/" + seg(sb.info.ID)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

func (sb *Sandbox) lifecycle(ctx context.Context, method, what string, body any) (*SandboxInfo, error) {
	p := sb.path()
	if what != "" {
		p = sb.path(what)
	}
	var info SandboxInfo
	if err := sb.c.do(ctx, &request{method: method, path: p, body: body}, &info); err != nil {
		return nil, err
	}
	sb.info = info
	return &info, nil
}

// Refresh reads the sandbox again.
func (sb *Sandbox) Refresh(ctx context.Context) (*SandboxInfo, error) {
	return sb.lifecycle(ctx, "GET", "", nil)
}

// WaitReady polls until the sandbox runs (after a create with NoWait); the context bounds
// the wait.
func (sb *Sandbox) WaitReady(ctx context.Context) (*SandboxInfo, error) {
	for {
		info, err := sb.Refresh(ctx)
		if err != nil {
			return nil, err
		}
		if info.State == "running" && info.Ready {
			return info, nil
		}
		switch info.State {
		case "error", "destroyed", "stopped":
			reason := ""
			if info.StateReason != nil {
				reason = ": " + *info.StateReason
			}
			return nil, &Error{Code: CodeUnavailable, Message: "sandbox " + info.ID + " is " + info.State + reason,
				Details: map[string]any{"sandbox_id": info.ID, "state": info.State}}
		}
		select {
		case <-ctx.Done():
			return nil, &Error{Code: CodeTimeout, Message: "sandbox " + info.ID + " was not running in time (state " + info.State + ")", cause: ctx.Err()}
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Pause freezes every process (memory kept). Only from running.
func (sb *Sandbox) Pause(ctx context.Context) (*SandboxInfo, error) {
	return sb.lifecycle(ctx, "POST", "pause", nil)
}

// Resume thaws a paused sandbox, or boots a stopped one again on its kept files.
func (sb *Sandbox) Resume(ctx context.Context) (*SandboxInfo, error) {
	return sb.lifecycle(ctx, "POST", "resume", nil)
}

// Stop ends every process and keeps the files (persistent sandboxes only).
func (sb *Sandbox) Stop(ctx context.Context) (*SandboxInfo, error) {
	return sb.lifecycle(ctx, "POST", "stop", nil)
}

// Kill destroys the sandbox (idempotent); its files are gone.
func (sb *Sandbox) Kill(ctx context.Context) (*SandboxInfo, error) {
	return sb.lifecycle(ctx, "DELETE", "", nil)
}

// SetTimeout sets the active-session timeout; on a running sandbox the timer restarts.
func (sb *Sandbox) SetTimeout(ctx context.Context, timeout time.Duration) (*SandboxInfo, error) {
	return sb.lifecycle(ctx, "POST", "timeout", map[string]any{"timeout_sec": wholeSeconds(timeout)})
}

// SandboxUsage is a sandbox's usage figures.
type SandboxUsage struct {
	SandboxID    string    `json:"sandbox_id"`
	State        string    `json:"state"`
	RunningSec   float64   `json:"running_sec"`
	PausedSec    float64   `json:"paused_sec"`
	BilledSec    int64     `json:"billed_sec"`
	CPUSec       float64   `json:"cpu_sec"`
	MemoryMiBSec float64   `json:"memory_mib_sec"`
	MemoryMiBNow *float64  `json:"memory_mib_now"`
	MeasuredAt   time.Time `json:"measured_at"`
}

// Usage reads the sandbox's running time, CPU and memory figures.
func (sb *Sandbox) Usage(ctx context.Context) (*SandboxUsage, error) {
	var u SandboxUsage
	if err := sb.c.do(ctx, &request{method: "GET", path: sb.path("usage")}, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// SnapshotInfo is a snapshot.
type SnapshotInfo struct {
	ID         string    `json:"id"`
	SandboxID  string    `json:"sandbox_id"`
	TemplateID string    `json:"template_id"`
	Size       string    `json:"size"`
	SizeBytes  int64     `json:"size_bytes"`
	CreatedAt  time.Time `json:"created_at"`
	// Memory says whether it holds the sandbox's memory and processes too (a gvisor
	// checkpoint): sandboxes made from it continue where the sandbox was.
	Memory bool `json:"memory"`
}

// SnapshotOptions are the optional fields of CreateSnapshot.
type SnapshotOptions struct {
	// Memory keeps the sandbox's memory and processes too (gvisor sandboxes only; on a
	// namespace sandbox the answer is a 400 naming "memory").
	Memory bool
}

// CreateSnapshot copies the sandbox's files into a snapshot, from which
// CreateOptions.SnapshotID starts new sandboxes; with &SnapshotOptions{Memory: true} (gvisor)
// its memory and processes too. Options after the first are ignored.
func (sb *Sandbox) CreateSnapshot(ctx context.Context, opts ...*SnapshotOptions) (*SnapshotInfo, error) {
	req := &request{method: "POST", path: sb.path("snapshots")}
	if len(opts) > 0 && opts[0] != nil {
		req.body = map[string]any{"memory": opts[0].Memory}
	}
	var s SnapshotInfo
	if err := sb.c.do(ctx, req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ForkInfo describes a fork.
type ForkInfo struct {
	SourceID         string  `json:"source_id"`
	SourcePausedMS   float64 `json:"source_paused_ms"`
	FilesystemCopied bool    `json:"filesystem_copied"`
	ProcessesCopied  bool    `json:"processes_copied"`
}

// Fork makes count new sandboxes (1-10) that start with this one's files; metadata is
// merged over the source's.
func (sb *Sandbox) Fork(ctx context.Context, count int, metadata map[string]string) ([]*Sandbox, *ForkInfo, error) {
	body := map[string]any{}
	if count > 0 {
		body["count"] = count
	}
	if metadata != nil {
		body["metadata"] = metadata
	}
	resp, err := sb.c.send(ctx, &request{method: "POST", path: sb.path("fork"), body: body})
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Data []SandboxInfo `json:"data"`
		Fork ForkInfo      `json:"fork"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, nil, decodeError(resp, err)
	}
	sbs := make([]*Sandbox, len(out.Data))
	for i := range out.Data {
		sbs[i] = newSandbox(sb.c, &out.Data[i])
	}
	return sbs, &out.Fork, nil
}

// ExposedPort is every address of a port inside the sandbox.
type ExposedPort struct {
	Port           int        `json:"port"`
	URL            string     `json:"url"`
	HostURL        string     `json:"host_url"`
	PathURL        string     `json:"path_url"`
	Token          *string    `json:"token"`
	TokenExpiresAt *time.Time `json:"token_expires_at"`
}

// Expose answers the preview addresses of a port inside the sandbox.
func (sb *Sandbox) Expose(ctx context.Context, port int) (*ExposedPort, error) {
	var e ExposedPort
	if err := sb.c.do(ctx, &request{method: "POST", path: sb.path("expose"), body: map[string]any{"port": port}}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// PreviewToken is a minted preview token.
type PreviewToken struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// PreviewToken mints a preview token valid for ttl (0: the server's default); rotate first
// invalidates every token handed out before.
func (sb *Sandbox) PreviewToken(ctx context.Context, ttl time.Duration, rotate bool) (*PreviewToken, error) {
	body := map[string]any{}
	if ttl > 0 {
		body["ttl_sec"] = wholeSeconds(ttl)
	}
	if rotate {
		body["rotate"] = true
	}
	var t PreviewToken
	if err := sb.c.do(ctx, &request{method: "POST", path: sb.path("preview-token"), body: body}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// CollectArtifacts keeps files of the running sandbox as artifacts (globs or paths,
// relative to /home/user or absolute).
func (sb *Sandbox) CollectArtifacts(ctx context.Context, paths ...string) ([]ArtifactInfo, error) {
	var out []ArtifactInfo
	if paths == nil {
		paths = []string{}
	}
	if err := sb.c.do(ctx, &request{method: "POST", path: sb.path("artifacts"), body: map[string]any{"paths": paths}}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func itoa(n int) string { return strconv.Itoa(n) }
