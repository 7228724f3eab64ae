package cella

// Unit tests of the parts that need no server: the SSE decoder, the WebSocket framing
// (masking, lengths, fragments, ping/pong, close) and error envelopes.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestSSEDecoder(t *testing.T) {
	in := ": keep-alive\n\nevent: stdout\ndata: \"a\\n\"\n\nevent: stderr\r\ndata: {\"b64\":\"/wA=\"}\r\n\r\n: another\nevent: exit\ndata: {\"exit_code\":0}"
	r := newSSEReader(strings.NewReader(in))
	var got []sseEvent
	for {
		ev, err := r.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if len(got) != 3 || got[0].name != "stdout" || string(outputBytes(got[0].data)) != "a\n" ||
		!bytes.Equal(outputBytes(got[1].data), []byte{0xff, 0x00}) || got[2].name != "exit" {
		t.Fatalf("events: %+v", got)
	}
	r = newSSEReader(strings.NewReader("data: one\ndata: two\n\n"))
	ev, err := r.next()
	if err != nil || ev.name != "message" || ev.data != "one\ntwo" {
		t.Fatalf("multi-line data: %+v %v", ev, err)
	}
}

func TestFrameMaskingAndLengths(t *testing.T) {
	for _, n := range []int{0, 1, 125, 126, 65535, 65536, 200000} {
		payload := bytes.Repeat([]byte{0xA5}, n)
		var buf bytes.Buffer
		if err := writeFrame(&buf, opBinary, payload); err != nil {
			t.Fatal(err)
		}
		raw := buf.Bytes()
		if raw[0] != 0x80|opBinary || raw[1]&0x80 == 0 {
			t.Fatalf("n=%d: FIN, opcode and the mask bit: %x %x", n, raw[0], raw[1])
		}
		if n > 0 && bytes.Contains(raw[2:], payload) && n > 8 {
			t.Fatalf("n=%d: the payload went out unmasked", n)
		}
		fin, op, got, err := readFrame(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil || !fin || op != opBinary || !bytes.Equal(got, payload) {
			t.Fatalf("n=%d: round trip: %v %v %d %v", n, fin, op, len(got), err)
		}
	}
}

// serverFrame is an unmasked frame, as a server sends.
func serverFrame(fin bool, op byte, payload []byte) []byte {
	b := byte(op)
	if fin {
		b |= 0x80
	}
	out := []byte{b}
	if len(payload) < 126 {
		out = append(out, byte(len(payload)))
	} else {
		out = append(out, 126, byte(len(payload)>>8), byte(len(payload)))
	}
	return append(out, payload...)
}

func TestTerminalPingFragmentsExitAndClose(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	term := &Terminal{conn: client, br: bufio.NewReader(client)}
	go func() {
		server.SetDeadline(time.Now().Add(10 * time.Second))
		w := func(b []byte) { _, _ = server.Write(b) }
		w(serverFrame(true, opPing, []byte("p1")))
		// The client answers a pong with the same payload, masked.
		sr := bufio.NewReader(server)
		fin, op, payload, err := readFrame(sr)
		if err != nil || !fin || op != opPong || string(payload) != "p1" {
			w(serverFrame(true, opBinary, []byte("BAD PONG")))
			return
		}
		w(serverFrame(false, opBinary, []byte("hel")))
		w(serverFrame(true, opContinuation, []byte("lo")))
		w(serverFrame(true, opText, []byte(`{"exit": {"exit_code": 3}}`)))
		w(serverFrame(true, opClose, []byte{0x03, 0xE8}))
		// The client echoes the close.
		_, op, _, _ = readFrame(sr)
		if op != opClose {
			w(serverFrame(true, opBinary, []byte("NO CLOSE")))
		}
		server.Close()
	}()
	out, err := io.ReadAll(term)
	if err != nil || string(out) != "hello" {
		t.Fatalf("output: %q %v", out, err)
	}
	if code, ok := term.ExitCode(); !ok || code != 3 {
		t.Fatalf("exit: %v %v", code, ok)
	}
}

func TestErrorEnvelopes(t *testing.T) {
	resp := &http.Response{StatusCode: 429, Header: http.Header{"X-Request-Id": {"req1"}, "Retry-After": {"2"}}}
	e := errorFromResponse(resp, []byte(`{"error":{"code":"RATE_LIMITED","message":"slow down","details":{"group":"read"}}}`))
	if e.Code != CodeRateLimited || e.Status != 429 || e.RequestID != "req1" || e.RetryAfter != 2*time.Second || e.Details["group"] != "read" {
		t.Fatalf("%#v", e)
	}
	if !errors.Is(e, ErrTooManyRequests) || errors.Is(e, ErrNotFound) || !IsRateLimited(e) {
		t.Fatal("errors.Is on a 429")
	}
	if e.Error() != "RATE_LIMITED: slow down (HTTP 429, request req1)" {
		t.Fatalf("message: %s", e.Error())
	}
	e = errorFromBody(502, []byte("<html>bad gateway</html>"))
	if e.Code != "HTTP_502" || e.Message != "<html>bad gateway</html>" {
		t.Fatalf("not an envelope: %#v", e)
	}
	e = errorFromEvent(`{"error":{"code":"UNAVAILABLE","message":"agent gone","details":null}}`, "req2")
	if e.Code != CodeUnavailable || e.Status != 200 || e.RequestID != "req2" {
		t.Fatalf("an error event: %#v", e)
	}
}
