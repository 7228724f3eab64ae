package cella

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The server's error codes (Error.Code), and this SDK's own for failures that never got an
// answer (CodeConnection, CodeTimeout, CodeDecode, CodeStreamEnded, CodeInvalidArgument).
const (
	CodeInvalidRequest      = "INVALID_REQUEST"
	CodeUnknownLanguage     = "UNKNOWN_LANGUAGE"
	CodeSizeUnavailable     = "SIZE_UNAVAILABLE"
	CodeUnauthorized        = "UNAUTHORIZED"
	CodeInsufficientFunds   = "INSUFFICIENT_FUNDS"
	CodeForbidden           = "FORBIDDEN"
	CodeNotFound            = "NOT_FOUND"
	CodeMethodNotAllowed    = "METHOD_NOT_ALLOWED"
	CodeRequestTimeout      = "REQUEST_TIMEOUT"
	CodeConflict            = "CONFLICT"
	CodeSandboxNotRunning   = "SANDBOX_NOT_RUNNING"
	CodeGone                = "GONE"
	CodePayloadTooLarge     = "PAYLOAD_TOO_LARGE"
	CodeRangeNotSatisfiable = "RANGE_NOT_SATISFIABLE"
	CodeRateLimited         = "RATE_LIMITED"
	CodeConcurrencyLimit    = "CONCURRENCY_LIMIT"
	CodeInternal            = "INTERNAL"
	CodeUnavailable         = "UNAVAILABLE"
	CodeInsufficientStorage = "INSUFFICIENT_STORAGE"

	CodeConnection      = "CONNECTION_ERROR"
	CodeTimeout         = "TIMEOUT"
	CodeDecode          = "DECODE_ERROR"
	CodeStreamEnded     = "STREAM_ENDED"
	CodeInvalidArgument = "INVALID_ARGUMENT"
	CodeCommandExit     = "COMMAND_EXIT"
	CodeBuildFailed     = "BUILD_FAILED"
)

// Error is every error this SDK returns for a call the server refused (and for calls that
// never got an answer). Use errors.As to get at it, or the Is* helpers:
//
//	var e *cella.Error
//	if errors.As(err, &e) && e.Code == cella.CodeSandboxNotRunning { ... }
//	if cella.IsNotFound(err) { ... }
//
// errors.Is(err, cella.ErrNotFound) (and the other Err* values) compares the HTTP status.
type Error struct {
	// Code is the server's error code (NOT_FOUND, SANDBOX_NOT_RUNNING, ...), or one of the
	// SDK's own (CONNECTION_ERROR, TIMEOUT, ...).
	Code string
	// Status is the HTTP status (0 when there was no answer, 200 for an error event of a
	// stream).
	Status int
	// Message is the server's message.
	Message string
	// Details is the envelope's details object, as decoded JSON (nil when none).
	Details map[string]any
	// RequestID is the answer's x-request-id, which the server's log is keyed on.
	RequestID string
	// RetryAfter is the answer's Retry-After (429s).
	RetryAfter time.Duration

	cause error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Code != "" {
		b.WriteString(e.Code)
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	var extra []string
	if e.Status != 0 {
		extra = append(extra, "HTTP "+strconv.Itoa(e.Status))
	}
	if e.RequestID != "" {
		extra = append(extra, "request "+e.RequestID)
	}
	if len(extra) > 0 {
		b.WriteString(" (" + strings.Join(extra, ", ") + ")")
	}
	return b.String()
}

// Unwrap answers the transport error behind a CONNECTION_ERROR or TIMEOUT.
func (e *Error) Unwrap() error { return e.cause }

// Is matches the Err* values by status (and by code for the SDK's own errors).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Status != 0 && t.Status != e.Status {
		return false
	}
	if t.Code != "" && t.Code != e.Code {
		return false
	}
	return t.Status != 0 || t.Code != ""
}

// Field is details.field, when the server named the field at fault.
func (e *Error) Field() string {
	if f, ok := e.Details["field"].(string); ok {
		return f
	}
	return ""
}

