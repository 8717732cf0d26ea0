package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReportKeepsThePeersSection(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	peers := peersBegin + "\n## Peers\n\n| relay | drain |\n|---|---|\n| Debezium | 1 |\n  trailing spaces  \n" + peersEnd
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nold figures\n\n"+peers+"\n\nafter the section\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeReport(path, "# Benchmarks\n\nnew figures\n"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), "new figures") || strings.Contains(string(got), "old figures") {
		t.Errorf("the report was not replaced:\n%s", got)
	}
	if !strings.Contains(string(got), peers) {
		t.Errorf("the peers' section did not survive byte for byte:\n%s", got)
	}
}

func TestWriteReportWithoutAPeersSection(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := writeReport(path, "# Benchmarks\n"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "# Benchmarks\n" {
		t.Errorf("got %q", got)
	}
}

func TestWriteReportKeepsBothPeersSections(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	kafka := peersBegin + "\n## Peers\n\n| Debezium | 1 |\n" + peersEnd
	rabbit := rabbitPeersBegin + "\n## Peers on RabbitMQ\n\n| Watermill | 2 |\n" + rabbitPeersEnd
	if err := os.WriteFile(path, []byte("# Benchmarks\n\nold figures\n\n"+kafka+"\n\n"+rabbit+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeReport(path, "# Benchmarks\n\nnew figures\n"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k, r := strings.Index(string(got), kafka), strings.Index(string(got), rabbit)
	if k < 0 || r < 0 || r < k || strings.Contains(string(got), "old figures") {
		t.Errorf("want the new report, then the Kafka peers' section, then RabbitMQ's, byte for byte:\n%s", got)
	}
}
