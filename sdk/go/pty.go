package cella

// A minimal WebSocket client (RFC 6455) for the terminal route: the opening handshake,
// masked client frames, fragmented messages, ping/pong and the close handshake. Only what
// the terminal needs; no extensions, no subprotocols.

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// WebSocket opcodes.
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// maxMessage bounds a message the client accepts from the server.
const maxMessage = 16 << 20

// PTYOptions open a terminal.
type PTYOptions struct {
	// Cols and Rows are the terminal's size (default 80 x 24).
	Cols, Rows int
	// Command is a shell line run instead of the login shell.
	Command string
	// User is "user" (default) or "root".
	User string
	// Cwd is an absolute working directory.
	Cwd string
}

// Terminal is an interactive terminal in a sandbox (GET .../pty, a WebSocket). Read the
// program's output with Read (io.EOF once it exited: see ExitCode); type into it with
// Write; Close hangs it up.
type Terminal struct {
	conn    net.Conn
	br      *bufio.Reader
	wmu     sync.Mutex
	pending []byte
	exit    *int
	closed  bool
	err     error
}

// PTY opens a terminal on a new pseudo-terminal of the sandbox. The context bounds the
// opening only; the terminal lasts until Close, or until its program exits. Errors before
// the upgrade (403, 404, 409 SANDBOX_NOT_RUNNING, 400 for a bad cwd or command) are
// *Error values as for every call.
func (sb *Sandbox) PTY(ctx context.Context, opts *PTYOptions) (*Terminal, error) {
	q := url.Values{}
	if opts != nil {
		if opts.Cols > 0 {
			q.Set("cols", strconv.Itoa(opts.Cols))
		}
		if opts.Rows > 0 {
			q.Set("rows", strconv.Itoa(opts.Rows))
		}
		if opts.Command != "" {
			q.Set("command", opts.Command)
		}
		if opts.User != "" {
			q.Set("user", opts.User)
		}
		if opts.Cwd != "" {
			q.Set("cwd", opts.Cwd)
		}
	}
	return dialWebSocket(ctx, sb.c, sb.c.url(&request{path: sb.path("pty"), query: q}))
}

func dialWebSocket(ctx context.Context, c *Client, rawURL string) (*Terminal, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: err.Error()}
	}
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			host += ":443"
		} else {
			host += ":80"
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, connError(err)
	}
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname()})
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, connError(err)
		}
		conn = tc
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			conn.Close()
		case <-done:
		}
	}()
	defer close(done)

	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		conn.Close()
		return nil, &Error{Code: CodeInternal, Message: "no randomness: " + err.Error()}
	}
	key := base64.StdEncoding.EncodeToString(nonce)
	req, _ := http.NewRequest("GET", rawURL, nil)
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Sec-WebSocket-Key", key)
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("User-Agent", "cella-go/"+Version)
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	for k, v := range c.headers {
		req.Header.Set(k, v)
	}
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, connError(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, &Error{Code: CodeTimeout, Message: "the terminal did not open in time", cause: ctx.Err()}
		}
		return nil, connError(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		conn.Close()
		return nil, errorFromResponse(resp, body)
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	if resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) ||
		!strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
		conn.Close()
		return nil, &Error{Code: CodeConnection, Message: "the server's WebSocket handshake is not valid"}
	}
	return &Terminal{conn: conn, br: br}, nil
}

// writeFrame sends one masked frame.
func (t *Terminal) writeFrame(op byte, payload []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	return writeFrame(t.conn, op, payload)
}

