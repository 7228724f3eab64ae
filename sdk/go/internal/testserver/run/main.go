// Command run runs a command with CELLA_SERVER and CELLA_API_KEY set for a Cella server
// started for it (see package testserver), and exits with the command's exit code:
//
//	CELLA_BIN=target/debug/cella go run ./internal/testserver/run -- go run ./examples/hello
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/cella-dev/cella-go/internal/testserver"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: run COMMAND [ARG...]")
		os.Exit(2)
	}
	srv, err := testserver.Start("", "cella-run")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "CELLA_SERVER="+srv.URL, "CELLA_API_KEY="+srv.Key)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	rc := 0
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		rc = 1
	} else {
		go func() {
			s := <-sigs
			_ = cmd.Process.Signal(s)
		}()
		if err := cmd.Wait(); err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				rc = ee.ExitCode()
			} else {
				rc = 1
			}
		}
	}
	if left := srv.Stop(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "run: the command left sandboxes behind: %v\n", left)
		if rc == 0 {
			rc = 1
		}
	}
	os.Exit(rc)
}
