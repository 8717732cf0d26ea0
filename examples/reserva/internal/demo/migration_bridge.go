package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryhq/ferry/examples/reserva"
	"github.com/ferryhq/ferry/internal/procs"
	"github.com/ferryhq/ferry/internal/rabbitmq"
)

// bridgeGroup is the consumer of the bridge's queues on RabbitMQ (`relay
// bridge --group`): the same at every run, so that a run deletes the
// queues an interrupted one left, which would otherwise keep every message
// of the exchange for nobody.
const bridgeGroup = "reserva-demo-bridge"

// rabbitPasswordEnv names the variable holding the RabbitMQ password in
// the plan's old channel: the one the relay, the workers, the bridge and
// the migration commands get it in (rabbitChannel.env).
const rabbitPasswordEnv = "FERRY_RABBITMQ_PASSWORD"

// startBridge starts `relay bridge` while the plan is OLD_ONLY, so that
// its queues exist before the old channel is fenced, and waits until it
// declared them.
func (m *migrationDemo) startBridge(ctx context.Context) error {
	m.step("relay bridge, while the plan is OLD_ONLY: its own queues on %s keep what the foreign producer publishes from now on, copied to cluster B from DUAL_WRITE",
		reserva.TopicOrders)
	args := []string{"bridge", "--plan", m.plan, "--topics", reserva.TopicOrders,
		"--topic-map", reserva.TopicOrders + "=" + m.newTopic(reserva.AggregateOrder), "--group", bridgeGroup, "--http-addr", m.mo.bridgeAddr}
	m.show("relay", args...)
	var err error
	m.bridge, err = procs.Start(procs.Spec{Name: "bridge", Path: m.bins["relay"], Args: args,
		Env: append(m.env[:len(m.env):len(m.env)], "FERRY_LOG_FORMAT=json"), LogFile: filepath.Join(m.dir, "bridge.log")})
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+m.mo.bridgeAddr+"/readyz", time.Minute); err != nil {
		return fmt.Errorf("%w (log %s)", err, m.bridge.LogFile())
	}
	m.bridgeReady = time.Now()
	m.say("   %s the bridge's %d queues (consumer %s) are declared; it waits for DUAL_WRITE, reading nothing meanwhile",
		m.elapsed(), m.rabbit.cfg.Shards, bridgeGroup)
	m.say("   what the foreign producer published before is in the workers' queues only: the bridge's copies wait, at the workers, for the old channel's fences")
	return nil
}

// bridgeCounts are what `relay bridge` says it did when it stops.
type bridgeCounts struct {
	Copied  int64 `json:"copied"`
	Derived int64 `json:"derived_ids"`
}

// bridgeStopped reads the counts from the bridge's JSON log line "bridge
// stopped"; false when there is none.
func bridgeStopped(log []byte) (bridgeCounts, bool) {
	var last bridgeCounts
	found := false
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			bridgeCounts
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "bridge stopped" {
			last, found = line.bridgeCounts, true
		}
	}
	return last, found
}

// stopBridge stops the bridge, which must still be running, and returns
// its counts.
func (m *migrationDemo) stopBridge() (bridgeCounts, error) {
	if !m.bridge.Alive() {
		return bridgeCounts{}, fmt.Errorf("relay bridge exited by itself: %v (log %s)", m.bridge.Err(), m.bridge.LogFile())
	}
	if err := m.bridge.Stop(30 * time.Second); err != nil {
		return bridgeCounts{}, fmt.Errorf("stop relay bridge: %w (log %s)", err, m.bridge.LogFile())
	}
	log, err := os.ReadFile(m.bridge.LogFile())
	if err != nil {
		return bridgeCounts{}, err
	}
	c, ok := bridgeStopped(log)
	if !ok {
		return c, fmt.Errorf("relay bridge stopped without its counts (log %s)", m.bridge.LogFile())
	}
	return c, nil
}

// deleteBridgeQueues deletes the bridge's queues: bound to the exchange
// and read by no one once the bridge is gone, they would keep everything
// published there.
func (m *migrationDemo) deleteBridgeQueues() error {
	conn, err := m.rabbit.conn().Dial(rabbitNames)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	for s := range m.rabbit.cfg.Shards {
		q := rabbitmq.QueueName(reserva.TopicOrders, s, bridgeGroup)
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete %s: %w", q, err)
		}
	}
	return nil
}

// stopAll stops the bridge, then what make demo runs, and deletes the
// bridge's queues.
func (m *migrationDemo) stopAll() {
	if m.bridge != nil {
		_ = m.bridge.Stop(30 * time.Second)
	}
	m.demo.stopAll()
	if m.rabbit != nil {
		if err := m.deleteBridgeQueues(); err != nil {
			m.say("   the bridge's queues on %s not deleted: %v", reserva.TopicOrders, err)
		}
	}
}
