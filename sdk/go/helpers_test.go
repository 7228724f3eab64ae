package cella_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"

	cella "github.com/cella-dev/cella-go"
)

func ioCopy(w io.Writer, resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}

// clientWithoutKey is a client with no API key at all (CELLA_API_KEY is set for the suite,
// so an empty Options.APIKey would take it) and a cookie jar for a session.
func clientWithoutKey(server string, jar *cookiejar.Jar) *cella.Client {
	saved := os.Getenv("CELLA_API_KEY")
	os.Unsetenv("CELLA_API_KEY")
	defer os.Setenv("CELLA_API_KEY", saved)
	return cella.NewClient(cella.Options{Server: server, HTTPClient: &http.Client{Jar: jar}})
}