// Values to compare with errors.Is: each matches every error of its HTTP status.
var (
	ErrInvalidRequest    = &Error{Status: http.StatusBadRequest}
	ErrUnauthorized      = &Error{Status: http.StatusUnauthorized}
	ErrPaymentRequired   = &Error{Status: http.StatusPaymentRequired}
	ErrForbidden         = &Error{Status: http.StatusForbidden}
	ErrNotFound          = &Error{Status: http.StatusNotFound}
	ErrConflict          = &Error{Status: http.StatusConflict}
	ErrGone              = &Error{Status: http.StatusGone}
	ErrPayloadTooLarge   = &Error{Status: http.StatusRequestEntityTooLarge}
	ErrTooManyRequests   = &Error{Status: http.StatusTooManyRequests}
	ErrInternal          = &Error{Status: http.StatusInternalServerError}
	ErrUnavailable       = &Error{Status: http.StatusServiceUnavailable}
	ErrConnection        = &Error{Code: CodeConnection}
	ErrTimeout           = &Error{Code: CodeTimeout}
	ErrSandboxNotRunning = &Error{Status: http.StatusConflict, Code: CodeSandboxNotRunning}
)

func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

func hasStatus(err error, status int) bool {
	e := asError(err)
	return e != nil && e.Status == status
}

// IsInvalidRequest: a 400 (INVALID_REQUEST, UNKNOWN_LANGUAGE, SIZE_UNAVAILABLE).
func IsInvalidRequest(err error) bool { return hasStatus(err, 400) }

// IsUnauthorized: a 401 (no key, or an unknown, revoked or expired one).
func IsUnauthorized(err error) bool { return hasStatus(err, 401) }

// IsInsufficientFunds: a 402 (the wallet does not cover the request).
func IsInsufficientFunds(err error) bool { return hasStatus(err, 402) }

// IsForbidden: a 403 (the key lacks the route's scope; details.required_scope).
func IsForbidden(err error) bool { return hasStatus(err, 403) }

// IsNotFound: a 404 (the object does not exist or is another workspace's).
func IsNotFound(err error) bool { return hasStatus(err, 404) }

// IsConflict: a 409 (CONFLICT or SANDBOX_NOT_RUNNING).
func IsConflict(err error) bool { return hasStatus(err, 409) }

// IsSandboxNotRunning: a 409 SANDBOX_NOT_RUNNING.
func IsSandboxNotRunning(err error) bool {
	e := asError(err)
	return e != nil && e.Code == CodeSandboxNotRunning
}

// IsPayloadTooLarge: a 413 (details.limit is the server's limit).
func IsPayloadTooLarge(err error) bool { return hasStatus(err, 413) }

// IsRateLimited: a 429 (RATE_LIMITED or CONCURRENCY_LIMIT), returned once the retries are
// used up; RetryAfter is the server's Retry-After.
func IsRateLimited(err error) bool { return hasStatus(err, 429) }

// IsUnavailable: a 503 (a sandbox failed to start, or its agent did not answer).
func IsUnavailable(err error) bool { return hasStatus(err, 503) }

// IsTimeout: the call's context ended before an answer.
func IsTimeout(err error) bool {
	e := asError(err)
	return e != nil && e.Code == CodeTimeout
}

func errorFromResponse(resp *http.Response, body []byte) *Error {
	e := errorFromBody(resp.StatusCode, body)
	e.RequestID = resp.Header.Get("x-request-id")
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		if s, err := strconv.ParseFloat(strings.TrimSpace(ra), 64); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s * float64(time.Second))
		}
	}
	return e
}

func errorFromBody(status int, body []byte) *Error {
	var env struct {
		Error *struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &env) == nil && env.Error != nil {
		msg := env.Error.Message
		if msg == "" {
			msg = env.Error.Code
		}
		return &Error{Code: env.Error.Code, Status: status, Message: msg, Details: env.Error.Details}
	}
	text := strings.TrimSpace(string(body))
	if len(text) > 500 {
		text = text[:500]
	}
	if text == "" {
		text = fmt.Sprintf("HTTP %d", status)
	}
	return &Error{Code: fmt.Sprintf("HTTP_%d", status), Status: status, Message: text}
}

// errorFromEvent is the error of an "error" event of a stream (the envelope as its data).
func errorFromEvent(data string, requestID string) *Error {
	e := errorFromBody(200, []byte(data))
	e.RequestID = requestID
	return e
}

// CommandExitError is returned by calls with Check set when a command exits with a code
// other than 0; Result is the command's result.
type CommandExitError struct {
	Result *CommandResult
}

func (e *CommandExitError) Error() string {
	msg := fmt.Sprintf("command exited with code %d", e.Result.ExitCode)
	if e.Result.TimedOut {
		msg += " (timed out)"
	}
	tail := strings.TrimSpace(e.Result.Stderr)
	if tail == "" {
		tail = strings.TrimSpace(e.Result.Stdout)
	}
	if tail != "" {
		lines := strings.Split(tail, "\n")
		if len(lines) > 3 {
			lines = lines[len(lines)-3:]
		}
		msg += ": " + strings.Join(lines, " | ")
	}
	return msg
}
