package cella

import (
	"context"
	"encoding/base64"
	"net/url"
	"strings"
	"time"
)

// CodeOutput is a rich output of a cell (an image, HTML, JSON, ...).
type CodeOutput struct {
	Mime string `json:"mime"`
	// Data is text, or base64 for binary types (image/png, application/octet-stream, ...).
	Data string `json:"data"`
}

// IsBinary is true for outputs whose Data is base64.
func (o CodeOutput) IsBinary() bool {
	if strings.HasPrefix(o.Mime, "text/") || o.Mime == "application/json" || o.Mime == "image/svg+xml" ||
		strings.HasSuffix(o.Mime, "+json") || o.Mime == "text/markdown" {
		return false
	}
	return true
}

// Bytes decodes the output: base64 for binary types, the text's bytes otherwise.
func (o CodeOutput) Bytes() ([]byte, error) {
	if !o.IsBinary() {
		return []byte(o.Data), nil
	}
	b, err := base64.StdEncoding.DecodeString(o.Data)
	if err != nil {
		return nil, &Error{Code: CodeDecode, Message: "output " + o.Mime + " is not base64: " + err.Error()}
	}
	return b, nil
}

// CodeError is why a cell failed.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Execution is a cell's result.
type Execution struct {
	OK       bool         `json:"ok"`
	Stdout   string       `json:"stdout"`
	Stderr   string       `json:"stderr"`
	Result   *string      `json:"result"`
	Language string       `json:"language"`
	Error    *CodeError   `json:"error"`
	Outputs  []CodeOutput `json:"outputs"`
	// Restarted: the kernel was killed and every context of the language lost.
	Restarted bool `json:"restarted"`
}

// Text is the cell's result as the REPL shows it ("" when none).
func (e *Execution) Text() string {
	if e.Result == nil {
		return ""
	}
	return *e.Result
}

// Output answers the first rich output of a MIME type (image/png, text/html, ...).
func (e *Execution) Output(mime string) (CodeOutput, bool) {
	for _, o := range e.Outputs {
		if o.Mime == mime {
			return o, true
		}
	}
	return CodeOutput{}, false
}

// PNGs answers the decoded image/png outputs (matplotlib figures, ...).
func (e *Execution) PNGs() ([][]byte, error) {
	var out [][]byte
	for _, o := range e.Outputs {
		if o.Mime == "image/png" {
			b, err := o.Bytes()
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
	}
	return out, nil
}

// RunCodeOptions are the optional fields of a cell.
type RunCodeOptions struct {
	// Language is "python" (default) or "javascript".
	Language string
	// Context names the namespace (default "default").
	Context string
	// Timeout interrupts the cell (the server caps it at 300 s); the context survives.
	Timeout time.Duration
}

// KernelInfo is one language's interpreter.
type KernelInfo struct {
	Language string   `json:"language"`
	Running  bool     `json:"running"`
	Busy     bool     `json:"busy"`
	Contexts []string `json:"contexts"`
}

// CodeContext is a namespace of an interpreter.
type CodeContext struct {
	Name     string `json:"name"`
	Language string `json:"language"`
	// Changed: it was made (or reset) by the call.
	Changed bool `json:"changed"`
}

// CodeInterpreter runs Python and JavaScript cells whose definitions persist between
// cells of a context: sandbox.Code.
type CodeInterpreter struct{ sb *Sandbox }

func (ci *CodeInterpreter) path(rest ...string) string {
	return ci.sb.path(append([]string{"code"}, rest...)...)
}

// Run runs a cell; the answer comes whether it succeeded (Execution.OK) or not.
func (ci *CodeInterpreter) Run(ctx context.Context, code string, opts *RunCodeOptions) (*Execution, error) {
	body := map[string]any{"code": code}
	if opts != nil {
		if opts.Language != "" {
			body["language"] = opts.Language
		}
		if opts.Context != "" {
			body["context"] = opts.Context
		}
		if opts.Timeout > 0 {
			body["timeout"] = opts.Timeout.Seconds()
		}
	}
	var e Execution
	if err := ci.sb.c.do(ctx, &request{method: "POST", path: ci.path("run"), body: body}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// RunCode runs a cell in the sandbox's code interpreter (see CodeInterpreter.Run).
func (sb *Sandbox) RunCode(ctx context.Context, code string, opts *RunCodeOptions) (*Execution, error) {
	return sb.Code.Run(ctx, code, opts)
}

// RunCell is POST .../code, the short form of Run.
func (ci *CodeInterpreter) RunCell(ctx context.Context, code string, opts *RunCodeOptions) (*Execution, error) {
	body := map[string]any{"code": code}
	if opts != nil {
		if opts.Language != "" {
			body["language"] = opts.Language
		}
		if opts.Context != "" {
			body["context"] = opts.Context
		}
		if opts.Timeout > 0 {
			body["timeout"] = opts.Timeout.Seconds()
		}
	}
	var e Execution
	if err := ci.sb.c.do(ctx, &request{method: "POST", path: ci.path(), body: body}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// State says which interpreters run, their contexts, busy or idle.
func (ci *CodeInterpreter) State(ctx context.Context) ([]KernelInfo, error) {
	var out struct {
		Kernels []KernelInfo `json:"kernels"`
	}
	if err := ci.sb.c.do(ctx, &request{method: "GET", path: ci.path()}, &out); err != nil {
		return nil, err
	}
	return out.Kernels, nil
}

func langQuery(language string) url.Values {
	q := url.Values{}
	if language != "" {
		q.Set("language", language)
	}
	return q
}

// Contexts lists a language's contexts ("" : python).
func (ci *CodeInterpreter) Contexts(ctx context.Context, language string) ([]CodeContext, error) {
	var out []CodeContext
	if err := ci.sb.c.do(ctx, &request{method: "GET", path: ci.path("contexts"), query: langQuery(language)}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// CreateContext makes a context (starting the kernel if need be).
func (ci *CodeInterpreter) CreateContext(ctx context.Context, name, language string) (*CodeContext, error) {
	body := map[string]any{}
	if name != "" {
		body["context"] = name
	}
	if language != "" {
		body["language"] = language
	}
	var c CodeContext
	if err := ci.sb.c.do(ctx, &request{method: "POST", path: ci.path("contexts"), body: body}, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// ResetContext forgets a context's definitions; Changed says whether it existed.
func (ci *CodeInterpreter) ResetContext(ctx context.Context, name, language string) (*CodeContext, error) {
	var c CodeContext
	if err := ci.sb.c.do(ctx, &request{method: "DELETE", path: ci.path("contexts", seg(name)), query: langQuery(language)}, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Reset ends a language's interpreter and every context of it.
func (ci *CodeInterpreter) Reset(ctx context.Context, language string) ([]KernelInfo, error) {
	var out struct {
		Kernels []KernelInfo `json:"kernels"`
	}
	if err := ci.sb.c.do(ctx, &request{method: "DELETE", path: ci.path(), query: langQuery(language)}, &out); err != nil {
		return nil, err
	}
	return out.Kernels, nil
}
