package postgres

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	pgstore "github.com/caddy-idempotency/caddy-idempotency/storage/postgres"
)

// `caddy idempotency schema`: the backend's own subcommand, for an
// operator who creates the table (create_table false).
func init() { backend.RegisterCommand(schemaCommand) }

func schemaCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schema [--table <name>] [--role <role>]",
		Short: "Prints the PostgreSQL statements that create the table (for create_table false) and grant its use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			table, _ := cmd.Flags().GetString("table")
			role, _ := cmd.Flags().GetString("role")
			statements, err := pgstore.Schema(table)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, s := range statements {
				s = strings.TrimSpace(s)
				if isUpgrade(s) {
					fmt.Fprintln(out, "-- Upgrade: adds a column that tables made by earlier versions lack (nothing to do on a table the statements above made).")
				}
				fmt.Fprintf(out, "%s;\n\n", s)
			}
			if role != "" {
				grant, err := pgstore.Grant(table, role)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "%s;\n", grant)
			}
			return nil
		},
	}
	cmd.Flags().String("table", pgstore.DefaultTable, "the table name, as the table option of storage postgres (may be schema-qualified)")
	cmd.Flags().String("role", "", "the database role Caddy connects as, to grant the table's use to")
	return cmd
}

// isUpgrade reports whether a statement of the schema is there for
// tables made by an earlier version (ALTER TABLE ... ADD COLUMN IF NOT
// EXISTS), rather than to make the table.
func isUpgrade(statement string) bool {
	return strings.HasPrefix(statement, "ALTER TABLE ") && strings.Contains(statement, " ADD COLUMN IF NOT EXISTS ")
}
