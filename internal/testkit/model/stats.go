package model

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// counts are what the model ran, for its report: how many distinct
// configurations, scenarios and steps a budget really covered.
type counts struct {
	mu              sync.Mutex
	trials, refused int
	configs         map[string]bool
	steps           map[string]int
	attempts        map[string]int
}

var stats = &counts{configs: map[string]bool{}, steps: map[string]int{}, attempts: map[string]int{}}

// trial counts a trial about to run.
func (s *counts) trial(t *Trial) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trials++
	s.refused += len(t.Refused)
	c := t.Config
	s.configs[fmt.Sprintf("%s %+v %v %d %d %d", c.Store.Kind, c.Layout, c.Store.ReplayCache, c.Store.MaxKeysPerScope, c.Store.MaxConns, c.Store.FillKeys)] = true
	for _, st := range t.Steps {
		kind := st.Kind
		if st.Scenario != "" {
			kind = "scenario " + st.Scenario
		}
		s.steps[kind]++
		for _, a := range st.Attempts {
			s.attempts[a.Proto.String()+" "+a.Mode.String()]++
		}
	}
}

// report renders the counts.
func (s *counts) report() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	total := 0
	for _, n := range s.steps {
		total += n
	}
	fmt.Fprintf(&b, "%d trials on %d distinct configurations (%d invalid ones refused apart), %d steps:", s.trials, len(s.configs), s.refused, total)
	for _, k := range slices.Sorted(maps.Keys(s.steps)) {
		fmt.Fprintf(&b, " %s %d,", k, s.steps[k])
	}
	b.WriteString("\nattempts by protocol and client:")
	for _, k := range slices.Sorted(maps.Keys(s.attempts)) {
		fmt.Fprintf(&b, " %s %d,", k, s.attempts[k])
	}
	return strings.TrimSuffix(b.String(), ",")
}
