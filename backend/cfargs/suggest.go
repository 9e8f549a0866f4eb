package cfargs

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// Unknown is the error of an option that the block what names
// ("idempotency", "redis storage") does not have, at the option's line;
// known are the block's options, the nearest of which it suggests (see
// Suggest).
func Unknown(d *caddyfile.Dispenser, what, opt string, known []string) error {
	return d.Errf("unrecognized %s option '%s'%s", what, opt, DidYouMean(opt, known))
}

// DidYouMean is " (did you mean 'x'?)" for the suggestion of word among
// known, "" when there is none.
func DidYouMean(word string, known []string) string {
	if s := Suggest(word, known); s != "" {
		return fmt.Sprintf(" (did you mean '%s'?)", s)
	}
	return ""
}

// Suggest returns the word of known nearest to word, when it is near
// enough to be what was meant: a distance (edits, a swap of neighbours
// counting one, case ignored) of at most 1 for words of up to 4 letters,
// 2 up to 8, 3 beyond. "" when none is, or two are equally near.
func Suggest(word string, known []string) string {
	limit := 3
	switch n := len(word); {
	case n <= 4:
		limit = 1
	case n <= 8:
		limit = 2
	}
	best, bestDist, tie := "", limit+1, false
	w := strings.ToLower(word)
	for _, k := range known {
		d := distance(w, strings.ToLower(k))
		switch {
		case d < bestDist:
			best, bestDist, tie = k, d, false
		case d == bestDist && k != best:
			tie = true
		}
	}
	if tie || best == word {
		return ""
	}
	return best
}

// distance is the optimal string alignment distance of a and b: the
// least insertions, deletions, substitutions and swaps of neighbouring
// bytes that make one the other.
func distance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// ParseDuration parses s, the value of opt, as a Caddy duration ("30s",
// "1d"). Its error says what is wrong in the Caddyfile's words: a number
// without a unit (ttl 30) gets the example 30s.
func ParseDuration(opt, s string) (time.Duration, error) {
	dur, err := caddy.ParseDuration(s)
	if err == nil {
		return dur, nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return 0, fmt.Errorf("%s: invalid duration '%s': a duration needs a unit, such as %ss (units: ns, us, ms, s, m, h, d)", opt, s, s)
	}
	return 0, fmt.Errorf("%s: invalid duration '%s': %v (write a number and a unit, such as 30s, 5m, 24h or 2d)", opt, s, err)
}
