package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// machine describes where the figures were measured.
type machine struct {
	CPU    string
	NProc  int
	MemGiB float64
	Kernel string
	PG     string
	Kafka  string
	Go     string
}

func describeMachine(ctx context.Context, pool *pgxpool.Pool) machine {
	m := machine{NProc: runtime.NumCPU(), Go: runtime.Version(), CPU: "unknown", Kafka: "unknown"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				m.MemGiB = kb / (1 << 20)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if err := pool.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version')`).Scan(&m.PG); err != nil {
		m.PG = "unknown"
	}
	if v := os.Getenv("FERRY_TEST_KAFKA_VERSION"); v != "" {
		m.Kafka = "Apache Kafka " + v + " (single broker, KRaft)"
	}
	return m
}

func (m machine) markdown() string {
	return fmt.Sprintf("| machine | |\n|---|---|\n| CPU | %s |\n| cores (nproc) | %d |\n| memory | %.1f GiB |\n| kernel | %s |\n| PostgreSQL | %s |\n| Kafka | %s |\n| Go | %s |\n",
		m.CPU, m.NProc, m.MemGiB, m.Kernel, m.PG, m.Kafka, m.Go)
}
