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
	failures        map[string]int // attempts whose upstream fails, by how and protocol
	spellings       map[string]int // of the attempts spelt otherwise (form.go), by what they change
}

var stats = &counts{configs: map[string]bool{}, steps: map[string]int{}, attempts: map[string]int{}, failures: map[string]int{}, spellings: map[string]int{}}

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
			if f := a.Do.failureKind(); f != "" {
				s.failures[f+" "+a.Proto.String()]++
			}
			f := a.Form
			for what, ok := range map[string]bool{"host": f.HostCase != "" || f.HostDot || f.Port != "", "names": f.Names != "",
				"coding " + f.Coding: f.Coding != "", "media type": f.MediaType != "", "json": f.Respell != 0, "corrupt": f.Corrupt} {
				if ok {
					s.spellings[what]++
				}
			}
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
	b.WriteString("\nattempts whose upstream fails, by how and protocol:")
	for _, k := range slices.Sorted(maps.Keys(s.failures)) {
		fmt.Fprintf(&b, " %s %d,", k, s.failures[k])
	}
	b.WriteString("\nattempts spelt otherwise:")
	for _, k := range slices.Sorted(maps.Keys(s.spellings)) {
		fmt.Fprintf(&b, " %s %d,", k, s.spellings[k])
	}
	return strings.TrimSuffix(b.String(), ",")
}
