package fingerprint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// This file checks Differs against an independent comparison of two
// requests: a JSON model built on encoding/json's tokenizer and math/big,
// sharing no code with the canonical encoding.

// jv is a JSON value of the model: nil (null), bool, string,
// modelNumber, []jv (an array) or jobject.
type jv any

// jobject is an object's members sorted by name, members with one name in
// source order.
type jobject []jmember

type jmember struct {
	name  string
	value jv
}

// decodeModel decodes src, reporting false when it is not one JSON value.
func decodeModel(src []byte) (jv, bool) {
	if !json.Valid(src) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return v, true
}

func decodeValue(dec *json.Decoder) (jv, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			arr := []jv{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			_, err := dec.Token()
			return arr, err
		}
		obj := jobject{}
		for dec.More() {
			name, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			obj = append(obj, jmember{name.(string), v})
		}
		slices.SortStableFunc(obj, func(a, b jmember) int { return strings.Compare(a.name, b.name) })
		_, err := dec.Token()
		return obj, err
	case json.Number:
		return modelNumber(tok), nil
	default:
		return tok, nil // nil, bool, string
	}
}

// modelNumber is a JSON number's value, written as its significant digits
// and a power of ten (big, so that no exponent overflows): "0" for any
// zero, 1.50 is "15e-1", -1E+2 is "-1e2".
type modelNumber string

func (n modelNumber) value() string {
	s := string(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(s), "e")
	exp, ok := new(big.Int).SetString(strings.TrimPrefix(expText, "+"), 10)
	if !ok {
		exp = new(big.Int)
	}
	whole, frac, _ := strings.Cut(mant, ".")
	digits := whole + frac
	exp.Sub(exp, big.NewInt(int64(len(frac))))
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + trimmed + "e" + exp.String()
}

func equalModel(a, b jv) bool {
	switch a := a.(type) {
	case modelNumber:
		b, ok := b.(modelNumber)
		return ok && a.value() == b.value()
	case []jv:
		b, ok := b.([]jv)
		return ok && slices.EqualFunc(a, b, equalModel)
	case jobject:
		b, ok := b.(jobject)
		return ok && slices.EqualFunc(a, b, func(x, y jmember) bool { return x.name == y.name && equalModel(x.value, y.value) })
	default:
		return a == b
	}
}

// withoutMembers returns v without the object members at the paths (each a
// list of member names).
func withoutMembers(v jv, paths [][]string) jv {
	obj, ok := v.(jobject)
	if !ok || len(paths) == 0 {
		return v
	}
	out := jobject{}
	for _, m := range obj {
		var below [][]string
		gone := false
		for _, p := range paths {
			if p[0] == m.name {
				if len(p) == 1 {
					gone = true
				} else {
					below = append(below, p[1:])
				}
			}
		}
		if !gone {
			out = append(out, jmember{m.name, withoutMembers(m.value, below)})
		}
	}
	return out
}

// members returns the values of the top-level members of v named name.
func (o jobject) members(name string) []jv {
	var out []jv
	for _, m := range o {
		if m.name == name {
			out = append(out, m.value)
		}
	}
	return out
}

// model is the independent view of one request under one configuration.
type model struct {
	r        request
	declared bool // Content-Type says JSON
	json     jv   // with the ignored members removed; nil unless isJSON
	isJSON   bool
}

type modelConfig struct {
	opts   Options
	ignore [][]string
	// reloaded: the detail was made under other options (headersThen and
	// ignoreThen), so that only bytes can show that bodies differ.
	reloaded    bool
	headersThen []string
	ignoreThen  [][]string
}

func newModel(cfg modelConfig, r request) model {
	m := model{r: r, declared: DeclaresJSON(r.header)}
	// Whether a body can be compared as JSON at all is the canonicaliser's
	// call (it refuses some JSON: lone surrogates, huge exponents, deep
	// nesting); what it means is the model's.
	if v, ok := decodeModel([]byte(r.body)); ok && utf8.ValidString(r.body) {
		if _, err := AppendCanonicalJSON(nil, []byte(r.body)); err == nil {
			m.json, m.isJSON = withoutMembers(v, cfg.ignore), true
		}
	}
	return m
}

