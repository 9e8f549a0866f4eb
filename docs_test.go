package idempotency_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-idempotency/caddy-idempotency"
)

// The documentation is tested like code: every Caddyfile and JSON snippet
// in README.md and docs/*.md must be what Caddy accepts, every test a page
// cites as proof must exist, and the README must stay short.

// docReadmeMaxLines bounds README.md: the full reference lives in docs/.
const docReadmeMaxLines = 250

// docFence is one fenced code block of a Markdown file.
type docFence struct {
	file string
	line int    // of the opening fence
	lang string // the first word of the info string
	body string
}

// docPages returns README.md and every docs/*.md.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, pages...)
}

// docFences returns the fenced code blocks of the Markdown file.
func docFences(t *testing.T, file string) []docFence {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docFence
	var cur *docFence
	var marker string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			marker = line[:len(line)-len(trimmed)] + "```"
			info := strings.Fields(strings.TrimPrefix(trimmed, "```"))
			cur = &docFence{file: file, line: n}
			if len(info) > 0 {
				cur.lang = info[0]
			}
		case cur != nil && strings.TrimSpace(line) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			// Blocks inside list items are indented like their fence.
			cur.body += strings.TrimPrefix(line, marker[:len(marker)-3]) + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: unterminated code block", file, cur.line)
	}
	return out
}

// docSnippets returns the fences of every page in language lang.
func docSnippets(t *testing.T, lang string) []docFence {
	t.Helper()
	var out []docFence
	for _, page := range docPages(t) {
		for _, f := range docFences(t, page) {
			if f.lang == lang {
				out = append(out, f)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s snippets found", lang)
	}
	return out
}

// docFirstToken is the first token of a Caddyfile snippet, comments and
// blank lines skipped.
func docFirstToken(body string) string {
	for line := range strings.SplitSeq(body, "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && !strings.HasPrefix(fields[0], "#") {
			return fields[0]
		}
	}
	return ""
}

// docIndent indents every non-empty line of s with a tab.
func docIndent(s string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimRight(s, "\n"), "\n") {
		if line != "" {
			b.WriteString("\t")
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

var docDirectiveName = regexp.MustCompile(`^(@\S*|[a-z_]+)$`)

// docCaddyfile turns a snippet into a whole Caddyfile: a complete one
// (global options, site blocks) as it is; directives into a site block;
// a storage block into an idempotency directive in a site block.
func docCaddyfile(body string) string {
	first := docFirstToken(body)
	switch {
	case first == "storage":
		return ":8080 {\n" + docIndent("idempotency {\n"+docIndent(body)+"}\n") + "}\n"
	case first != "localhost" && docDirectiveName.MatchString(first):
		return ":8080 {\n" + docIndent(body) + "}\n"
	}
	return body
}

// TestDocCaddyfileSnippetsAreFormattedAndAdapt checks every ```caddyfile
// block: `caddy fmt` leaves it unchanged, and the Caddyfile adapter takes
// it without errors or warnings.
func TestDocCaddyfileSnippetsAreFormattedAndAdapt(t *testing.T) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, f := range docSnippets(t, "caddyfile") {
		if formatted := string(caddyfile.Format([]byte(f.body))); formatted != f.body {
			t.Errorf("%s:%d: caddy fmt changes this snippet:\n%s\nto:\n%s", f.file, f.line, f.body, formatted)
			continue
		}
		input := docCaddyfile(f.body)
		_, warnings, err := adapter.Adapt([]byte(input), map[string]any{"filename": f.file})
		if err != nil {
			t.Errorf("%s:%d: adapting:\n%s\n%v", f.file, f.line, input, err)
			continue
		}
		for _, w := range warnings {
			if strings.Contains(w.Message, "not formatted") {
				continue // the snippet itself is checked above; a wrapped one is indented the same way
			}
			t.Errorf("%s:%d: adapt warning: %s", f.file, f.line, w.Message)
		}
	}
}

// docDurationFields are the JSON fields holding durations: the pages
// write them as strings ("30s"), never as nanoseconds.
var docDurationFields = []string{"ttl", "lock_timeout", "wait_timeout", "timeout", "dial_timeout", "cleanup_interval"}

// docNanoseconds reports the duration fields of v given as numbers.
func docNanoseconds(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			if _, isNumber := sub.(float64); isNumber && slices.Contains(docDurationFields, k) {
				out = append(out, k)
			}
			out = append(out, docNanoseconds(sub)...)
		}
	case []any:
		for _, sub := range v {
			out = append(out, docNanoseconds(sub)...)
		}
	}
	return out
}