func writeFrame(w io.Writer, op byte, payload []byte) error {
	hdr := make([]byte, 0, 14)
	hdr = append(hdr, 0x80|op)
	n := len(payload)
	switch {
	case n < 126:
		hdr = append(hdr, 0x80|byte(n))
	case n <= 0xFFFF:
		hdr = append(hdr, 0x80|126, byte(n>>8), byte(n))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	var mask [4]byte
	if _, err := rand.Read(mask[:]); err != nil {
		return err
	}
	hdr = append(hdr, mask[:]...)
	buf := make([]byte, len(hdr)+n)
	copy(buf, hdr)
	for i, b := range payload {
		buf[len(hdr)+i] = b ^ mask[i%4]
	}
	_, err := w.Write(buf)
	return err
}

// readFrame reads one frame (unmasking it if the peer masked it).
func readFrame(r *bufio.Reader) (fin bool, op byte, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0F
	masked := h[1]&0x80 != 0
	n := uint64(h[1] & 0x7F)
	switch n {
	case 126:
		var ext [2]byte
		if _, err = io.ReadFull(r, ext[:]); err != nil {
			return
		}
		n = uint64(binary.BigEndian.Uint16(ext[:]))
	case 127:
		var ext [8]byte
		if _, err = io.ReadFull(r, ext[:]); err != nil {
			return
		}
		n = binary.BigEndian.Uint64(ext[:])
	}
	if n > maxMessage {
		err = errors.New("websocket frame too large")
		return
	}
	var mask [4]byte
	if masked {
		if _, err = io.ReadFull(r, mask[:]); err != nil {
			return
		}
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(r, payload); err != nil {
		return
	}
	if masked {
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
	}
	return
}

// readMessage reads the next data message, answering pings and the close handshake on the
// way. io.EOF once the server closed.
func (t *Terminal) readMessage() (op byte, data []byte, err error) {
	var msgOp byte
	var msg []byte
	for {
		fin, fop, payload, err := readFrame(t.br)
		if err != nil {
			return 0, nil, err
		}
		switch fop {
		case opPing:
			if err := t.writeFrame(opPong, payload); err != nil {
				return 0, nil, err
			}
			continue
		case opPong:
			continue
		case opClose:
			code := payload
			if len(code) > 2 {
				code = code[:2]
			}
			_ = t.writeFrame(opClose, code)
			return 0, nil, io.EOF
		case opContinuation:
			msg = append(msg, payload...)
		case opText, opBinary:
			msgOp, msg = fop, payload
		default:
			return 0, nil, errors.New("unknown websocket opcode " + strconv.Itoa(int(fop)))
		}
		if len(msg) > maxMessage {
			return 0, nil, errors.New("websocket message too large")
		}
		if fin {
			return msgOp, msg, nil
		}
	}
}

// Read reads the program's output; io.EOF once the terminal closed (ExitCode then says
// how the program ended).
func (t *Terminal) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		if t.err != nil {
			return 0, t.err
		}
		op, data, err := t.readMessage()
		if err != nil {
			if err != io.EOF && !t.closed {
				err = connError(err)
			} else {
				err = io.EOF
			}
			t.err = err
			t.conn.Close()
			return 0, err
		}
		if op == opText {
			var m struct {
				Exit *struct {
					ExitCode int `json:"exit_code"`
				} `json:"exit"`
			}
			if json.Unmarshal(data, &m) == nil && m.Exit != nil {
				code := m.Exit.ExitCode
				t.exit = &code
				continue
			}
		}
		t.pending = data
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// Write types bytes into the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.writeFrame(opBinary, p); err != nil {
		return 0, connError(err)
	}
	return len(p), nil
}

// Resize changes the terminal's size.
func (t *Terminal) Resize(cols, rows int) error {
	b, _ := json.Marshal(map[string]any{"resize": map[string]int{"cols": cols, "rows": rows}})
	if err := t.writeFrame(opText, b); err != nil {
		return connError(err)
	}
	return nil
}

// Ping sends a ping (the server's pong is read, and dropped, by Read).
func (t *Terminal) Ping(payload []byte) error { return t.writeFrame(opPing, payload) }

// ExitCode is the program's exit code once the server sent it (false: not yet, or the
// terminal closed without one).
func (t *Terminal) ExitCode() (int, bool) {
	if t.exit == nil {
		return 0, false
	}
	return *t.exit, true
}

// Close hangs the terminal up (close frame 1000, then the connection).
func (t *Terminal) Close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	_ = t.writeFrame(opClose, []byte{0x03, 0xE8})
	return t.conn.Close()
}
