package testutil

import (
	"bytes"
	"testing"

	"github.com/spf13/cobra"
)

// RunCommand runs cmd with args and returns what it printed, output and
// errors together.
func RunCommand(t *testing.T, cmd *cobra.Command, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}