// docCaddyConfig wraps a snippet into a whole Caddy config: a handler, a
// storage object, or the handler's fields alone become the one handler of
// a server's route. ok is false for JSON that is no config (an admin API
// answer, a log line).
func docCaddyConfig(v map[string]any) (config map[string]any, ok bool) {
	handler := v
	switch {
	case v["msg"] != nil:
		return nil, false // a log line
	case v["apps"] != nil:
		return v, true
	case v["handler"] != nil:
	case v["backend"] != nil:
		handler = map[string]any{"handler": "idempotency", "storage": v}
	case v["storage"] != nil:
		handler = map[string]any{"handler": "idempotency"}
		for k, sub := range v {
			handler[k] = sub
		}
	default:
		return nil, false
	}
	return map[string]any{
		"admin": map[string]any{"disabled": true},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"srv0": map[string]any{
			"listen": []any{"127.0.0.1:0"},
			"routes": []any{map[string]any{"handle": []any{handler}}},
		}}}},
	}, true
}

// Host names in store addresses: in a URL (after the scheme and any
// user), a keyword DSN's host= (and its port=), or a bare host:port.
var (
	docURLHost  = regexp.MustCompile(`^([a-z]+://(?:[^@/]*@)?)(\[[^\]]*\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:[0-9]+)?`)
	docKeyHost  = regexp.MustCompile(`\b(host|port)=[^ ]+`)
	docBareHost = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9.-]*:[0-9]+$`)
)

// docLoopback points the store addresses of a config (url, dsn,
// addresses) at a closed loopback port. The docs name hosts as a reader's
// network would; the check is of the configuration, not the network, and
// a test looks up no name (testutil.Main), while validating would start
// the store's ping.
func docLoopback(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			switch k {
			case "url", "dsn", "addresses":
				v[k] = docLoopbackAddr(x)
			default:
				v[k] = docLoopback(x)
			}
		}
	case []any:
		for i, x := range v {
			v[i] = docLoopback(x)
		}
	}
	return v
}

func docLoopbackAddr(v any) any {
	switch v := v.(type) {
	case string:
		if strings.HasPrefix(v, "{") {
			return v // a placeholder: resolved at provisioning, to nothing here
		}
		switch {
		case strings.Contains(v, "://"):
			return docURLHost.ReplaceAllString(v, "${1}127.0.0.1:9")
		case strings.Contains(v, "host="):
			return docKeyHost.ReplaceAllStringFunc(v, func(kv string) string {
				if strings.HasPrefix(kv, "host=") {
					return "host=127.0.0.1"
				}
				return "port=9"
			})
		case docBareHost.MatchString(v):
			return "127.0.0.1:9"
		}
	case []any:
		for i, x := range v {
			v[i] = docLoopbackAddr(x)
		}
	}
	return v
}

// TestDocJSONSnippetsValidate checks every ```json block: it is JSON, its
// durations are strings, and when it is a config (a handler, its storage,
// or a whole config) Caddy validates it in this process.
func TestDocJSONSnippetsValidate(t *testing.T) {
	configs := 0
	for _, f := range docSnippets(t, "json") {
		var v any
		if err := json.Unmarshal([]byte(f.body), &v); err != nil {
			t.Errorf("%s:%d: not JSON: %v", f.file, f.line, err)
			continue
		}
		if ns := docNanoseconds(v); len(ns) > 0 {
			t.Errorf("%s:%d: durations written as nanoseconds (write \"30s\"): %v", f.file, f.line, ns)
		}
		obj, isObject := v.(map[string]any)
		if !isObject {
			continue
		}
		cfg, ok := docCaddyConfig(obj)
		if !ok {
			continue
		}
		configs++
		raw, err := json.Marshal(docLoopback(cfg))
		if err != nil {
			t.Fatal(err)
		}
		var config caddy.Config
		if err := json.Unmarshal(raw, &config); err != nil {
			t.Errorf("%s:%d: %v", f.file, f.line, err)
			continue
		}
		if err := caddy.Validate(&config); err != nil {
			t.Errorf("%s:%d: caddy.Validate: %v\n%s", f.file, f.line, err, raw)
		}
	}
	if configs == 0 {
		t.Fatal("no JSON config snippet found")
	}
}

