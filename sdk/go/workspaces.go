package cella

import (
	"context"
	"net/url"
	"time"
)

// WorkspaceSettings are a workspace's settings.
type WorkspaceSettings struct {
	TasksEnabled        bool     `json:"tasks_enabled"`
	ComputeRate         string   `json:"compute_rate"`
	SessionLimitMin     int      `json:"session_limit_min"`
	HeartbeatTimeoutSec int      `json:"heartbeat_timeout_sec"`
	ModelAllowlist      []string `json:"model_allowlist,omitempty"`
	// TaskRuntime is where the workspace's task runs' sandboxes run ("namespace" or
	// "gvisor"); empty means the server's default, "namespace".
	TaskRuntime string `json:"task_runtime,omitempty"`
}

// Workspace is a workspace (tenant).
type Workspace struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Plan      string            `json:"plan"`
	Kind      string            `json:"kind"`
	CreatedAt time.Time         `json:"created_at"`
	Settings  WorkspaceSettings `json:"settings"`
}

// WorkspaceUpdate is a change of a workspace; Settings is merged over the current ones
// (only the fields given change).
type WorkspaceUpdate struct {
	Name     string         `json:"name,omitempty"`
	Plan     string         `json:"plan,omitempty"`
	Settings map[string]any `json:"settings,omitempty"`
}

// Wallet is a workspace's money (amounts are decimal strings, 6 decimals).
type Wallet struct {
	Balance   string `json:"balance"`
	Reserved  string `json:"reserved"`
	Available string `json:"available"`
	Currency  string `json:"currency"`
}

// LedgerEntry is one change of a wallet's balance.
type LedgerEntry struct {
	ID           string    `json:"id"`
	At           time.Time `json:"at"`
	Kind         string    `json:"kind"` // credit, compute, model, refund
	Amount       string    `json:"amount"`
	BalanceAfter string    `json:"balance_after"`
	SandboxID    *string   `json:"sandbox_id,omitempty"`
	TaskID       *string   `json:"task_id,omitempty"`
	Reference    *string   `json:"reference,omitempty"`
	ComputeSec   *int64    `json:"compute_sec,omitempty"`
	ComputeRate  *string   `json:"compute_rate,omitempty"`
	Model        *string   `json:"model,omitempty"`
	InputTokens  *int64    `json:"input_tokens,omitempty"`
	OutputTokens *int64    `json:"output_tokens,omitempty"`
}

// UsageFigures are a period's usage.
type UsageFigures struct {
	ComputeSec    int64  `json:"compute_sec"`
	ComputeCost   string `json:"compute_cost"`
	ModelRequests int64  `json:"model_requests"`
	InputTokens   int64  `json:"input_tokens"`
	OutputTokens  int64  `json:"output_tokens"`
	ModelCost     string `json:"model_cost"`
}

// UsageDay is one UTC day's usage.
type UsageDay struct {
	Date string `json:"date"`
	UsageFigures
}

// UsageReport is a workspace's usage per day.
type UsageReport struct {
	From     string       `json:"from"`
	To       string       `json:"to"`
	Currency string       `json:"currency"`
	Days     []UsageDay   `json:"days"`
	Totals   UsageFigures `json:"totals"`
}

// WorkspaceStorage is what a workspace stores against its quota, in bytes.
type WorkspaceStorage struct {
	UsedBytes      int64  `json:"used_bytes"`
	QuotaBytes     *int64 `json:"quota_bytes"`
	SnapshotsBytes int64  `json:"snapshots_bytes"`
	ArtifactsBytes int64  `json:"artifacts_bytes"`
	ImagesBytes    int64  `json:"images_bytes"`
	TemplatesBytes int64  `json:"templates_bytes"`
}

