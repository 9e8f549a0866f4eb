package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-idempotency/caddy-idempotency/backend"
	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// The `caddy idempotency` command: what an operator otherwise does with
// shell recipes (the hashes the logs show, the PostgreSQL DDL) or curl
// (the admin API).
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "idempotency",
		Usage: "hash|schema|get|delete|list|release [flags]",
		Short: "Hashes idempotency keys, prints the PostgreSQL schema, shows and deletes records",
		Long: `
Tools for the idempotency handler (http.handlers.idempotency).

hash      the scope_hash and key_hash that the logs and the admin API use,
          of a key and a client's scope (the values of the scope
          template's placeholders, or the scope hash itself)
schema    the PostgreSQL DDL and GRANT for a table name
get       a record, from a running Caddy's admin API
delete    a record, through a running Caddy's admin API (the key runs
          again on its next request)
list      the records in flight (or, with --outcome-unknown, those whose
          outcome is unknown), per store, a page at a time
release   the outcome-unknown record of a key, through a running Caddy's
          admin API, once the operation is reconciled (the key runs again
          on its next request); never a record in flight or a response

See docs/operations.md of the module.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.AddCommand(hashCommand(), recordCommand("get"), recordCommand("delete"), listCommand(), releaseCommand())
			// The backends' own (storage postgres: schema).
			cmd.AddCommand(backend.Commands()...)
		},
	})
}

// keyFlags adds the flags that name a record: a key and its scope, or a
// key hash as logged.
func keyFlags(cmd *cobra.Command, withKeyHash bool) {
	cmd.Flags().String("key", "", "the idempotency key")
	cmd.Flags().StringArray("scope", nil, "a value of the scope template's placeholders, in order (repeat); with the default template, the host (without port), then the Authorization value")
	cmd.Flags().String("scope-template", "", "the handler's scope template, when not the default")
	cmd.Flags().String("scope-hash", "", "the scope hash (64 hex digits), instead of --scope")
	if withKeyHash {
		cmd.Flags().String("key-hash", "", "the key_hash of the logs (16 hex digits), instead of --key and its scope")
	}
}

func hashCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hash --key <key> (--scope <value>... [--scope-template <template>] | --scope-hash <hex>)",
		Short: "Prints the scope_hash and key_hash of a key and a client's scope",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := keyFromFlags(cmd)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "scope_hash %s\nkey_hash %s\n", key.Scope, key.Hash())
			return err
		},
	}
	keyFlags(cmd, false)
	return cmd
}

// keyFromFlags is the storage key the flags name, as the handler and the
// admin API compute it.
func keyFromFlags(cmd *cobra.Command) (storage.Key, error) {
	f := cmd.Flags()
	id, _ := f.GetString("key")
	scope, _ := f.GetStringArray("scope")
	template, _ := f.GetString("scope-template")
	scopeHash, _ := f.GetString("scope-hash")
	if id == "" {
		return storage.Key{}, fmt.Errorf("--key is required")
	}
	key, err := adminKey(id, scope, template, scopeHash, len(scope) > 0 || template != "")
	if err != nil {
		return storage.Key{}, flagWords(err)
	}
	for _, w := range hostWithPort(template, scope) {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
	}
	return key, nil
}

// hostWithPort warns of the values of scope that the template (the
// default one when "") puts in {http.request.host} and that look like
// host:port: that placeholder is the host without its port, so such a
// scope is no client's, and its hashes find no record.
func hostWithPort(template string, values []string) []string {
	if template == "" {
		template = defaultScope
	}
	t, err := newScopeTemplate(template)
	if err != nil {
		return nil
	}
	if template == defaultScope && len(values) == 1 {
		if host, auth, ok := strings.Cut(values[0], " "); ok {
			values = []string{host, auth}
		}
	}
	if len(values) != len(t.keys) {
		return nil
	}
	var warnings []string
	for i, k := range t.keys {
		if k != "http.request.host" && k != "host" {
			continue
		}
		host, port, err := net.SplitHostPort(values[i])
		if err != nil || port == "" || strings.Trim(port, "0123456789") != "" {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("--scope %q looks like host:port, but {%s} is the host without its port "+
			"(%q for a request to %s): these hashes match no request", values[i], k, host, values[i]))
	}
	return warnings
}

// flagWords puts the admin API's parameter names of err in the command's
// flag names.
func flagWords(err error) error {
	r := strings.NewReplacer("the scope or scope_hash query parameter is required with key", "--scope or --scope-hash is required with --key",
		"scope_template", "--scope-template", "scope_hash", "--scope-hash", "key_hash", "--key-hash",
		"give scope", "give --scope", "key with scope", "--key with --scope")
	return fmt.Errorf("%s", r.Replace(err.Error()))
}

// recordCommand is get or delete: one request to the admin API's
// /idempotency/keys endpoint of a running Caddy.
func recordCommand(verb string) *cobra.Command {
	method, short := http.MethodGet, "Shows the record of a key, from a running Caddy's admin API"
	if verb == "delete" {
		method, short = http.MethodDelete, "Deletes the record of a key through a running Caddy's admin API, so that its next request runs"
	}
	cmd := &cobra.Command{
		Use:   verb + " (--key-hash <hex> | --key <key> (--scope <value>... | --scope-hash <hex>)) [--store <id>] [--address <admin> | --config <file>]",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := recordQuery(cmd)
			if err != nil {
				return err
			}
			if body, _ := cmd.Flags().GetBool("body"); body && verb == "get" {
				q.Set("body", "true")
			}
			return callAdminAPI(cmd, method, "/idempotency/keys?"+q.Encode())
		},
	}
	keyFlags(cmd, true)
	cmd.Flags().String("store", "", "the store's id, as GET /idempotency/stores lists it (default: every store)")
	adminFlags(cmd)
	if verb == "get" {
		cmd.Flags().Bool("body", false, "include the recorded body (base64)")
	}
	return cmd
}

// recordQuery is the admin API's query for the record the flags name.
func recordQuery(cmd *cobra.Command) (url.Values, error) {
	f := cmd.Flags()
	q := url.Values{}
	if store, _ := f.GetString("store"); store != "" {
		q.Set("store", store)
	}
	if kh, _ := f.GetString("key-hash"); kh != "" {
		// As the admin API refuses key_hash with any of these.
		for _, other := range []string{"key", "scope", "scope-template", "scope-hash"} {
			if f.Changed(other) {
				return nil, fmt.Errorf("give --key-hash alone, or --key with --scope or --scope-hash")
			}
		}
		q.Set("key_hash", kh)
		return q, nil
	}
	key, err := keyFromFlags(cmd)
	if err != nil {
		return nil, err
	}
	// The scope as its hash: the admin API takes it as it takes scope
	// values, and the values need not leave this machine.
	q.Set("key", key.ID)
	q.Set("scope_hash", key.Scope)
	return q, nil
}

func listCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [--outcome-unknown] [--store <id>] [--after <key_hash>] [--limit <n>] [--address <admin> | --config <file>]",
		Short: "Lists the records in flight, or those whose outcome is unknown, per store, a page at a time, from a running Caddy's admin API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			q := url.Values{}
			for flag, param := range map[string]string{"store": "store", "after": "after", "limit": "limit"} {
				if v, _ := f.GetString(flag); v != "" {
					q.Set(param, v)
				}
			}
			endpoint := "/idempotency/in_flight?"
			if unknown, _ := f.GetBool("outcome-unknown"); unknown {
				endpoint = "/idempotency/outcome_unknown?"
			}
			return callAdminAPI(cmd, http.MethodGet, endpoint+q.Encode())
		},
	}
	cmd.Flags().Bool("outcome-unknown", false, "list the records whose outcome is unknown instead of those in flight")
	cmd.Flags().String("store", "", "the store's id (default: every store, a first page each)")
	cmd.Flags().String("after", "", "the next member of the previous page (needs --store)")
	cmd.Flags().String("limit", "", "the most records per store (default 100, at most 1000)")
	adminFlags(cmd)
	return cmd
}

// releaseCommand frees the key of an outcome-unknown record: one request
// to the admin API's DELETE /idempotency/outcome_unknown of a running
// Caddy, by the key hash (computed here from --key and its scope when
// given so).
func releaseCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release (--key-hash <hex> | --key <key> (--scope <value>... | --scope-hash <hex>)) [--store <id>] [--address <admin> | --config <file>]",
		Short: "Releases the key of an outcome-unknown record through a running Caddy's admin API, so that its next request runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := recordQuery(cmd)
			if err != nil {
				return err
			}
			if q.Has("key") {
				q.Set("key_hash", storage.Key{Scope: q.Get("scope_hash"), ID: q.Get("key")}.Hash())
				q.Del("key")
				q.Del("scope_hash")
			}
			return callAdminAPI(cmd, http.MethodDelete, "/idempotency/outcome_unknown?"+q.Encode())
		},
	}
	keyFlags(cmd, true)
	cmd.Flags().String("store", "", "the store's id, as GET /idempotency/stores lists it (default: every store)")
	adminFlags(cmd)
	return cmd
}

// adminFlags adds the flags that find the admin API of a running Caddy,
// as caddy reload and caddy stop have them.
func adminFlags(cmd *cobra.Command) {
	cmd.Flags().String("address", "", "the admin API's address (default: the one --config gives, else Caddy's, localhost:2019)")
	cmd.Flags().StringP("config", "c", "", "the running Caddy's config file, to take the admin API's address from (as caddy reload does)")
	cmd.Flags().StringP("adapter", "a", "", "the adapter of --config (default: caddyfile for a file named Caddyfile*, else JSON)")
}

// callAdminAPI sends method to path of the admin API that the flags name,
// and prints its JSON answer indented. An error status is the admin
// API's error.
func callAdminAPI(cmd *cobra.Command, method, path string) error {
	f := cmd.Flags()
	address, _ := f.GetString("address")
	config, _ := f.GetString("config")
	adapter, _ := f.GetString("adapter")
	// As caddy reload and caddy stop: --address, else the admin address
	// of --config (adapted), else Caddy's default.
	address, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return fmt.Errorf("couldn't determine the admin API's address: %v", err)
	}
	resp, err := caddycmd.AdminAPIRequest(address, method, path, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	var indented bytes.Buffer
	if json.Indent(&indented, bytes.TrimSpace(body), "", "  ") != nil {
		_, err = out.Write(body) // not JSON: as it came
		return err
	}
	indented.WriteByte('\n')
	_, err = indented.WriteTo(out)
	return err
}