// contentTypeClass is a Content-Type as the test's values mean it.
func contentTypeClass(h http.Header) string {
	v, ok := h["Content-Type"]
	if !ok {
		return "absent"
	}
	switch v[0] {
	case "application/json", "Application/JSON; charset=UTF-8", "application/json; charset=utf-8":
		return "json"
	}
	return "as is: " + v[0]
}

// reallyDiffers reports whether the part name of the differs list of a
// retry cur of first really differs between them; why says why not.
func (cfg modelConfig) reallyDiffers(name string, first, cur model) (ok bool, why string) {
	switch {
	case name == "method":
		return first.r.method != cur.r.method, "equal methods"
	case name == "path":
		return first.r.path != cur.r.path, "equal paths"
	case name == "query":
		return first.r.query != cur.r.query, "equal queries"
	case name == "header Content-Type":
		return contentTypeClass(first.r.header) != contentTypeClass(cur.r.header), "equal media types"
	case strings.HasPrefix(name, "header "):
		h := strings.TrimPrefix(name, "header ")
		if !slices.Contains(cfg.opts.Headers, h) && !slices.Contains(cfg.headersThen, h) {
			return false, "a header not fingerprinted"
		}
		a, aok := first.r.header[h]
		b, bok := cur.r.header[h]
		return aok != bok || !slices.Equal(a, b), "equal header values"
	case name == "body":
		if first.r.body == cur.r.body {
			return false, "equal bytes"
		}
		if cfg.reloaded {
			return true, ""
		}
		both := cfg.opts.CanonicalJSON && first.declared && cur.declared && first.isJSON && cur.isJSON
		return !both || !equalModel(first.json, cur.json), "equal JSON, both declared as JSON"
	case strings.HasPrefix(name, "/"):
		tok := unescapeToken.Replace(name[1:])
		if cfg.reloaded && !slices.EqualFunc(cfg.ignore, cfg.ignoreThen, slices.Equal) {
			return false, "a member compared under other options"
		}
		for _, p := range cfg.ignore {
			if len(p) == 1 && p[0] == tok {
				return false, "an ignored member"
			}
		}
		obj, isObj := cur.json.(jobject)
		if !isObj || len(obj.members(tok)) != 1 {
			return false, "a member the retry does not have exactly once"
		}
		fobj, _ := first.json.(jobject)
		switch was := fobj.members(tok); len(was) {
		case 0:
			return true, ""
		case 1:
			return !equalModel(was[0], obj.members(tok)[0]), "an equal member"
		default:
			return false, "a member the first request has twice"
		}
	}
	return false, "an unknown part"
}

// allowed reports whether name may appear in a differs list for cur: the
// name of a part, or of a top-level member of cur's body, never a value.
func (cfg modelConfig) allowed(name string, cur model) bool {
	switch {
	case name == "method", name == "path", name == "query", name == "body", name == "header Content-Type":
		return true
	case strings.HasPrefix(name, "header "):
		h := strings.TrimPrefix(name, "header ")
		return slices.Contains(cfg.opts.Headers, h) || slices.Contains(cfg.headersThen, h)
	case strings.HasPrefix(name, "/"):
		obj, _ := cur.json.(jobject)
		return len(obj.members(unescapeToken.Replace(name[1:]))) > 0
	}
	return false
}

// genRequest makes random requests and retries of them from small pools of
// values, so that equal and unequal parts are both common.
type genRequest struct{ rng *rand.Rand }

var (
	genNames  = []string{"amount", "currency", "note", "sent_at", "a/b", "meta", "m~n"}
	genValues = []string{`10`, `1e1`, `10.0`, `11`, `-0`, `0`, `"EUR"`, `"USD"`, `"E\u0055R"`, `null`, `true`,
		`{"k":1}`, `{"k":1.0}`, `{"k":2}`, `{"k":1,"nonce":"x"}`, `{"nonce":"y","k":1}`, `[1,2]`, `[2,1]`}
	genContentTypes = []string{"application/json", "Application/JSON; charset=UTF-8", "text/plain", "application/merge-patch+json", ""}
)

type genMember struct{ name, value string }

func (g genRequest) pick(list []string) string { return list[g.rng.IntN(len(list))] }

func (g genRequest) members() []genMember {
	var ms []genMember
	for range g.rng.IntN(5) {
		ms = append(ms, genMember{g.pick(genNames), g.pick(genValues)})
	}
	if g.rng.IntN(40) == 0 { // more members than a detail lists
		for i := range maxMemberParts + 1 {
			ms = append(ms, genMember{fmt.Sprintf("f%d", i), "1"})
		}
	}
	return ms
}

