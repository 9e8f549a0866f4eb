package main

import "syscall"

// raiseOpenFiles raises the soak's limit of open files (RLIMIT_NOFILE) to
// at least want, its hard limit too when it can (as root): a scale wave
// holds thousands of client and upstream connections in this process.
// The Caddy instances, started after, inherit it. It returns the limit
// in force.
func raiseOpenFiles(want uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= want {
		return l.Cur, nil
	}
	n := syscall.Rlimit{Cur: want, Max: max(l.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
		// Not root: as far as the hard limit goes.
		n = syscall.Rlimit{Cur: l.Max, Max: l.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err2 != nil {
			return l.Cur, err
		}
		return l.Max, err
	}
	return want, nil
}
