package cella

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
)

// sseEvent is one server-sent event.
type sseEvent struct {
	name string
	data string
}

// sseReader decodes the subset of server-sent events the server speaks; comment lines
// (keep-alives) are skipped.
type sseReader struct {
	r *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 64*1024)} }

// next answers the next event, or io.EOF at the end of the stream.
func (s *sseReader) next() (sseEvent, error) {
	var name string
	var data []string
	have := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil && (err != io.EOF || line == "") {
			if err == io.EOF && have {
				return sseEvent{name: orMessage(name), data: strings.Join(data, "\n")}, nil
			}
			return sseEvent{}, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			if have {
				return sseEvent{name: orMessage(name), data: strings.Join(data, "\n")}, nil
			}
			if err == io.EOF {
				return sseEvent{}, io.EOF
			}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			name, have = value, true
		case "data":
			data, have = append(data, value), true
		}
		if err == io.EOF {
			return sseEvent{name: orMessage(name), data: strings.Join(data, "\n")}, nil
		}
	}
}

func orMessage(s string) string {
	if s == "" {
		return "message"
	}
	return s
}

// outputBytes decodes the data of a stdout/stderr event: a JSON string of UTF-8 text, or
// {"b64": ...} for bytes that are not.
func outputBytes(data string) []byte {
	var s string
	if json.Unmarshal([]byte(data), &s) == nil {
		return []byte(s)
	}
	var b struct {
		B64 string `json:"b64"`
	}
	if json.Unmarshal([]byte(data), &b) == nil {
		if out, err := base64.StdEncoding.DecodeString(b.B64); err == nil {
			return out
		}
	}
	return nil
}

// Stream is an iterator over the items of a streamed answer (command output, file events,
// task events, ...):
//
//	for stream.Next() {
//	    item := stream.Current()
//	}
//	if err := stream.Err(); err != nil { ... }
//
// Close ends it early (closing the connection); it is safe to call more than once.
type Stream[T any] struct {
	resp      *http.Response
	sse       *sseReader
	decode    func(ev sseEvent) (item T, ok bool, done bool, err error)
	cur       T
	err       error
	done      bool
	closeOnce sync.Once
}

func newStream[T any](resp *http.Response, decode func(ev sseEvent) (T, bool, bool, error)) *Stream[T] {
	return &Stream[T]{resp: resp, sse: newSSEReader(resp.Body), decode: decode}
}

// Next reads the next item; false at the end of the stream or on an error (see Err).
func (s *Stream[T]) Next() bool {
	for !s.done {
		ev, err := s.sse.next()
		if err != nil {
			closed := s.done
			s.done = true
			if err != io.EOF && !closed {
				if ctxErr := s.resp.Request.Context().Err(); ctxErr != nil {
					s.err = &Error{Code: CodeTimeout, Message: "the stream's context ended: " + ctxErr.Error(), RequestID: s.RequestID(), cause: ctxErr}
				} else {
					s.err = connError(err)
				}
			}
			s.Close()
			return false
		}
		item, ok, done, err := s.decode(ev)
		if err != nil {
			s.err = err
			s.done = true
			s.Close()
			return false
		}
		if done {
			s.done = true
			s.Close()
		}
		if ok {
			s.cur = item
			return true
		}
	}
	return false
}

// Current is the item the last Next read.
func (s *Stream[T]) Current() T { return s.cur }

// Err is the error that ended the stream (nil at its normal end or after Close).
func (s *Stream[T]) Err() error { return s.err }

// RequestID is the stream answer's x-request-id.
func (s *Stream[T]) RequestID() string { return s.resp.Header.Get("x-request-id") }

// Close ends the stream and its connection.
func (s *Stream[T]) Close() error {
	s.closeOnce.Do(func() {
		s.done = true
		s.resp.Body.Close()
	})
	return nil
}

// Chan answers the items on a channel, closed at the end of the stream (read Err after).
func (s *Stream[T]) Chan() <-chan T {
	ch := make(chan T)
	go func() {
		defer close(ch)
		for s.Next() {
			ch <- s.Current()
		}
	}()
	return ch
}