// render writes members as an object, in a random order and spacing.
func (g genRequest) render(ms []genMember) string {
	ms = slices.Clone(ms)
	g.rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	var b strings.Builder
	b.WriteString("{")
	for i, m := range ms {
		if i > 0 {
			b.WriteString(g.pick([]string{",", ", ", " ,\n"}))
		}
		name, _ := json.Marshal(m.name)
		b.Write(name)
		b.WriteString(g.pick([]string{":", ": "}))
		b.WriteString(m.value)
	}
	b.WriteString("}")
	return b.String()
}

type genBody struct {
	members []genMember // an object when text is ""
	text    string
}

func (g genRequest) body() genBody {
	switch g.rng.IntN(10) {
	case 0:
		return genBody{text: g.pick([]string{`[1,2]`, `[ 1, 2 ]`, `"s"`, `10`})}
	case 1:
		return genBody{text: g.pick([]string{"amount=10&currency=EUR", `{"amount":`, "", " "})}
	}
	return genBody{members: g.members()}
}

func (g genRequest) text(b genBody) string {
	if b.text != "" || b.members == nil && g.rng.IntN(2) == 0 {
		return b.text
	}
	return g.render(b.members)
}

func (g genRequest) header() http.Header {
	h := http.Header{}
	if ct := g.rng.IntN(len(genContentTypes) + 1); ct < len(genContentTypes) {
		h.Set("Content-Type", genContentTypes[ct])
	}
	if g.rng.IntN(3) > 0 {
		h.Set("X-Tenant", g.pick([]string{"t1", "t2"}))
	}
	return h
}

// pair returns a first request and a retry that differs from it in a few
// random parts (often none, or only in spelling).
func (g genRequest) pair() (request, request) {
	b := g.body()
	first := request{method: "POST", path: "/a", query: "", header: g.header(), body: g.text(b)}
	retry := first
	retry.header = first.header.Clone()
	for range g.rng.IntN(3) {
		switch g.rng.IntN(8) {
		case 0:
			retry.method = g.pick([]string{"POST", "PATCH"})
		case 1:
			retry.path = g.pick([]string{"/a", "/b"})
		case 2:
			retry.query = g.pick([]string{"", "x=1"})
		case 3:
			retry.header = g.header()
		case 4:
			retry.body = g.text(b) // the same members, respelled
		case 5:
			if len(b.members) > 0 {
				ms := slices.Clone(b.members)
				ms[g.rng.IntN(len(ms))].value = g.pick(genValues)
				retry.body = g.render(ms)
			}
		case 6:
			ms := slices.Clone(b.members)
			if len(ms) > 0 && g.rng.IntN(2) == 0 {
				i := g.rng.IntN(len(ms))
				ms = slices.Delete(ms, i, i+1)
			} else {
				ms = append(ms, genMember{g.pick(genNames), g.pick(genValues)})
			}
			retry.body = g.render(ms)
		case 7:
			retry.body = g.text(g.body())
		}
	}
	return first, retry
}

var modelConfigs = []modelConfig{
	{opts: Options{CanonicalJSON: true}},
	{opts: Options{Headers: []string{"Content-Type"}, CanonicalJSON: true}},
	{opts: Options{Headers: []string{"Content-Type", "X-Tenant"}, CanonicalJSON: true}, ignore: [][]string{{"sent_at"}, {"meta", "nonce"}}},
	{opts: Options{Headers: []string{"X-Tenant"}}},
	{opts: Options{Headers: []string{"Content-Type"}}},
}

