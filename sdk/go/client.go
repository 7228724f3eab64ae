// Package cella is the Go client of the Cella sandbox platform's HTTP API (/api/v1).
//
// A Client holds the server's address and an API key (by default from CELLA_SERVER and
// CELLA_API_KEY). Every call takes a context.Context; errors the server answers are *Error
// values carrying its code, HTTP status, message and request id (see errors.go).
//
//	client := cella.NewClient()
//	sb, err := client.Sandboxes.Create(ctx, &cella.CreateOptions{Size: "xs"})
//	if err != nil { ... }
//	defer sb.Kill(context.Background())
//	res, err := sb.Commands.Run(ctx, "echo hello", nil)
//
// The package uses only the standard library.
package cella

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Version is this SDK's version, sent in the User-Agent header.
const Version = "0.1.0"

const (
	// DefaultServer is the server used when neither Options.Server nor CELLA_SERVER is set.
	DefaultServer = "http://127.0.0.1:7070"
	// DefaultMaxRetries is how many times a request answered 429 is sent again.
	DefaultMaxRetries = 3
	// DefaultMaxRetryWait bounds the wait before a retried 429.
	DefaultMaxRetryWait = 60 * time.Second
)

// Options configure a Client. The zero value reads CELLA_SERVER and CELLA_API_KEY.
type Options struct {
	// Server is the base URL (http://host:port); a trailing /api/v1 is accepted too.
	Server string
	// APIKey is sent as a bearer token.
	APIKey string
	// HTTPClient makes the requests (default: a client without an overall timeout; use
	// contexts to bound calls).
	HTTPClient *http.Client
	// MaxRetries is how many times a request answered 429 is sent again after its
	// Retry-After (-1: never; 0: the default, 3).
	MaxRetries int
	// MaxRetryWait bounds each wait before a retry (default 60 s).
	MaxRetryWait time.Duration
	// Headers are added to every request.
	Headers map[string]string
}

// Client talks to one Cella server with one API key. It is safe for concurrent use.
type Client struct {
	server       string
	apiKey       string
	http         *http.Client
	maxRetries   int
	maxRetryWait time.Duration
	headers      map[string]string

	mu   sync.Mutex
	csrf string // a signed-in session's CSRF token (see UserService.SignIn)

	// Sandboxes creates, finds and runs sandboxes.
	Sandboxes *SandboxService
	// Snapshots lists, reads and deletes the workspace's snapshots.
	Snapshots *SnapshotService
	// Artifacts lists, downloads and deletes kept files.
	Artifacts *ArtifactService
	// Templates reads the catalog and builds custom templates.
	Templates *TemplateService
	// Images imports OCI images for templates.
	Images *ImageService
	// Tasks starts and follows task runs.
	Tasks *TaskService
	// Workspaces reads and changes workspaces, their wallets, ledgers and usage.
	Workspaces *WorkspaceService
	// APIKeys makes, lists and revokes API keys.
	APIKeys *APIKeyService
	// Users signs users up and in.
	Users *UserService
}

// NewClient makes a client; with no options (or empty fields) the server and key come from
// CELLA_SERVER and CELLA_API_KEY.
func NewClient(opts ...Options) *Client {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	server := o.Server
	if server == "" {
		server = os.Getenv("CELLA_SERVER")
	}
	if server == "" {
		server = DefaultServer
	}
	key := o.APIKey
	if key == "" {
		key = os.Getenv("CELLA_API_KEY")
	}
	c := &Client{
		server:       normalizeServer(server),
		apiKey:       key,
		http:         o.HTTPClient,
		maxRetries:   o.MaxRetries,
		maxRetryWait: o.MaxRetryWait,
		headers:      map[string]string{},
	}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.maxRetries == 0 {
		c.maxRetries = DefaultMaxRetries
	} else if c.maxRetries < 0 {
		c.maxRetries = 0
	}
	if c.maxRetryWait <= 0 {
		c.maxRetryWait = DefaultMaxRetryWait
	}
	for k, v := range o.Headers {
		c.headers[k] = v
	}
	c.Sandboxes = &SandboxService{c}
	c.Snapshots = &SnapshotService{c}
	c.Artifacts = &ArtifactService{c}
	c.Templates = &TemplateService{c}
	c.Images = &ImageService{c}
	c.Tasks = &TaskService{c}
	c.Workspaces = &WorkspaceService{c}
	c.APIKeys = &APIKeyService{c}
	c.Users = &UserService{c}
	return c
}

// Server is the base URL the client talks to.
func (c *Client) Server() string { return c.server }

// WithAPIKey is a copy of the client that sends another key.
func (c *Client) WithAPIKey(key string) *Client {
	return NewClient(Options{Server: c.server, APIKey: key, HTTPClient: c.http, MaxRetries: c.retriesOption(),
		MaxRetryWait: c.maxRetryWait, Headers: c.headers})
}

func (c *Client) retriesOption() int {
	if c.maxRetries == 0 {
		return -1
	}
	return c.maxRetries
}

func normalizeServer(s string) string {
	s = strings.TrimRight(strings.TrimSpace(s), "/")
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	return strings.TrimSuffix(s, "/api/v1")
}

// Health is the answer of /healthz.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}

// Health reads /healthz (no key needed).
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	resp, err := c.send(ctx, &request{method: "GET", path: "/healthz", raw: true})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return nil, &Error{Code: CodeDecode, Message: "could not read /healthz: " + err.Error()}
	}
	return &h, nil
}

