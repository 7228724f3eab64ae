// Package testserver starts and stops a real Cella server for the SDK's tests and
// examples: the binary is $CELLA_BIN, it listens on a free port of 127.0.0.1, keeps its
// state in a temporary directory and has a random bootstrap (admin) key. Stop destroys
// every sandbox left, stops the server with SIGTERM and removes its directory.
package testserver

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Pool configurations tried in order: the first the server accepts is used.
var poolCandidates = []string{"[pool]\ndefault = 0\nsizes = {}\n", "[pool]\ndefault = 0\n", ""}

// Server is a running test server.
type Server struct {
	URL     string
	Key     string
	Dir     string
	LogPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Binary is $CELLA_BIN (absolute), checked to be executable.
func Binary() (string, error) {
	bin := os.Getenv("CELLA_BIN")
	if bin == "" {
		return "", fmt.Errorf("CELLA_BIN is not set: point it at the cella server binary (target/debug/cella)")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(abs)
	if err != nil || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("no executable Cella server at %s", abs)
	}
	return abs, nil
}

// Start starts a server with extraConfig appended to its configuration (a TOML text) and
// waits until /healthz answers.
func Start(extraConfig, name string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", name+"-go-sdk-test-")
	if err != nil {
		return nil, err
	}
	raw := make([]byte, 16)
	_, _ = rand.Read(raw)
	key := "test-" + hex.EncodeToString(raw)
	logPath := filepath.Join(dir, "server.log")
	cfgPath := filepath.Join(dir, "config.toml")
	var lastLog string
	for _, pool := range poolCandidates {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(cfgPath, []byte(pool+extraConfig), 0o600); err != nil {
			return nil, err
		}
		logf, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
			"--data-dir", filepath.Join(dir, "data"), "--config", cfgPath)
		cmd.Stdout, cmd.Stderr = logf, logf
		env := []string{"CELLA_BOOTSTRAP_KEY=" + key}
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "CELLA_API_KEY=") && !strings.HasPrefix(e, "CELLA_BOOTSTRAP_KEY=") {
				env = append(env, e)
			}
		}
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return nil, err
		}
		logf.Close()
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-exited:
				deadline = time.Now()
				continue
			default:
			}
			c := http.Client{Timeout: 2 * time.Second}
			if resp, err := c.Get(url + "/healthz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return &Server{URL: url, Key: key, Dir: dir, LogPath: logPath, cmd: cmd, exited: exited}, nil
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = cmd.Process.Kill()
		<-exited
		b, _ := os.ReadFile(logPath)
		lastLog = string(b)
		if !strings.Contains(lastLog, "unknown field") {
			break
		}
	}
	os.RemoveAll(dir)
	if len(lastLog) > 3000 {
		lastLog = lastLog[len(lastLog)-3000:]
	}
	return nil, fmt.Errorf("the Cella server (%s) did not start:\n%s", bin, lastLog)
}

// Admin sends a request with the bootstrap key and decodes the JSON answer into out.
func (s *Server) Admin(method, path string, body any, out any) (int, error) {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, s.URL+"/api/v1"+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 120 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// LiveSandboxes answers the ids of the default workspace's sandboxes not destroyed.
func (s *Server) LiveSandboxes() ([]string, error) {
	var ids []string
	cursor := ""
	for {
		path := "/sandboxes?limit=1000"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		var page struct {
			Data []struct {
				ID    string `json:"id"`
				State string `json:"state"`
			} `json:"data"`
			NextCursor *string `json:"next_cursor"`
		}
		if _, err := s.Admin("GET", path, nil, &page); err != nil {
			return nil, err
		}
		for _, d := range page.Data {
			if d.State != "destroyed" {
				ids = append(ids, d.ID)
			}
		}
		if page.NextCursor == nil || *page.NextCursor == "" {
			return ids, nil
		}
		cursor = *page.NextCursor
	}
}

// Stop destroys what is left, stops the server and removes its data (kept with
// CELLA_KEEP_TEST_DATA set); it answers the ids of the sandboxes that were left.
func (s *Server) Stop() []string {
	left, err := s.LiveSandboxes()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testserver: listing what is left failed: %v\n", err)
	}
	for _, id := range left {
		_, _ = s.Admin("DELETE", "/sandboxes/"+id, nil, nil)
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	if os.Getenv("CELLA_KEEP_TEST_DATA") != "" {
		fmt.Fprintf(os.Stderr, "testserver: server data kept in %s\n", s.Dir)
	} else {
		os.RemoveAll(s.Dir)
	}
	return left
}
