package placement

import (
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// How the placement check names a site and a route: as the Caddyfile
// wrote them (api.example.com, handle /api/*), not as JSON paths.

// listenSite names a server's site for sites without a host, as the
// Caddyfile writes them: by the ports it listens on (:8080), not by the
// addresses it binds (a site `:8080` with `bind 127.0.0.1` listens on
// 127.0.0.1:8080).
func listenSite(listen []string) string {
	if len(listen) == 0 {
		return "(every host)"
	}
	var ports []string
	for _, l := range listen {
		addr, err := caddy.ParseNetworkAddress(l)
		if err != nil || addr.IsUnixNetwork() || addr.IsFdNetwork() {
			ports = append(ports, l)
			continue
		}
		port := strconv.FormatUint(uint64(addr.StartPort), 10)
		if addr.EndPort != addr.StartPort {
			port += "-" + strconv.FormatUint(uint64(addr.EndPort), 10)
		}
		ports = append(ports, ":"+port)
	}
	slices.Sort(ports)
	return strings.Join(slices.Compact(ports), ", ")
}

// hostSite names a site by its hosts, with the port its server listens
// on when that is neither 80 nor 443 (127.0.0.1:8080).
func hostSite(hosts []string, listen string) string {
	port := ""
	if _, p, err := net.SplitHostPort(listen); err == nil && p != "80" && p != "443" && !strings.Contains(listen, ", ") {
		port = p
	}
	out := make([]string, len(hosts))
	for i, h := range hosts {
		out[i] = h
		if port != "" {
			out[i] = net.JoinHostPort(h, port)
		}
	}
	return strings.Join(out, ", ")
}

// matcherHosts lists the hosts of the host matchers of sets.
func matcherHosts(sets []pMatcherSet) []string {
	var hosts []string
	for _, set := range sets {
		for _, m := range set {
			if m.name != "host" {
				continue
			}
			var hs []string
			if json.Unmarshal(m.value, &hs) == nil {
				hosts = append(hosts, hs...)
			}
		}
	}
	return hosts
}

// describeMatch writes the matchers other than host as a Caddyfile would
// (/api/*, method POST); sets are alternatives.
func describeMatch(sets []pMatcherSet) string {
	var alts []string
	for _, set := range sets {
		var parts []string
		for _, m := range set {
			if m.name == "host" {
				continue
			}
			parts = append(parts, describeMatcher(m))
		}
		if len(parts) > 0 {
			alts = append(alts, strings.Join(parts, " "))
		}
	}
	slices.Sort(alts)
	return strings.Join(slices.Compact(alts), " or ")
}

func describeMatcher(m pMatcher) string {
	var list []string
	if json.Unmarshal(m.value, &list) == nil {
		if m.name == "path" {
			return strings.Join(list, " ")
		}
		return m.name + " " + strings.Join(list, " ")
	}
	var expr string
	if m.name == "expression" && json.Unmarshal(m.value, &expr) == nil {
		// handle_errors 404 502 matches {http.error.status_code} in [404, 502].
		if codes, ok := strings.CutPrefix(expr, "{http.error.status_code} in ["); ok {
			return strings.ReplaceAll(strings.TrimSuffix(codes, "]"), ",", "")
		}
	}
	// The values of the other matchers may be a credential (a header's,
	// a query's, one an expression compares): name the matcher and its
	// fields, never their values.
	switch m.name {
	case "expression":
		return "expression"
	case "not":
		var sets caddyhttp.RawMatcherSets
		if json.Unmarshal(m.value, &sets) == nil {
			return strings.TrimSpace("not " + describeMatch(rawMatcherSets(sets)))
		}
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(m.value, &fields) == nil {
		names := make([]string, 0, len(fields))
		for name := range fields {
			names = append(names, name)
		}
		slices.Sort(names)
		return strings.TrimSpace(m.name + " " + strings.Join(names, " "))
	}
	return m.name
}
