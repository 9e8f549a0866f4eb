//go:build unix

package servers

import (
	"errors"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// Account is the user PostgreSQL's programs run as.
type Account struct {
	Name string
	uid  int
	gid  int
	cred *syscall.Credential // nil: the current user
}

// ServerAccount is the current user, or under root (where initdb and
// postgres refuse to run) the postgres system user, else nobody.
func ServerAccount() (*Account, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Getuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return &Account{Name: name, uid: os.Getuid(), gid: os.Getgid()}, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &Account{Name: name, uid: uid, gid: gid,
			cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
	}
	return nil, errors.New("running as root, but there is neither a postgres nor a nobody user for initdb and postgres to run as (they refuse root)")
}