// OpenAPI is the server's OpenAPI document, as JSON.
func (c *Client) OpenAPI(ctx context.Context) (json.RawMessage, error) {
	resp, err := c.send(ctx, &request{method: "GET", path: "/openapi.json"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, connError(err)
	}
	return json.RawMessage(b), nil
}

// ---------------------------------------------------------------------------- transport

type request struct {
	method string
	path   string // under /api/v1 unless raw
	raw    bool
	query  url.Values
	body   any // JSON-encoded unless it is an io.Reader or []byte
	// contentLength of a reader body (-1: unknown).
	contentLength int64
	headers       map[string]string
}

// Uploads above this size wait for the server's 100 Continue before sending their body.
const expectContinueAbove = 64 << 10

// seg escapes one path segment.
func seg(s string) string { return url.PathEscape(s) }

func (c *Client) url(r *request) string {
	u := c.server
	if !r.raw {
		u += "/api/v1"
	}
	u += r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	return u
}

// send makes the request, retrying 429s while the body can be sent again, and turns an
// error answer into *Error. The caller closes the answer's body.
func (c *Client) send(ctx context.Context, r *request) (*http.Response, error) {
	var payload []byte
	var reader io.Reader
	isJSON := false
	switch b := r.body.(type) {
	case nil:
	case []byte:
		payload = b
	case io.Reader:
		reader = b
	default:
		var err error
		payload, err = json.Marshal(b)
		if err != nil {
			return nil, &Error{Code: CodeInvalidArgument, Message: "could not encode the request body: " + err.Error()}
		}
		isJSON = true
	}
	for attempt := 0; ; attempt++ {
		var body io.Reader
		if reader != nil {
			body = reader
		} else if payload != nil {
			body = bytes.NewReader(payload)
		}
		req, err := http.NewRequestWithContext(ctx, r.method, c.url(r), body)
		if err != nil {
			return nil, &Error{Code: CodeInvalidArgument, Message: err.Error()}
		}
		if reader != nil && r.contentLength >= 0 {
			req.ContentLength = r.contentLength
			if r.contentLength == 0 {
				req.Body = http.NoBody
			}
		}
		req.Header.Set("User-Agent", "cella-go/"+Version)
		req.Header.Set("Accept", "application/json")
		if isJSON {
			req.Header.Set("Content-Type", "application/json")
		}
		if reader != nil && (r.contentLength < 0 || r.contentLength > expectContinueAbove) {
			// The server refuses an upload (401, 403, 404, 413, ...) before reading its
			// body and closes the connection: with 100-continue the body is sent only once
			// the server asks for it, so the refusal is read instead of a broken pipe.
			req.Header.Set("Expect", "100-continue")
		}
		if c.apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+c.apiKey)
		}
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		for k, v := range r.headers {
			req.Header.Set(k, v)
		}
		if r.method != "GET" && r.method != "HEAD" {
			c.mu.Lock()
			if c.csrf != "" {
				req.Header.Set("x-csrf-token", c.csrf)
			}
			c.mu.Unlock()
		}
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, &Error{Code: CodeTimeout, Message: "the call was cancelled or timed out: " + ctx.Err().Error(), cause: ctx.Err()}
			}
			return nil, connError(err)
		}
		if resp.StatusCode < 400 {
			return resp, nil
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		e := errorFromResponse(resp, data)
		if resp.StatusCode == http.StatusTooManyRequests && attempt < c.maxRetries && reader == nil {
			wait := e.RetryAfter
			if wait <= 0 {
				wait = time.Second
			}
			if wait > c.maxRetryWait {
				wait = c.maxRetryWait
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, e
			case <-t.C:
			}
			continue
		}
		return nil, e
	}
}

func connError(err error) *Error {
	return &Error{Code: CodeConnection, Message: "could not talk to the Cella server: " + err.Error(), cause: err}
}

// do sends the request and decodes the answer's "data" into out (when out is not nil).
func (c *Client) do(ctx context.Context, r *request, out any) error {
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return decodeError(resp, err)
	}
	if len(env.Data) == 0 || string(env.Data) == "null" {
		return nil
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return decodeError(resp, err)
	}
	return nil
}

// page is a list answer.
type page[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

// list follows a paginated list to its end, or until limit items (0: all).
func list[T any](ctx context.Context, c *Client, path string, q url.Values, limit int) ([]T, error) {
	var out []T
	cursor := ""
	for {
		qq := url.Values{}
		for k, v := range q {
			qq[k] = v
		}
		if limit > 0 {
			n := limit - len(out)
			if n > 1000 {
				n = 1000
			}
			qq.Set("limit", strconv.Itoa(n))
		} else {
			qq.Set("limit", "1000")
		}
		if cursor != "" {
			qq.Set("cursor", cursor)
		}
		resp, err := c.send(ctx, &request{method: "GET", path: path, query: qq})
		if err != nil {
			return nil, err
		}
		var p page[T]
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if err != nil {
			return nil, decodeError(resp, err)
		}
		out = append(out, p.Data...)
		if p.NextCursor == nil || *p.NextCursor == "" || (limit > 0 && len(out) >= limit) {
			if limit > 0 && len(out) > limit {
				out = out[:limit]
			}
			return out, nil
		}
		cursor = *p.NextCursor
	}
}

func decodeError(resp *http.Response, err error) *Error {
	return &Error{Code: CodeDecode, Status: resp.StatusCode, RequestID: resp.Header.Get("x-request-id"),
		Message: fmt.Sprintf("could not read the server's answer: %v", err), cause: err}
}

// wholeSeconds rounds a duration up to whole seconds (0 stays 0).
func wholeSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

var errStop = errors.New("stop")
