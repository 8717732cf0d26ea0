package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func spliceFile(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "benchmarks.md")
	if content != "" {
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return file
}

func read(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSpliceReplacesOnlyWhatIsBetweenTheMarkers(t *testing.T) {
	t.Parallel()
	before := "# Benchmarks\n\nmake bench's tables\n\n"
	after := "\ntrailing text\n"
	file := spliceFile(t, before+beginMarker+"\nold peers\n"+endMarker+after)
	if err := splice(file, "new peers\n"); err != nil {
		t.Fatal(err)
	}
	want := before + beginMarker + "\nnew peers\n" + endMarker + after
	if got := read(t, file); got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

func TestSpliceAppendsTheMarkedSectionWhenTheFileHasNone(t *testing.T) {
	t.Parallel()
	file := spliceFile(t, "# Benchmarks\nno newline at the end")
	if err := splice(file, "peers\n"); err != nil {
		t.Fatal(err)
	}
	want := "# Benchmarks\nno newline at the end\n\n" + beginMarker + "\npeers\n" + endMarker + "\n"
	if got := read(t, file); got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	// A second run replaces the section instead of appending another.
	if err := splice(file, "peers again\n"); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file); strings.Count(got, beginMarker) != 1 || !strings.Contains(got, "peers again") {
		t.Fatalf("second splice: %q", got)
	}
}

func TestSpliceRefusesAFileWithOneMarker(t *testing.T) {
	t.Parallel()
	file := spliceFile(t, "text\n"+endMarker+"\n")
	if err := splice(file, "peers\n"); err == nil {
		t.Fatal("splice into a file with only the end marker succeeded")
	}
	if got := read(t, file); got != "text\n"+endMarker+"\n" {
		t.Fatalf("the file changed: %q", got)
	}
}
