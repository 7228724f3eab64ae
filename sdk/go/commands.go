package cella

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// CommandOptions are the optional fields of a command.
type CommandOptions struct {
	// Argv runs a program and its arguments directly, instead of the shell line (pass ""
	// as the command then).
	Argv []string
	Env  map[string]string
	// Cwd is an absolute working directory.
	Cwd string
	// User is "user" (default) or "root".
	User string
	// Timeout kills the command's whole tree (rounded up to seconds; server default one
	// hour). Not for background processes.
	Timeout time.Duration
	// Stdin is text written to the command's standard input, which is then closed.
	Stdin *string
	// Stdout and Stderr, when set, get the output as it comes (the command is streamed);
	// the result still holds all of it.
	Stdout io.Writer
	Stderr io.Writer
	// Check returns a *CommandExitError for an exit code other than 0.
	Check bool
	// Tag labels a background process.
	Tag string
}

func commandBody(command string, o *CommandOptions, background bool) map[string]any {
	b := map[string]any{}
	if command != "" || o == nil || o.Argv == nil {
		b["command"] = command
	}
	if o == nil {
		return b
	}
	if o.Argv != nil {
		b["argv"] = o.Argv
	}
	if o.Env != nil {
		b["env"] = o.Env
	}
	if o.Cwd != "" {
		b["cwd"] = o.Cwd
	}
	if o.User != "" {
		b["user"] = o.User
	}
	if !background {
		if o.Timeout > 0 {
			b["timeout_sec"] = wholeSeconds(o.Timeout)
		}
		if o.Stdin != nil {
			b["stdin"] = *o.Stdin
		}
	}
	if background && o.Tag != "" {
		b["tag"] = o.Tag
	}
	return b
}

