package cella

import (
	"context"
	"encoding/json"
	"net/url"
	"time"
)

// PullRequest is the draft a task run opened on its forge.
type PullRequest struct {
	Number int    `json:"number"`
	URL    string `json:"url"`
	Draft  bool   `json:"draft"`
}

// Task is a task run.
type Task struct {
	ID              string            `json:"id"`
	WorkspaceID     string            `json:"workspace_id"`
	CreatedBy       string            `json:"created_by"`
	Repository      string            `json:"repository"`
	BaseBranch      string            `json:"base_branch"`
	Branch          string            `json:"branch"`
	Forge           string            `json:"forge"`
	Agent           string            `json:"agent"`
	State           string            `json:"state"` // queued, provisioning, running, stopped, failed, cancelled
	FailureReason   *string           `json:"failure_reason"`
	StopReason      *string           `json:"stop_reason"`
	PullRequest     *PullRequest      `json:"pull_request"`
	QueuedAt        *time.Time        `json:"queued_at"`
	StartedAt       *time.Time        `json:"started_at"`
	EndedAt         *time.Time        `json:"ended_at"`
	ComputeSec      int64             `json:"compute_sec"`
	ComputeRate     string            `json:"compute_rate"`
	ComputeCost     string            `json:"compute_cost"`
	ModelCost       string            `json:"model_cost"`
	ModelRequests   int64             `json:"model_requests"`
	SessionLimitMin int               `json:"session_limit_min"`
	Metadata        map[string]string `json:"metadata"`
}

// Finished is true in the terminal states (stopped, failed, cancelled).
func (t *Task) Finished() bool { return TaskStateFinished(t.State) }

// TaskStateFinished says whether a task state is terminal.
func TaskStateFinished(s string) bool { return s == "stopped" || s == "failed" || s == "cancelled" }

// StartTaskOptions are a task run's fields.
type StartTaskOptions struct {
	// Repository is owner/name (required).
	Repository string
	// Task is the message for the agent (required).
	Task string
	// BaseBranch defaults to the repository's default branch.
	BaseBranch string
	// Forge and Agent default to the first configured.
	Forge    string
	Agent    string
	Metadata map[string]string
}

// TaskEvent is an event of a run's events stream: a state change or a progress count.
type TaskEvent struct {
	// Event is "state" or "progress".
	Event         string     `json:"event"`
	State         string     `json:"state,omitempty"`
	At            *time.Time `json:"at,omitempty"`
	FailureReason *string    `json:"failure_reason,omitempty"`
	StopReason    *string    `json:"stop_reason,omitempty"`
	Steps         int        `json:"steps,omitempty"`
	Commits       int        `json:"commits,omitempty"`
	FilesChanged  int        `json:"files_changed,omitempty"`
}

// TaskOutput is a chunk of a run agent's live log.
type TaskOutput struct {
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// TaskListOptions filter a listing of task runs.
type TaskListOptions struct {
	State      string
	Repository string
	Limit      int
}

// TaskService starts and follows task runs: client.Tasks.
type TaskService struct{ c *Client }

// Start starts a run; it answers the task, queued.
func (s *TaskService) Start(ctx context.Context, opts StartTaskOptions) (*Task, error) {
	b := map[string]any{"repository": opts.Repository, "task": opts.Task}
	if opts.BaseBranch != "" {
		b["base_branch"] = opts.BaseBranch
	}
	if opts.Forge != "" {
		b["forge"] = opts.Forge
	}
	if opts.Agent != "" {
		b["agent"] = opts.Agent
	}
	if opts.Metadata != nil {
		b["metadata"] = opts.Metadata
	}
	var t Task
	if err := s.c.do(ctx, &request{method: "POST", path: "/tasks", body: b}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// List answers the workspace's runs, newest first.
func (s *TaskService) List(ctx context.Context, opts *TaskListOptions) ([]Task, error) {
	q := url.Values{}
	limit := 0
	if opts != nil {
		if opts.State != "" {
			q.Set("state", opts.State)
		}
		if opts.Repository != "" {
			q.Set("repository", opts.Repository)
		}
		limit = opts.Limit
	}
	return list[Task](ctx, s.c, "/tasks", q, limit)
}

// Get reads one run.
func (s *TaskService) Get(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := s.c.do(ctx, &request{method: "GET", path: "/tasks/" + seg(id)}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Cancel stops a run (idempotent) and answers it as it is then.
func (s *TaskService) Cancel(ctx context.Context, id string) (*Task, error) {
	var t Task
	if err := s.c.do(ctx, &request{method: "POST", path: "/tasks/" + seg(id) + "/cancel"}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Events follows a run's state changes and progress; the first event is its current state
// and the stream ends after a terminal state.
func (s *TaskService) Events(ctx context.Context, id string) (*Stream[TaskEvent], error) {
	resp, err := s.c.send(ctx, &request{method: "GET", path: "/tasks/" + seg(id) + "/events", headers: map[string]string{"Accept": "text/event-stream"}})
	if err != nil {
		return nil, err
	}
	rid := resp.Header.Get("x-request-id")
	return newStream(resp, func(ev sseEvent) (TaskEvent, bool, bool, error) {
		switch ev.name {
		case "state", "progress":
			var te TaskEvent
			if err := json.Unmarshal([]byte(ev.data), &te); err != nil {
				return te, false, true, &Error{Code: CodeDecode, Message: "bad task event: " + err.Error(), RequestID: rid}
			}
			if te.Event == "" {
				te.Event = ev.name
			}
			return te, true, ev.name == "state" && TaskStateFinished(te.State), nil
		case "error":
			return TaskEvent{}, false, true, errorFromEvent(ev.data, rid)
		}
		return TaskEvent{}, false, false, nil
	}), nil
}

// Log streams the run agent's output while the run is alive (410 GONE once it ended).
func (s *TaskService) Log(ctx context.Context, id string) (*Stream[TaskOutput], error) {
	resp, err := s.c.send(ctx, &request{method: "GET", path: "/tasks/" + seg(id) + "/log", headers: map[string]string{"Accept": "text/event-stream"}})
	if err != nil {
		return nil, err
	}
	rid := resp.Header.Get("x-request-id")
	return newStream(resp, func(ev sseEvent) (TaskOutput, bool, bool, error) {
		switch ev.name {
		case "output":
			var o TaskOutput
			if err := json.Unmarshal([]byte(ev.data), &o); err != nil {
				return o, false, true, &Error{Code: CodeDecode, Message: "bad log event: " + err.Error(), RequestID: rid}
			}
			return o, true, false, nil
		case "error":
			return TaskOutput{}, false, true, errorFromEvent(ev.data, rid)
		}
		return TaskOutput{}, false, false, nil
	}), nil
}

// Wait follows a run's events until it ends and answers the task as it ended. The
// context bounds the wait.
func (s *TaskService) Wait(ctx context.Context, id string) (*Task, error) {
	for {
		st, err := s.Events(ctx, id)
		if err != nil {
			return nil, err
		}
		for st.Next() {
		}
		st.Close()
		if err := st.Err(); err != nil && ctx.Err() != nil {
			return nil, &Error{Code: CodeTimeout, Message: "task " + id + " did not end in time", cause: ctx.Err()}
		}
		t, err := s.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if t.Finished() {
			return t, nil
		}
	}
}
