package model

import "testing"

// TestDescribeSeed prints the trial a seed generates, without running
// it: go test ./internal/testkit/model -run TestDescribeSeed -model.seed N
// -model.store S -model.steps K -v.
func TestDescribeSeed(t *testing.T) {
	if *flagSeed == 0 {
		t.Skip("needs -model.seed")
	}
	st := setting{store: *flagStore}
	tr := Generate(*flagSeed, trialOptions(st, int(*flagSeed-*flagBase), *flagTrials))
	t.Log(tr.Describe())
}
