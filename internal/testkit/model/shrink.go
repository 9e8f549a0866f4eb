package model

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
)

// Shrink looks for a smaller trial that still shows one of the kinds of
// anomaly an shows: fewer steps, fewer attempts per step, then options
// back to their defaults, within budget re-runs. Failures that depend on
// timing may not reproduce every time; a candidate counts as failing if
// one run of it fails.
func Shrink(env *Env, tr *Trial, an []Anomaly, budget int) (*Trial, []Anomaly) {
	kinds := map[string]bool{}
	for _, a := range an {
		kinds[a.Kind] = true
	}
	best, bestAn := tr, an
	try := func(c *Trial) bool {
		if budget <= 0 {
			return false
		}
		budget--
		got := env.Run(c)
		for _, a := range got {
			if kinds[a.Kind] {
				best, bestAn = c, got
				return true
			}
		}
		return false
	}
	// Steps: drop halves, then single steps, last first (later steps
	// rarely cause earlier failures).
	for size := len(best.Steps) / 2; size >= 1; size /= 2 {
		for i := len(best.Steps) - size; i >= 0; i -= size {
			c := *best
			c.Steps = slices.Concat(best.Steps[:i], best.Steps[i+size:])
			try(&c)
		}
	}
	// Attempts within a step.
	for si := range best.Steps {
		for ai := len(best.Steps[si].Attempts) - 1; ai >= 1; ai-- {
			if ai >= len(best.Steps[si].Attempts) {
				continue
			}
			c := *best
			c.Steps = slices.Clone(best.Steps)
			st := c.Steps[si]
			st.Attempts = slices.Concat(st.Attempts[:ai], st.Attempts[ai+1:])
			c.Steps[si] = st
			try(&c)
		}
	}
	// Spellings back to plain (form.go), an attempt at a time.
	for si := range best.Steps {
		for ai, a := range best.Steps[si].Attempts {
			if a.Form == (Form{}) {
				continue
			}
			c := *best
			c.Steps = slices.Clone(best.Steps)
			st := c.Steps[si]
			st.Attempts = slices.Clone(st.Attempts)
			plain := *a
			plain.Form = Form{}
			st.Attempts[ai] = &plain
			c.Steps[si] = st
			try(&c)
		}
	}
	// Options back to their defaults.
	for _, simplify := range simplifications {
		c := *best
		cfg := *best.Config
		cfg.Layout.Handlers = slices.Clone(cfg.Layout.Handlers)
		if !simplify(&cfg) {
			continue
		}
		c.Config = &cfg
		try(&c)
	}
	return best, bestAn
}

// simplifications each turn one thing of a config off; false when there
// was nothing to turn off.
var simplifications = []func(c *Config) bool{
	func(c *Config) bool { l := &c.Layout; r := l.OuterHeaders; l.OuterHeaders = false; return r },
	func(c *Config) bool { l := &c.Layout; r := l.Encode; l.Encode = false; return r },
	func(c *Config) bool { l := &c.Layout; r := l.InnerDeleteServer; l.InnerDeleteServer = false; return r },
	func(c *Config) bool { r := c.Store.ReplayCache; c.Store.ReplayCache = false; return r },
	func(c *Config) bool { r := c.Store.MaxKeysPerScope != 0; c.Store.MaxKeysPerScope = 0; return r },
	func(c *Config) bool {
		if len(c.Layout.Handlers) != 2 {
			return false
		}
		c.Layout.Handlers = c.Layout.Handlers[1:]
		c.Layout.Handlers[0].Match = ""
		return true
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.TTL != 0; p.TTL = 0; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.LockTimeout != 0; p.LockTimeout = 0; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.NanoDurations; p.NanoDurations = false; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := len(p.ReleaseOn) > 0; p.ReleaseOn = nil; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.MaxResponseSize != 0; p.MaxResponseSize = 0; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.KeyJSON != ""; p.KeyJSON = ""; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.InFlight != ""; p.InFlight = ""; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.ReplayHeader != ""; p.ReplayHeader = ""; return r })
	},
	func(c *Config) bool {
		return simplifyPolicy(c, func(p *Policy) bool { r := p.OnUnknownOutcome != ""; p.OnUnknownOutcome = ""; return r })
	},
}

func simplifyPolicy(c *Config, f func(p *Policy) bool) bool {
	changed := false
	for i := range c.Layout.Handlers {
		if f(&c.Layout.Handlers[i]) {
			changed = true
		}
	}
	return changed
}

// caddyRandom is a random number for the default first seed.
func caddyRandom() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}