// CommandResult is what a command did.
type CommandResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	DurationMS      int64  `json:"duration_ms"`
	TimedOut        bool   `json:"timed_out"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
}

// OK is true for exit code 0.
func (r *CommandResult) OK() bool { return r.ExitCode == 0 && !r.TimedOut }

// OutputChunk is a piece of a command's output.
type OutputChunk struct {
	// Stream is "stdout" or "stderr".
	Stream string
	Data   []byte
}

// Text is the chunk as text.
func (c OutputChunk) Text() string { return string(c.Data) }

// Commands runs commands in a sandbox: sandbox.Commands.
type Commands struct{ sb *Sandbox }

// Run runs a command (a shell line run by bash -c, or opts.Argv) to its end. The result
// comes whatever the exit code (unless opts.Check). With opts.Stdout or opts.Stderr the
// output is streamed to them as it comes.
func (cm *Commands) Run(ctx context.Context, command string, opts *CommandOptions) (*CommandResult, error) {
	var res *CommandResult
	if opts != nil && (opts.Stdout != nil || opts.Stderr != nil) {
		st, err := cm.Stream(ctx, command, opts)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		for st.Next() {
			ch := st.Current()
			w := opts.Stdout
			if ch.Stream == "stderr" {
				w = opts.Stderr
			}
			if w != nil {
				if _, err := w.Write(ch.Data); err != nil {
					return nil, &Error{Code: CodeInvalidArgument, Message: "writing the output: " + err.Error(), cause: err}
				}
			}
		}
		if res, err = st.Result(); err != nil {
			return nil, err
		}
	} else {
		res = &CommandResult{}
		if err := cm.sb.c.do(ctx, &request{method: "POST", path: cm.sb.path("exec"), body: commandBody(command, opts, false)}, res); err != nil {
			return nil, err
		}
	}
	if opts != nil && opts.Check && !res.OK() {
		return res, &CommandExitError{Result: res}
	}
	return res, nil
}

// Stream runs a command and answers its output as it comes (POST .../exec/stream):
//
//	st, err := sb.Commands.Stream(ctx, "make test", nil)
//	for st.Next() { os.Stdout.Write(st.Current().Data) }
//	res, err := st.Result()
//
// Closing the stream early kills the command.
func (cm *Commands) Stream(ctx context.Context, command string, opts *CommandOptions) (*CommandStream, error) {
	resp, err := cm.sb.c.send(ctx, &request{method: "POST", path: cm.sb.path("exec", "stream"), body: commandBody(command, opts, false),
		headers: map[string]string{"Accept": "text/event-stream"}})
	if err != nil {
		return nil, err
	}
	return newCommandStream(resp), nil
}

// CommandStream is the output of a streamed command or a background process: iterate
// with Next and Current, then read Result.
type CommandStream struct {
	*Stream[OutputChunk]
	stdout, stderr bytes.Buffer
	exit           *CommandResult
}

func newCommandStream(resp *http.Response) *CommandStream {
	cs := &CommandStream{}
	rid := resp.Header.Get("x-request-id")
	cs.Stream = newStream(resp, func(ev sseEvent) (OutputChunk, bool, bool, error) {
		switch ev.name {
		case "stdout", "stderr":
			data := outputBytes(ev.data)
			if ev.name == "stdout" {
				cs.stdout.Write(data)
			} else {
				cs.stderr.Write(data)
			}
			return OutputChunk{Stream: ev.name, Data: data}, true, false, nil
		case "exit":
			var r CommandResult
			if err := json.Unmarshal([]byte(ev.data), &r); err != nil {
				return OutputChunk{}, false, true, &Error{Code: CodeDecode, Message: "bad exit event: " + err.Error(), RequestID: rid}
			}
			cs.exit = &r
			return OutputChunk{}, false, true, nil
		case "error":
			return OutputChunk{}, false, true, errorFromEvent(ev.data, rid)
		}
		return OutputChunk{}, false, false, nil
	})
	return cs
}

// Result reads what is left of the stream and answers the command's result (all of its
// output, and its exit code).
func (cs *CommandStream) Result() (*CommandResult, error) {
	for cs.Next() {
	}
	if err := cs.Err(); err != nil {
		return nil, err
	}
	if cs.exit == nil {
		return nil, &Error{Code: CodeStreamEnded, Message: "the output stream ended before the command's exit", RequestID: cs.RequestID()}
	}
	r := *cs.exit
	r.Stdout, r.Stderr = cs.stdout.String(), cs.stderr.String()
	return &r, nil
}

// ProcessInfo is a background process.
type ProcessInfo struct {
	PID                int        `json:"pid"`
	Argv               []string   `json:"argv"`
	Tag                *string    `json:"tag"`
	User               string     `json:"user"`
	Cwd                string     `json:"cwd"`
	State              string     `json:"state"`
	ExitCode           *int       `json:"exit_code"`
	StartedAt          time.Time  `json:"started_at"`
	EndedAt            *time.Time `json:"ended_at"`
	OutputDroppedBytes int64      `json:"output_dropped_bytes"`
}

// Start starts a background process (no timeout of its own) and answers its handle.
func (cm *Commands) Start(ctx context.Context, command string, opts *CommandOptions) (*Process, error) {
	var info ProcessInfo
	if err := cm.sb.c.do(ctx, &request{method: "POST", path: cm.sb.path("processes"), body: commandBody(command, opts, true)}, &info); err != nil {
		return nil, err
	}
	return &Process{sb: cm.sb, Info: info, PID: info.PID}, nil
}

// List answers the background processes started through the API.
func (cm *Commands) List(ctx context.Context) ([]ProcessInfo, error) {
	var out []ProcessInfo
	if err := cm.sb.c.do(ctx, &request{method: "GET", path: cm.sb.path("processes")}, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Get reads one background process.
func (cm *Commands) Get(ctx context.Context, pid int) (*ProcessInfo, error) {
	var info ProcessInfo
	if err := cm.sb.c.do(ctx, &request{method: "GET", path: cm.sb.path("processes", itoa(pid))}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Connect is a handle on a background process started earlier.
func (cm *Commands) Connect(ctx context.Context, pid int) (*Process, error) {
	info, err := cm.Get(ctx, pid)
	if err != nil {
		return nil, err
	}
	return &Process{sb: cm.sb, Info: *info, PID: pid}, nil
}

// Signal sends a signal ("TERM", "KILL", "15", ...) to a background process.
func (cm *Commands) Signal(ctx context.Context, pid int, signal string) (*ProcessInfo, error) {
	var sig any = signal
	if n, err := strconv.Atoi(signal); err == nil {
		sig = n
	}
	var info ProcessInfo
	if err := cm.sb.c.do(ctx, &request{method: "POST", path: cm.sb.path("processes", itoa(pid), "signal"), body: map[string]any{"signal": sig}}, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Kill SIGKILLs a background process; false if it had exited already.
func (cm *Commands) Kill(ctx context.Context, pid int) (bool, error) {
	_, err := cm.Signal(ctx, pid, "KILL")
	if IsConflict(err) {
		return false, nil
	}
	return err == nil, err
}

// SendStdin writes data to a background process's standard input; close closes it after.
func (cm *Commands) SendStdin(ctx context.Context, pid int, data []byte, close bool) (*ProcessInfo, error) {
	q := url.Values{}
	if close {
		q.Set("close", "true")
	}
	if data == nil {
		data = []byte{}
	}
	var info ProcessInfo
	err := cm.sb.c.do(ctx, &request{method: "POST", path: cm.sb.path("processes", itoa(pid), "stdin"), query: q, body: data,
		headers: map[string]string{"Content-Type": "application/octet-stream"}}, &info)
	if err != nil {
		return nil, err
	}
	return &info, nil
}

// Output follows a background process's output until it exits; fromStart replays what its
// buffer holds first.
func (cm *Commands) Output(ctx context.Context, pid int, fromStart bool) (*CommandStream, error) {
	q := url.Values{"from": {"now"}}
	if fromStart {
		q.Set("from", "start")
	}
	resp, err := cm.sb.c.send(ctx, &request{method: "GET", path: cm.sb.path("processes", itoa(pid), "output"), query: q,
		headers: map[string]string{"Accept": "text/event-stream"}})
	if err != nil {
		return nil, err
	}
	return newCommandStream(resp), nil
}

// Process is a background process.
type Process struct {
	sb   *Sandbox
	PID  int
	Info ProcessInfo
}

// Refresh reads the process again.
func (p *Process) Refresh(ctx context.Context) (*ProcessInfo, error) {
	info, err := p.sb.Commands.Get(ctx, p.PID)
	if err == nil {
		p.Info = *info
	}
	return info, err
}

// Signal sends a signal to the process.
func (p *Process) Signal(ctx context.Context, signal string) (*ProcessInfo, error) {
	return p.sb.Commands.Signal(ctx, p.PID, signal)
}

// Kill SIGKILLs the process; false if it had exited already.
func (p *Process) Kill(ctx context.Context) (bool, error) { return p.sb.Commands.Kill(ctx, p.PID) }

// SendStdin writes to the process's standard input.
func (p *Process) SendStdin(ctx context.Context, data []byte, close bool) (*ProcessInfo, error) {
	return p.sb.Commands.SendStdin(ctx, p.PID, data, close)
}

// CloseStdin closes the process's standard input.
func (p *Process) CloseStdin(ctx context.Context) (*ProcessInfo, error) {
	return p.sb.Commands.SendStdin(ctx, p.PID, nil, true)
}

// Output follows the process's output (from the start of its buffer when fromStart).
func (p *Process) Output(ctx context.Context, fromStart bool) (*CommandStream, error) {
	return p.sb.Commands.Output(ctx, p.PID, fromStart)
}

// Wait waits for the process to exit and answers its result (output from the start of its
// buffer). The context bounds the wait.
func (p *Process) Wait(ctx context.Context) (*CommandResult, error) {
	st, err := p.Output(ctx, true)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	res, err := st.Result()
	if err != nil && ctx.Err() != nil {
		return nil, &Error{Code: CodeTimeout, Message: "process " + itoa(p.PID) + " did not exit in time", cause: ctx.Err()}
	}
	return res, err
}