// Member is a user's membership of a workspace.
type Member struct {
	UserID    string     `json:"user_id"`
	Email     string     `json:"email"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
}

// WorkspaceService reads and changes workspaces: client.Workspaces.
type WorkspaceService struct{ c *Client }

func wsPath(id string, rest string) string { return "/workspaces/" + seg(id) + rest }

// List answers the workspaces the key may see (the operator: every one).
func (s *WorkspaceService) List(ctx context.Context) ([]Workspace, error) {
	return list[Workspace](ctx, s.c, "/workspaces", nil, 0)
}

// Create makes a workspace (the operator only); plan and kind may be "".
func (s *WorkspaceService) Create(ctx context.Context, name, plan, kind string) (*Workspace, error) {
	b := map[string]any{"name": name}
	if plan != "" {
		b["plan"] = plan
	}
	if kind != "" {
		b["kind"] = kind
	}
	var w Workspace
	if err := s.c.do(ctx, &request{method: "POST", path: "/workspaces", body: b}, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// Get reads a workspace.
func (s *WorkspaceService) Get(ctx context.Context, id string) (*Workspace, error) {
	var w Workspace
	if err := s.c.do(ctx, &request{method: "GET", path: wsPath(id, "")}, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// Update changes a workspace's name, plan or settings.
func (s *WorkspaceService) Update(ctx context.Context, id string, u WorkspaceUpdate) (*Workspace, error) {
	var w Workspace
	if err := s.c.do(ctx, &request{method: "PATCH", path: wsPath(id, ""), body: u}, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// Storage reads what the workspace stores against its quota.
func (s *WorkspaceService) Storage(ctx context.Context, id string) (*WorkspaceStorage, error) {
	var out WorkspaceStorage
	if err := s.c.do(ctx, &request{method: "GET", path: wsPath(id, "/storage")}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Wallet reads the workspace's wallet.
func (s *WorkspaceService) Wallet(ctx context.Context, id string) (*Wallet, error) {
	var out Wallet
	if err := s.c.do(ctx, &request{method: "GET", path: wsPath(id, "/wallet")}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Credit adds funds to the workspace's wallet (the operator only) and answers the new
// ledger entry; amount is a decimal string ("12.5").
func (s *WorkspaceService) Credit(ctx context.Context, id, amount, reference string) (*LedgerEntry, error) {
	var out LedgerEntry
	if err := s.c.do(ctx, &request{method: "POST", path: wsPath(id, "/wallet/credits"), body: map[string]any{"amount": amount, "reference": reference}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Ledger answers the wallet's entries, newest first (every page, or the first limit).
func (s *WorkspaceService) Ledger(ctx context.Context, id string, limit int) ([]LedgerEntry, error) {
	return list[LedgerEntry](ctx, s.c, wsPath(id, "/ledger"), nil, limit)
}

// Usage answers the usage per UTC day in [from, to) (RFC 3339 times or dates; "" for the
// defaults: the last 30 days).
func (s *WorkspaceService) Usage(ctx context.Context, id, from, to string) (*UsageReport, error) {
	q := url.Values{}
	if from != "" {
		q.Set("from", from)
	}
	if to != "" {
		q.Set("to", to)
	}
	var out UsageReport
	if err := s.c.do(ctx, &request{method: "GET", path: wsPath(id, "/usage"), query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Members lists the workspace's members.
func (s *WorkspaceService) Members(ctx context.Context, id string) ([]Member, error) {
	return list[Member](ctx, s.c, wsPath(id, "/members"), nil, 0)
}

// AddMember adds a user (by email) with a role (owner, admin, member).
func (s *WorkspaceService) AddMember(ctx context.Context, id, email, role string) (*Member, error) {
	b := map[string]any{"email": email}
	if role != "" {
		b["role"] = role
	}
	var m Member
	if err := s.c.do(ctx, &request{method: "POST", path: wsPath(id, "/members"), body: b}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// UpdateMember changes a member's role.
func (s *WorkspaceService) UpdateMember(ctx context.Context, id, userID, role string) (*Member, error) {
	var m Member
	if err := s.c.do(ctx, &request{method: "PATCH", path: wsPath(id, "/members/"+seg(userID)), body: map[string]any{"role": role}}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// RemoveMember removes a member (or, with one's own user id, leaves).
func (s *WorkspaceService) RemoveMember(ctx context.Context, id, userID string) error {
	return s.c.do(ctx, &request{method: "DELETE", path: wsPath(id, "/members/"+seg(userID))}, nil)
}

// ---------------------------------------------------------------------------- API keys

// APIKey is an API key (Key, the secret, only in the answer of Create).
type APIKey struct {
	ID          string     `json:"id"`
	WorkspaceID string     `json:"workspace_id"`
	Name        string     `json:"name"`
	Scopes      []string   `json:"scopes"`
	Prefix      string     `json:"prefix"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	LastUsedAt  *time.Time `json:"last_used_at"`
	Key         string     `json:"key,omitempty"`
}