// docTestDefinitions maps each Test, Fuzz and Benchmark function of the
// repository to the test files that define it.
func docTestDefinitions(t *testing.T) map[string][]string {
	t.Helper()
	def := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)\(`)
	defs := make(map[string][]string)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range def.FindAllSubmatch(src, -1) {
			defs[string(m[1])] = append(defs[string(m[1])], filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defs
}

// docCitation matches a cited test (`TestName` or `TestName/sub/path`)
// or a parenthesised repository path, which names where the tests cited
// since the previous path (in the same table row, paragraph or list item)
// are: "(e2e/crash_test.go)", "(storage/redis; ...)".
var docCitation = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)(/[^`]*)?`|\\(((?:[a-z0-9_]+/)*[a-z0-9_]+(?:\\.go)?/?)[;:,)]")

// TestDocsCiteTestsThatExist checks that every test the pages cite is a
// function in the repository's test files (a subtest path needs its
// top-level function), and that it is in the file or directory named in
// parentheses after it, when one is.
func TestDocsCiteTestsThatExist(t *testing.T) {
	defs := docTestDefinitions(t)
	cited := 0
	for _, page := range append(docPages(t), "CONTRIBUTING.md") {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		type pending struct{ name, line string }
		var since []pending
		for n, line := range strings.Split(string(text), "\n") {
			where := page + ":" + strconv.Itoa(n+1)
			// A path names the tests cited before it in the same table row,
			// paragraph or list item.
			if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "|") || strings.HasPrefix(trimmed, "- ") {
				since = nil
			}
			for _, m := range docCitation.FindAllStringSubmatch(line, -1) {
				if name := m[1]; name != "" {
					cited++
					if defs[name] == nil {
						t.Errorf("%s: cites %s%s, but no test file defines func %s", where, name, m[2], name)
						continue
					}
					since = append(since, pending{name, where})
					continue
				}
				path := strings.TrimSuffix(m[3], "/")
				if _, err := os.Stat(path); err != nil {
					continue // prose in parentheses, not a path
				}
				for _, p := range since {
					if !slices.ContainsFunc(defs[p.name], func(file string) bool {
						return file == path || strings.HasPrefix(file, path+"/")
					}) {
						t.Errorf("%s: cites %s in %s, but it is defined in %v", p.line, p.name, path, defs[p.name])
					}
				}
				since = nil
			}
		}
	}
	if cited == 0 {
		t.Fatal("no test citations found")
	}
}

// TestReadmeIsShort keeps README.md to an overview; the reference is in
// docs/.
func TestReadmeIsShort(t *testing.T) {
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(text, []byte("\n")); n > docReadmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d", n, docReadmeMaxLines)
	}
}

// docLink matches a relative Markdown link target: [text](path#anchor).
var docLink = regexp.MustCompile(`\]\(([^)#:\s]+)(#[^)\s]*)?\)`)

// docSamePageLink matches a link to a heading of the same page: [text](#anchor).
var docSamePageLink = regexp.MustCompile(`\]\((#[^)\s]+)\)`)

// docAnchors returns the anchors GitHub gives the headings of a Markdown
// file: lower case, punctuation other than - and _ dropped, spaces as -.
func docAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	anchors := make(map[string]bool)
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	inFence := false
	for line := range strings.SplitSeq(string(text), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		anchors["#"+b.String()] = true
	}
	return anchors
}

// TestDocLinksPointToFiles checks that relative links in the pages point
// to files of the repository, and anchors to headings of their page.
func TestDocLinksPointToFiles(t *testing.T) {
	for _, page := range append(docPages(t), "CONTRIBUTING.md", "xcaddy.md", "CHANGELOG.md") {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docLink.FindAllStringSubmatch(string(text), -1) {
			target := filepath.Join(filepath.Dir(page), m[1])
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link to %s: %v", page, m[1], err)
				continue
			}
			if m[2] != "" && strings.HasSuffix(target, ".md") && !docAnchors(t, target)[m[2]] {
				t.Errorf("%s: link to %s%s: no such heading", page, m[1], m[2])
			}
		}
		for _, m := range docSamePageLink.FindAllStringSubmatch(string(text), -1) {
			if !docAnchors(t, page)[m[1]] {
				t.Errorf("%s: link to %s: no such heading", page, m[1])
			}
		}
	}
}

// docTreeEntry matches an entry of the layout tree in CONTRIBUTING.md:
// "├── handler.go   the request flow ...".
var docTreeEntry = regexp.MustCompile(`(?m)^[│ ]*[├└]── (\S+)`)

