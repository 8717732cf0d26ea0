// Package deploytest holds the tests that keep deploy/ true: the Grafana
// dashboard and the Prometheus alerting rules use only metrics that a
// running relay and worker export, and every alert has its runbook line in
// docs/observability.md; the Kubernetes manifests and systemd units name only commands,
// flags, environment variables and probe paths that exist; the
// least-privilege roles are enough to run a relay and a worker.
package deploytest
