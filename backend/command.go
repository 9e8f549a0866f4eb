package backend

import (
	"sync"

	"github.com/spf13/cobra"
)

// The subcommands of `caddy idempotency` that backends provide (storage
// postgres: schema), registered from the backend's init so that the
// host never imports a backend's store for them.
var commands struct {
	mu   sync.Mutex
	list []func() *cobra.Command
}

// RegisterCommand adds a subcommand of `caddy idempotency`, made by
// command; call it from the backend package's init.
func RegisterCommand(command func() *cobra.Command) {
	commands.mu.Lock()
	defer commands.mu.Unlock()
	commands.list = append(commands.list, command)
}

// Commands makes the subcommands the backends registered, in the order
// they registered.
func Commands() []*cobra.Command {
	commands.mu.Lock()
	defer commands.mu.Unlock()
	out := make([]*cobra.Command, 0, len(commands.list))
	for _, c := range commands.list {
		out = append(out, c())
	}
	return out
}
