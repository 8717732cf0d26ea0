// Package faults is Ferry's fault-injection suite: it proves the delivery
// guarantees under crashes, pauses and outages, the way Jepsen's Kafka checker
// looks for lost, duplicated and reordered messages.
//
// Run starts, as real OS processes against the real stack (scripts/stack):
// the relay, two checker workers (this package's effect handler hosted by
// workercli.Main, two consumers each) and a load generator that writes
// versioned events across 1,000 aggregates, some transactions with hundreds
// of events, some rolled back or failing on purpose, a few poison events (for
// the dead-letter topic) and a few oversized ones (for the relay's
// quarantine). While the load runs it injects, at random times: SIGKILL of
// the relay and of a worker (each restarted), a Kafka broker stop of 10–20 s,
// an immediate PostgreSQL restart, and SIGSTOP of a worker for longer than
// its group session timeout. Once the faults have healed and the pipeline has
// drained it checks DESIGN.md's invariants:
//
//   - every committed event has exactly one effect per consumer (M1);
//   - per aggregate, effects applied in version order;
//   - every event without an effect is quarantined or dead-lettered, with a
//     reason (M3);
//   - the final per-aggregate state equals the latest version written (M2);
//   - events of failed write transactions have no effect;
//
// and reports the figures: events written, faults by kind, duplicates
// published to Kafka and blocked by the inbox, lost, double effects, order
// inversions and the time to drain.
//
// RunControl and RunWorkerControl are the negative controls: a relay
// started with --unsafe-confirm-on-send killed while the broker is down, and
// a worker started with --unsafe-commit-before-db killed with batches in
// flight. The checker must report the loss of each, on a run that drained:
// before that, events on their way look lost (Report.ControlCaught).
//
// With Options.Broker = BrokerRabbitMQ the same run goes through the
// stack's RabbitMQ node (RabbitMQShort, RabbitMQFaults: the broker stopped,
// killed and frozen, a shard left without queues, besides the process
// faults), with the same checker; the duplicates RabbitMQ delivered are the
// workers' counters, since a queue cannot be read again. Its negative
// controls are RunControl and RunWorkerControl on RabbitMQ
// (--unsafe-confirm-on-send, --unsafe-ack-before-db), RunNoMandatoryControl
// and RunRequeueControl (caught by order inversions,
// Report.OrderControlCaught).
//
// The command is `go run ./internal/faults/cmd/ferryfaults`; `make test`
// runs the short suite (TestFaultSuite, build tag faults) and `make soak`
// the long one.
package faults
