// Package deploy holds what an operator installs beside the projector: the
// Grafana dashboard (grafana/projector.json) and the Prometheus alert rules
// (prometheus/alerts.yaml), whose runbook is docs/runbook.md. It has no Go
// code of its own; its tests hold those files to the code: every metric
// and label they name exists in the generated metric reference and in a
// running projector's /metrics, every query parses with Prometheus's own
// parser, every rule file loads as Prometheus loads it, every alert has a
// runbook section, the alerts fire, evaluated by Prometheus's query
// engine, on what a projector with a held gap and lag exports, and fire
// (or stay silent) over written histories evaluated minute by minute, so
// that their windows and for: durations count.
//
// It must never be imported: its tests link Prometheus itself.
package deploy
