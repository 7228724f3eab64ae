package cella

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// EntryInfo is a file, directory or link in a sandbox.
type EntryInfo struct {
	Name          string     `json:"name"`
	Path          string     `json:"path"`
	Type          string     `json:"type"` // file, dir, symlink, other
	Size          int64      `json:"size"`
	Mode          string     `json:"mode"`
	UID           int        `json:"uid"`
	GID           int        `json:"gid"`
	ModifiedAt    *time.Time `json:"modified_at"`
	SymlinkTarget *string    `json:"symlink_target"`
}

// IsDir is true for a directory.
func (e *EntryInfo) IsDir() bool { return e.Type == "dir" || e.Type == "directory" }

// EntryList is a directory listing; Truncated when there were more than the limit.
type EntryList struct {
	Entries   []EntryInfo
	Truncated bool
}

// FilesystemEvent is a change seen by a watch.
type FilesystemEvent struct {
	// Type is create, modify, delete or rename.
	Type string `json:"-"`
	Path string `json:"path"`
	Dir  bool   `json:"dir"`
	// From is where a renamed entry was.
	From string `json:"from,omitempty"`
}

// WriteOptions are the optional fields of an upload.
type WriteOptions struct {
	// User owns the file and the directories made for it: "user" (default) or "root".
	User string
	// Mode is the permission bits (default 0644).
	Mode os.FileMode
}

// Files is the sandbox's filesystem: sandbox.Files. Paths are absolute paths inside it.
type Files struct{ sb *Sandbox }

func (f *Files) path(rest ...string) string { return f.sb.path(append([]string{"files"}, rest...)...) }

