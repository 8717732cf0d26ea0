package relay_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// relayBin is the relay binary that process tests start and kill.
var relayBin string

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		if !testing.Short() {
			dir, err := os.MkdirTemp("", "ferry-relay-bin")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer os.RemoveAll(dir)
			relayBin = filepath.Join(dir, "relay")
			out, err := exec.Command("go", "build", "-o", relayBin, "github.com/ferryhq/ferry/cmd/relay").CombinedOutput()
			if err != nil {
				fmt.Fprintf(os.Stderr, "build relay: %v\n%s", err, out)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}
