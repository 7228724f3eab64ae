package cella_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	cella "github.com/cella-dev/cella-go"
	"github.com/cella-dev/cella-go/internal/testserver"
)

// One error per family, as a user would catch it: errors.As to *cella.Error, the Is*
// helpers and errors.Is with the Err* values.

func TestUnauthorized401(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	c := cella.NewClient(cella.Options{APIKey: "cella_not-a-key"})
	_, err := c.Sandboxes.List(ctx, nil)
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 401 || e.Code != cella.CodeUnauthorized || e.RequestID == "" {
		t.Fatalf("a bad key: %#v", err)
	}
	if !cella.IsUnauthorized(err) || !errors.Is(err, cella.ErrUnauthorized) || errors.Is(err, cella.ErrForbidden) {
		t.Fatalf("the helpers on a 401: %v", err)
	}
}

func TestForbidden403(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	admin := cella.NewClient()
	ws := defaultWorkspace(t, admin)
	key, err := admin.APIKeys.Create(ctx, ws, "go-read-only", []string{"sandboxes:read"}, nil)
	if err != nil || key.Key == "" {
		t.Fatalf("make a key: %+v %v", key, err)
	}
	defer admin.APIKeys.Revoke(ctx, key.ID)
	reader := admin.WithAPIKey(key.Key)
	if _, err := reader.Sandboxes.List(ctx, nil); err != nil {
		t.Fatalf("the key may read: %v", err)
	}
	_, err = reader.Sandboxes.Create(ctx, &cella.CreateOptions{Size: size})
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 403 || e.Code != cella.CodeForbidden || e.Details["required_scope"] != "sandboxes:write" {
		t.Fatalf("a create without sandboxes:write: %#v", err)
	}
	if !cella.IsForbidden(err) || !errors.Is(err, cella.ErrForbidden) {
		t.Fatalf("the helpers on a 403: %v", err)
	}
	// Revoked, the key gets 401.
	if _, err := admin.APIKeys.Revoke(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Sandboxes.List(ctx, nil); !cella.IsUnauthorized(err) {
		t.Fatalf("a revoked key: %v", err)
	}
}

func TestNotFound404(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	c := cella.NewClient()
	_, err := c.Sandboxes.Get(ctx, "sb000000000000000000")
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 404 || e.Code != cella.CodeNotFound {
		t.Fatalf("an unknown sandbox: %#v", err)
	}
	if !cella.IsNotFound(err) || !errors.Is(err, cella.ErrNotFound) {
		t.Fatalf("the helpers on a 404: %v", err)
	}
	for name, call := range map[string]func() error{
		"snapshot": func() error { _, err := c.Snapshots.Get(ctx, "snap000000000000000000"); return err },
		"artifact": func() error { _, err := c.Artifacts.Read(ctx, "art000000000000000000"); return err },
		"template": func() error { _, err := c.Templates.Get(ctx, "no-such-template"); return err },
		"task":     func() error { _, err := c.Tasks.Get(ctx, "task000000000000000000"); return err },
	} {
		if err := call(); !cella.IsNotFound(err) {
			t.Errorf("an unknown %s: %v", name, err)
		}
	}
}

func TestConflict409(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, nil)
	_, err := sb.Resume(ctx)
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 409 || e.Code != cella.CodeConflict || e.Details["state"] != "running" {
		t.Fatalf("resuming a running sandbox: %#v", err)
	}
	if !cella.IsConflict(err) || !errors.Is(err, cella.ErrConflict) || cella.IsSandboxNotRunning(err) {
		t.Fatalf("the helpers on a 409: %v", err)
	}
}

func TestPayloadTooLarge413(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	sb := newSandbox(t, nil)
	big := make([]byte, uploadLimit+1)
	_, err := sb.Files.Write(ctx, "/home/user/too-big.bin", bytes.NewReader(big), nil)
	var e *cella.Error
	if !errors.As(err, &e) || e.Status != 413 || e.Code != cella.CodePayloadTooLarge {
		t.Fatalf("an upload over the limit: %#v", err)
	}
	if limit, _ := e.Details["limit"].(float64); int(limit) != uploadLimit {
		t.Fatalf("details.limit: %v", e.Details)
	}
	if !cella.IsPayloadTooLarge(err) || !errors.Is(err, cella.ErrPayloadTooLarge) {
		t.Fatalf("the helpers on a 413: %v", err)
	}
	if ok, err := sb.Files.Exists(ctx, "/home/user/too-big.bin"); err != nil || ok {
		t.Fatalf("nothing is left of the refused upload: %v %v", ok, err)
	}
	// A JSON body over 4 MiB too.
	_, err = sb.Commands.Run(ctx, string(bytes.Repeat([]byte("x"), 5<<20)), nil)
	if !cella.IsPayloadTooLarge(err) {
		t.Fatalf("a body over 4 MiB: %v", err)
	}
}

func TestRateLimited429(t *testing.T) {
	limited, err := testserver.Start("\n[rate_limits]\nread = { per_second = 0.5, burst = 2 }\n", "cella-limited")
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Stop()
	ctx := ctxFor(t, time.Minute)
	noRetry := cella.NewClient(cella.Options{Server: limited.URL, APIKey: limited.Key, MaxRetries: -1})
	var last error
	for i := 0; i < 20 && last == nil; i++ {
		_, last = noRetry.Sandboxes.List(ctx, &cella.ListOptions{Limit: 1})
	}
	var e *cella.Error
	if !errors.As(last, &e) || e.Status != 429 || e.Code != cella.CodeRateLimited {
		t.Fatalf("the read limit: %#v", last)
	}
	if e.RetryAfter < time.Second || e.Details["group"] != "read" || e.RequestID == "" {
		t.Fatalf("a 429's retry-after and details: %v %v", e.RetryAfter, e.Details)
	}
	if !cella.IsRateLimited(last) || !errors.Is(last, cella.ErrTooManyRequests) {
		t.Fatalf("the helpers on a 429: %v", last)
	}
	// With retries (the default), the call waits for the bucket and succeeds.
	retrying := cella.NewClient(cella.Options{Server: limited.URL, APIKey: limited.Key})
	if _, err := retrying.Sandboxes.List(ctx, &cella.ListOptions{Limit: 1}); err != nil {
		t.Fatalf("a retried call: %v", err)
	}
}

func TestConnectionError(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	c := cella.NewClient(cella.Options{Server: "http://127.0.0.1:1", APIKey: "x"})
	_, err := c.Sandboxes.List(ctx, nil)
	var e *cella.Error
	if !errors.As(err, &e) || e.Code != cella.CodeConnection || e.Status != 0 || !errors.Is(err, cella.ErrConnection) {
		t.Fatalf("no server: %#v", err)
	}
}