func (cfg modelConfig) fingerprinter(t testing.TB) *Fingerprinter {
	o := cfg.opts
	for _, p := range cfg.ignore {
		var s strings.Builder
		for _, tok := range p {
			s.WriteString("/" + tok)
		}
		o.Ignore = append(o.Ignore, mustPointers(t, s.String())...)
	}
	f, err := NewFingerprinter(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// checkDiffers checks one answer of Differs: it names only parts that
// really differ, each once, by name only.
func (cfg modelConfig) checkDiffers(t testing.TB, what string, first, retry request, got []string) {
	t.Helper()
	fm, cm := newModel(cfg, first), newModel(cfg, retry)
	seen := map[string]bool{}
	for _, name := range got {
		if seen[name] {
			t.Errorf("%s: %q named twice in %q\nfirst %+v\nretry %+v", what, name, got, first, retry)
		}
		seen[name] = true
		if !cfg.allowed(name, cm) {
			t.Errorf("%s: %q is not a part or a member of the retry: %q\nfirst %+v\nretry %+v", what, name, got, first, retry)
			continue
		}
		if ok, why := cfg.reallyDiffers(name, fm, cm); !ok {
			t.Errorf("%s (%+v): differs %q names %q: %s\nfirst %+v\nretry %+v", what, cfg.opts, got, name, why, first, retry)
		}
	}
}

// TestDiffersNamesOnlyWhatReallyDiffers: for random pairs of requests,
// under several configurations, every name Differs gives really differs
// (per the model above), is a part or a member of the retry (never a
// value), and the list is empty exactly when the fingerprints are equal.
// Details written by versions 1 and 2 give sound answers too, version 2's
// the same as version 3's.
func TestDiffersNamesOnlyWhatReallyDiffers(t *testing.T) {
	g := genRequest{rand.New(rand.NewPCG(7, 11))}
	n := 4000
	if testing.Short() {
		n = 500
	}
	for _, cfg := range modelConfigs {
		f := cfg.fingerprinter(t)
		for range n {
			first, retry := g.pair()
			detail := f.Detail(first.method, first.path, first.query, first.header, []byte(first.body))
			got, ok := f.Differs(detail, retry.method, retry.path, retry.query, retry.header, []byte(retry.body))
			if !ok {
				t.Fatal("Differs could not read the detail it made")
			}
			cfg.checkDiffers(t, "detail", first, retry, got)
			if same := bytes.Equal(first.sum(f), retry.sum(f)); same != (len(got) == 0) {
				t.Errorf("equal fingerprints %v, yet differs %q\nfirst %+v\nretry %+v", same, got, first, retry)
			}

			// A detail of version 2 (SHA-256 digests) reads as version 3's.
			v2 := f.detail(detailVersionV2, first.method, first.path, first.query, first.header, []byte(first.body), nil)
			if v2[0] != detailVersionV2 || detail[0] != detailVersion {
				t.Fatalf("details of versions %d and %d, want %d and %d", v2[0], detail[0], detailVersionV2, detailVersion)
			}
			gotV2, ok := f.Differs(v2, retry.method, retry.path, retry.query, retry.header, []byte(retry.body))
			if !ok || !slices.Equal(gotV2, got) {
				t.Fatalf("a version 2 detail: differs %q (read %v), version 3's %q\nfirst %+v\nretry %+v", gotV2, ok, got, first, retry)
			}

			var salt [saltSize]byte
			binary := rand.Uint64()
			for i := range salt {
				salt[i] = byte(binary >> (i % 8 * 8))
			}
			old := detailV1(f, salt, first.method, first.path, first.query, first.header, []byte(first.body))
			got, ok = f.Differs(old, retry.method, retry.path, retry.query, retry.header, []byte(retry.body))
			if !ok {
				t.Fatal("Differs could not read a detail of the first version")
			}
			cfg.checkDiffers(t, "first version's detail", first, retry, got)
			if t.Failed() {
				return
			}
		}
	}
}

// TestDiffersAfterAReloadNamesOnlyWhatReallyDiffers: a detail made under
// other fingerprint options (a config reload between a request and its
// retry) still gives only names that really differ.
func TestDiffersAfterAReloadNamesOnlyWhatReallyDiffers(t *testing.T) {
	g := genRequest{rand.New(rand.NewPCG(13, 17))}
	n := 300
	if testing.Short() {
		n = 50
	}
	for _, then := range modelConfigs {
		fThen := then.fingerprinter(t)
		for _, now := range modelConfigs {
			f := now.fingerprinter(t)
			cfg := now
			cfg.reloaded, cfg.headersThen, cfg.ignoreThen = true, then.opts.Headers, then.ignore
			for range n {
				first, retry := g.pair()
				detail := fThen.Detail(first.method, first.path, first.query, first.header, []byte(first.body))
				got, ok := f.Differs(detail, retry.method, retry.path, retry.query, retry.header, []byte(retry.body))
				if !ok {
					t.Fatal("Differs could not read the detail")
				}
				cfg.checkDiffers(t, "reloaded", first, retry, got)
				if t.Failed() {
					return
				}
			}
		}
	}
}
