//go:build race

package fingerprint

// raceEnabled skips allocation checks under the race detector, whose
// sync.Pool deliberately drops a share of Put items.
const raceEnabled = true