// TestDocContributingLayoutMatchesTheRepository checks the layout tree of
// CONTRIBUTING.md against the files: every root .go file that is not a
// test, and every top-level directory, is listed, and every path listed
// exists.
func TestDocContributingLayoutMatchesTheRepository(t *testing.T) {
	text, err := os.ReadFile("CONTRIBUTING.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := make(map[string]bool)
	var parents []string // the directory of each nesting level
	for _, line := range strings.Split(string(text), "\n") {
		m := docTreeEntry.FindStringSubmatchIndex(line)
		if m == nil {
			continue
		}
		depth := strings.Count(line[:m[2]], "│") + strings.Count(line[:m[2]], "    ")
		name := strings.TrimSuffix(strings.TrimSuffix(line[m[2]:m[3]], ","), "/")
		parents = append(parents[:min(depth, len(parents))], name)
		full := strings.Join(parents, "/")
		for dir := full; dir != "."; dir = filepath.Dir(dir) {
			listed[dir] = true // "cmd/caddy/" lists cmd too
		}
		if strings.ContainsAny(name, "*") {
			continue
		}
		if _, err := os.Stat(full); err != nil {
			t.Errorf("CONTRIBUTING.md lists %s: %v", full, err)
		}
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	ignored := docIgnoredDirs(t)
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.IsDir() && (name == ".git" || strings.HasPrefix(name, ".") && name != ".ci" || ignored[name]):
		case e.IsDir() && !listed[name]:
			t.Errorf("CONTRIBUTING.md's layout lacks the directory %s/", name)
		case !e.IsDir() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") && !listed[name]:
			t.Errorf("CONTRIBUTING.md's layout lacks %s", name)
		}
	}
}

// docIgnoredDirs returns the top-level directories .gitignore ignores
// ("/bin/"): build output, which is not part of the layout.
func docIgnoredDirs(t *testing.T) map[string]bool {
	text, err := os.ReadFile(".gitignore")
	if err != nil {
		t.Fatal(err)
	}
	dirs := make(map[string]bool)
	for _, line := range strings.Split(string(text), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "/"); ok && strings.HasSuffix(name, "/") {
			dirs[strings.TrimSuffix(name, "/")] = true
		}
	}
	return dirs
}

// TestDocExampleCaddyfilesAreFormattedAndAdapt checks the runnable
// examples as the snippets are checked.
func TestDocExampleCaddyfilesAreFormattedAndAdapt(t *testing.T) {
	examples, err := filepath.Glob("Caddyfile*.example")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no Caddyfile examples: %v", err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, file := range examples {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(caddyfile.Format(text), text) {
			t.Errorf("%s: caddy fmt changes it", file)
		}
		js, warnings, err := adapter.Adapt(text, map[string]any{"filename": file})
		if err != nil {
			t.Errorf("%s: adapting: %v", file, err)
		}
		for _, w := range warnings {
			t.Errorf("%s:%d: adapt warning: %s", file, w.Line, w.Message)
		}
		// A demo listens on this machine only: every server binds a
		// loopback address.
		var cfg struct {
			Apps struct {
				HTTP struct {
					Servers map[string]struct {
						Listen []string `json:"listen"`
					} `json:"servers"`
				} `json:"http"`
			} `json:"apps"`
		}
		if err := json.Unmarshal(js, &cfg); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for name, srv := range cfg.Apps.HTTP.Servers {
			for _, l := range srv.Listen {
				addr, err := caddy.ParseNetworkAddress(l)
				if ip := net.ParseIP(addr.Host); err != nil || ip == nil || !ip.IsLoopback() {
					t.Errorf("%s: server %s listens on %q, want a loopback address (bind 127.0.0.1)", file, name, l)
				}
			}
		}
	}
}

// codeDocCitation matches a Markdown file named in a Go comment:
// "docs/guarantees.md", "CONTRIBUTING.md".
var codeDocCitation = regexp.MustCompile(`(?:^|[\s(\x60])((?:[\w.-]+/)*[\w.-]+\.md)\b`)

// TestCodeCommentsCiteDocsThatExist checks that every Markdown page a
// comment in the Go code names is a file of the repository (relative to
// the root or to the commenting file): comments once cited a design
// document that never was in it.
func TestCodeCommentsCiteDocsThatExist(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			_, comment, ok := strings.Cut(line, "//")
			if !ok {
				continue
			}
			for _, m := range codeDocCitation.FindAllStringSubmatch(comment, -1) {
				cited := m[1]
				if _, err := os.Stat(cited); err == nil {
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(path), cited)); err == nil {
					continue
				}
				t.Errorf("%s:%d cites %s, which is not in the repository", path, i+1, cited)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
