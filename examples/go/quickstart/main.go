// Quickstart: a sandbox, a streamed command, a file round trip, a code cell with a chart,
// a one-shot run with an artifact. Run it against a server:
//
//	CELLA_SERVER=http://127.0.0.1:7070 CELLA_API_KEY=... go run ./quickstart
package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	cella "github.com/cella-dev/cella-go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	client := cella.NewClient() // CELLA_SERVER and CELLA_API_KEY
	sb, err := client.Sandboxes.Create(ctx, &cella.CreateOptions{Size: "small", Timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer sb.Kill(context.Background())
	fmt.Println("sandbox", sb.ID(), sb.State())

	// A command whose output streams as it is written.
	res, err := sb.Commands.Run(ctx, "for i in 1 2 3; do echo step $i; sleep 0.1; done", &cella.CommandOptions{Stdout: os.Stdout})
	if err != nil {
		return err
	}
	fmt.Println("exit code", res.ExitCode)

	// Files are readers and writers.
	csv := "city,people\nLyon,522000\nNantes,320000\nLille,236000\n"
	if _, err := sb.Files.Write(ctx, "/home/user/cities.csv", strings.NewReader(csv), nil); err != nil {
		return err
	}

	// The code interpreter keeps its state between cells and returns rich outputs.
	ex, err := sb.Code.Run(ctx, `
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.read_csv("/home/user/cities.csv")
df.plot.bar(x="city", y="people")
plt.show()
int(df.people.sum())`, nil)
	if err != nil {
		return err
	}
	if !ex.OK {
		return fmt.Errorf("the cell failed: %s: %s", ex.Error.Name, ex.Error.Value)
	}
	pngs, err := ex.PNGs()
	if err != nil || len(pngs) != 1 || !bytes.HasPrefix(pngs[0], []byte("\x89PNG")) {
		return fmt.Errorf("expected one PNG chart, got %d (%v)", len(pngs), err)
	}
	fmt.Printf("total %s, chart of %d bytes\n", ex.Text(), len(pngs[0]))

	// A one-shot run: a sandbox made, used and destroyed in one call, its output kept.
	run, err := client.Sandboxes.Run(ctx, "sort -t, -k2 -n cities.csv > sorted.csv", &cella.RunOptions{
		Size:      "xs",
		Files:     []cella.RunFile{{Path: "cities.csv", Content: []byte(csv)}},
		Artifacts: []string{"sorted.csv"},
		Check:     true,
	})
	if err != nil {
		return err
	}
	sorted, err := client.Artifacts.Read(ctx, run.Artifacts[0].ID)
	if err != nil {
		return err
	}
	fmt.Print(string(sorted))
	if !strings.HasPrefix(string(sorted), "city,people\nLille") {
		return fmt.Errorf("unexpected sort: %q", sorted)
	}
	fmt.Println("quickstart: ok")
	return nil
}