// APIKeyService makes, lists and revokes API keys (admin): client.APIKeys.
type APIKeyService struct{ c *Client }

// Create makes a key of a workspace with scopes; expiresAt may be nil.
func (s *APIKeyService) Create(ctx context.Context, workspaceID, name string, scopes []string, expiresAt *time.Time) (*APIKey, error) {
	b := map[string]any{"workspace_id": workspaceID, "name": name, "scopes": scopes}
	if expiresAt != nil {
		b["expires_at"] = expiresAt.UTC().Format(time.RFC3339)
	}
	var k APIKey
	if err := s.c.do(ctx, &request{method: "POST", path: "/api-keys", body: b}, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// List answers the keys that are not revoked.
func (s *APIKeyService) List(ctx context.Context) ([]APIKey, error) {
	return list[APIKey](ctx, s.c, "/api-keys", nil, 0)
}

// Revoke revokes a key and answers it.
func (s *APIKeyService) Revoke(ctx context.Context, id string) (*APIKey, error) {
	var k APIKey
	if err := s.c.do(ctx, &request{method: "DELETE", path: "/api-keys/" + seg(id)}, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ---------------------------------------------------------------------------- users

// User is a user account.
type User struct {
	ID        string    `json:"id"`
	Email     string    `json:"email"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Session is a signed-in session (its cookie is kept by the HTTP client's jar, if any).
type Session struct {
	User      User      `json:"user"`
	ExpiresAt time.Time `json:"expires_at"`
	CSRFToken string    `json:"csrf_token"`
}

// UserService signs users up, in and out: client.Users.
type UserService struct{ c *Client }

// Create signs a user up (an operator's call, or open sign-up).
func (s *UserService) Create(ctx context.Context, email, name, password string) (*User, error) {
	var u User
	if err := s.c.do(ctx, &request{method: "POST", path: "/users", body: map[string]any{"email": email, "name": name, "password": password}}, &u); err != nil {
		return nil, err
	}
	return &u, nil
}

// SignIn opens a session. The session cookie is kept by the client's HTTP client: give
// NewClient an http.Client with a cookie jar (and no API key) to act as the user; the
// session's CSRF token is then sent with every write.
func (s *UserService) SignIn(ctx context.Context, email, password string) (*Session, error) {
	var out Session
	if err := s.c.do(ctx, &request{method: "POST", path: "/sessions", body: map[string]any{"email": email, "password": password}}, &out); err != nil {
		return nil, err
	}
	s.c.mu.Lock()
	s.c.csrf = out.CSRFToken
	s.c.mu.Unlock()
	return &out, nil
}

// SignOut ends the current session.
func (s *UserService) SignOut(ctx context.Context) error {
	err := s.c.do(ctx, &request{method: "DELETE", path: "/sessions/current"}, nil)
	if err == nil {
		s.c.mu.Lock()
		s.c.csrf = ""
		s.c.mu.Unlock()
	}
	return err
}

// MeWorkspace is a workspace of the signed-in user, with their role in it.
type MeWorkspace struct {
	Workspace Workspace `json:"workspace"`
	Role      string    `json:"role"`
}

// Me is the signed-in user, their workspaces and the session's CSRF token.
type Me struct {
	User       User          `json:"user"`
	Workspaces []MeWorkspace `json:"workspaces"`
	CSRFToken  string        `json:"csrf_token"`
}

// Me answers the signed-in user (a session only: a key gets 403).
func (s *UserService) Me(ctx context.Context) (*Me, error) {
	var out Me
	if err := s.c.do(ctx, &request{method: "GET", path: "/me"}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
