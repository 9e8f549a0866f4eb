// Package prometheus holds the Prometheus recording and alerting rules of
// the module (idempotency.rules.yml) and their unit tests
// (idempotency.rules.test.yml), which rules_test.go runs with promtool.
//
// It holds no code.
package prometheus
