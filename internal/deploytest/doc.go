// Package deploytest holds the tests that keep deploy/ true: the Grafana
// dashboard and the Prometheus alerting rules use only metrics that a
// running relay and worker export, and every alert has its runbook line in
// README.
package deploytest