// Read opens a file for reading; the bytes stream as they come. Close the reader.
func (f *Files) Read(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := f.sb.c.send(ctx, &request{method: "GET", path: f.path(), query: url.Values{"path": {path}},
		headers: map[string]string{"Accept": "application/octet-stream"}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadBytes reads a whole file.
func (f *Files) ReadBytes(ctx context.Context, path string) ([]byte, error) {
	r, err := f.Read(ctx, path)
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

// ReadRange reads part of a file: rng is one range of bytes as HTTP writes it, "10-19" (bytes
// 10 to 19, an end past the file cut to it), "10-" (from byte 10 on) or "-100" (the last 100
// bytes); a "bytes=" prefix may be given. A range outside the file is an *Error with
// Code CodeRangeNotSatisfiable (416) and details.size.
func (f *Files) ReadRange(ctx context.Context, path, rng string) ([]byte, error) {
	if !strings.HasPrefix(rng, "bytes=") {
		rng = "bytes=" + rng
	}
	resp, err := f.sb.c.send(ctx, &request{method: "GET", path: f.path(), query: url.Values{"path": {path}},
		headers: map[string]string{"Accept": "application/octet-stream", "Range": rng}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, connError(err)
	}
	return b, nil
}

// ReadText reads a whole file as text.
func (f *Files) ReadText(ctx context.Context, path string) (string, error) {
	b, err := f.ReadBytes(ctx, path)
	return string(b), err
}

func writeQuery(path string, o *WriteOptions) url.Values {
	q := url.Values{"path": {path}}
	if o != nil {
		if o.User != "" {
			q.Set("user", o.User)
		}
		if o.Mode != 0 {
			q.Set("mode", "0"+strconv.FormatUint(uint64(o.Mode.Perm()|o.Mode&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)), 8))
		}
	}
	return q
}

// Write uploads r to path (whole or nothing; missing parents are made). The body streams:
// its length is sent when r is a *bytes.Reader, *bytes.Buffer, *strings.Reader or a regular
// *os.File, else it goes chunked.
func (f *Files) Write(ctx context.Context, path string, r io.Reader, opts *WriteOptions) (*EntryInfo, error) {
	length := int64(-1)
	switch v := r.(type) {
	case *bytes.Reader:
		length = int64(v.Len())
	case *bytes.Buffer:
		length = int64(v.Len())
	case *strings.Reader:
		length = int64(v.Len())
	case *os.File:
		if st, err := v.Stat(); err == nil && st.Mode().IsRegular() {
			if off, err := v.Seek(0, io.SeekCurrent); err == nil {
				length = st.Size() - off
			}
		}
	}
	var e EntryInfo
	err := f.sb.c.do(ctx, &request{method: "PUT", path: f.path(), query: writeQuery(path, opts), body: r, contentLength: length,
		headers: map[string]string{"Content-Type": "application/octet-stream"}}, &e)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// WriteBytes writes data to path.
func (f *Files) WriteBytes(ctx context.Context, path string, data []byte, opts *WriteOptions) (*EntryInfo, error) {
	var e EntryInfo
	if data == nil {
		data = []byte{}
	}
	err := f.sb.c.do(ctx, &request{method: "PUT", path: f.path(), query: writeQuery(path, opts), body: data,
		headers: map[string]string{"Content-Type": "application/octet-stream"}}, &e)
	if err != nil {
		return nil, err
	}
	return &e, nil
}

// WriteText writes text to path.
func (f *Files) WriteText(ctx context.Context, path, text string, opts *WriteOptions) (*EntryInfo, error) {
	return f.WriteBytes(ctx, path, []byte(text), opts)
}

// FileWriter is an upload in progress: write to it, then Close, which waits for the
// server's answer (Entry). Nothing appears at the path unless Close succeeds.
type FileWriter struct {
	pw    *io.PipeWriter
	done  chan struct{}
	entry *EntryInfo
	err   error
}

// Write sends bytes of the file.
func (w *FileWriter) Write(p []byte) (int, error) { return w.pw.Write(p) }

// Close ends the file and waits for the upload's answer.
func (w *FileWriter) Close() error {
	w.pw.Close()
	<-w.done
	return w.err
}

// Abort drops the upload: nothing is written.
func (w *FileWriter) Abort() {
	w.pw.CloseWithError(&Error{Code: CodeInvalidArgument, Message: "upload aborted"})
	<-w.done
}

// Entry is the new file's entry, after a successful Close.
func (w *FileWriter) Entry() *EntryInfo { return w.entry }

// Writer opens an upload to path as an io.WriteCloser (the body goes chunked).
func (f *Files) Writer(ctx context.Context, path string, opts *WriteOptions) *FileWriter {
	pr, pw := io.Pipe()
	w := &FileWriter{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.entry, w.err = f.Write(ctx, path, pr, opts)
		pr.CloseWithError(errStop)
	}()
	return w
}

// List answers a directory's entries (the whole tree with recursive), sorted by path;
// limit caps them (0: the server's default, 1000).
func (f *Files) List(ctx context.Context, path string, recursive bool, limit int) (*EntryList, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	resp, err := f.sb.c.send(ctx, &request{method: "GET", path: f.path("list"), query: q})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Data      []EntryInfo `json:"data"`
		Truncated bool        `json:"truncated"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, decodeError(resp, err)
	}
	return &EntryList{Entries: out.Data, Truncated: out.Truncated}, nil
}

// Stat answers one path's entry (a symlink is described, not followed).
func (f *Files) Stat(ctx context.Context, path string) (*EntryInfo, error) {
	var e EntryInfo
	if err := f.sb.c.do(ctx, &request{method: "GET", path: f.path("stat"), query: url.Values{"path": {path}}}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Exists says whether a path exists.
func (f *Files) Exists(ctx context.Context, path string) (bool, error) {
	_, err := f.Stat(ctx, path)
	if IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Remove removes a file, a link or an empty directory (any directory with recursive).
func (f *Files) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return f.sb.c.do(ctx, &request{method: "DELETE", path: f.path(), query: q}, nil)
}

// MakeDir makes a directory and its missing parents (fine if it exists).
func (f *Files) MakeDir(ctx context.Context, path string) (*EntryInfo, error) {
	var e EntryInfo
	if err := f.sb.c.do(ctx, &request{method: "POST", path: f.path("mkdir"), body: map[string]any{"path": path}}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Rename moves src to dst (replacing a file there) and answers the entry at dst.
func (f *Files) Rename(ctx context.Context, src, dst string) (*EntryInfo, error) {
	var e EntryInfo
	if err := f.sb.c.do(ctx, &request{method: "POST", path: f.path("move"), body: map[string]any{"from": src, "to": dst}}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Watch follows the changes in a directory; the watch is in place when it returns. Close
// the stream when done (or cancel the context).
func (f *Files) Watch(ctx context.Context, path string, recursive bool) (*Stream[FilesystemEvent], error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := f.sb.c.send(ctx, &request{method: "GET", path: f.path("watch"), query: q,
		headers: map[string]string{"Accept": "text/event-stream"}})
	if err != nil {
		return nil, err
	}
	rid := resp.Header.Get("x-request-id")
	return newStream(resp, func(ev sseEvent) (FilesystemEvent, bool, bool, error) {
		switch ev.name {
		case "create", "modify", "delete", "rename":
			var fe FilesystemEvent
			if err := json.Unmarshal([]byte(ev.data), &fe); err != nil {
				return fe, false, true, &Error{Code: CodeDecode, Message: "bad watch event: " + err.Error(), RequestID: rid}
			}
			fe.Type = ev.name
			return fe, true, false, nil
		case "error":
			return FilesystemEvent{}, false, true, errorFromEvent(ev.data, rid)
		}
		return FilesystemEvent{}, false, false, nil
	}), nil
}
