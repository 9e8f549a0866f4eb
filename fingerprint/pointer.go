package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrDuplicateMember is the error of Pointer.Lookup when an object on the
// pointer's path gives the member the pointer goes through more than once,
// as in {"id":"a","id":"b"}: parsers disagree on which one counts (the
// first, the last, or neither), so the value is ambiguous.
var ErrDuplicateMember = errors.New("the JSON body names a member twice")

// Pointer is an RFC 6901 JSON Pointer: "/data/object/id", "/items/0",
// "/a~1b" for the member "a/b", "/m~0n" for "m~n".
type Pointer struct {
	raw    string
	tokens []string
}

// ParsePointer parses s. The empty pointer (the whole document) is
// refused: a key or an ignored part is always inside the body.
func ParsePointer(s string) (Pointer, error) {
	if s == "" {
		return Pointer{}, errors.New("JSON pointer is empty; it must start with '/', e.g. /id")
	}
	if s[0] != '/' {
		return Pointer{}, fmt.Errorf("JSON pointer %q must start with '/'", s)
	}
	tokens := strings.Split(s[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return Pointer{}, fmt.Errorf("JSON pointer %q: '~' must be followed by 0 or 1", s)
			}
		}
		tokens[i] = unescapeToken.Replace(t)
	}
	return Pointer{raw: s, tokens: tokens}, nil
}

// unescapeToken decodes a reference token: ~1 first, then ~0 (RFC 6901
// section 4), which strings.Replacer does in one left-to-right pass.
var unescapeToken = strings.NewReplacer("~1", "/", "~0", "~")

// String returns the pointer as written.
func (p Pointer) String() string { return p.raw }

// Lookup returns the JSON value at p in the JSON text doc, and whether
// there is one. An array index must be written in decimal without leading
// zeros. doc must be valid JSON (the error says when it is not). An object
// on the path that gives the member the pointer goes through more than
// once (names compared after unescaping) makes the value ambiguous: the
// error then wraps ErrDuplicateMember and ends with the pointer to that
// member ("... at /data").
func (p Pointer) Lookup(doc []byte) (value json.RawMessage, found bool, err error) {
	if !json.Valid(doc) {
		return nil, false, errors.New("the body is not valid JSON")
	}
	cur := trimSpace(doc)
	for depth, t := range p.tokens {
		switch cur[0] {
		case '{':
			v, ok, twice := objectMember(cur, t)
			if twice {
				return nil, false, fmt.Errorf("%w at %s", ErrDuplicateMember, p.prefix(depth+1))
			}
			if !ok {
				return nil, false, nil
			}
			cur = v
		case '[':
			i, ok := arrayIndex(t)
			if !ok {
				return nil, false, nil
			}
			v, ok := element(cur, i)
			if !ok {
				return nil, false, nil
			}
			cur = v
		default:
			return nil, false, nil
		}
	}
	return cur, true, nil
}

// arrayIndex reads an array index token: decimal digits without a leading
// zero (RFC 6901 section 4), so that "+1", "-0" and "01" name no element.
func arrayIndex(t string) (int, bool) {
	if t == "" || len(t) > 1 && t[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(t)
	return i, err == nil
}

// prefix returns the pointer to the n-th token, as written.
func (p Pointer) prefix(n int) string {
	end := 0
	for range n {
		next := strings.IndexByte(p.raw[end+1:], '/')
		if next < 0 {
			return p.raw
		}
		end += 1 + next
	}
	return p.raw[:end]
}

// The functions below walk JSON text that json.Valid accepted, and so
// need not check its syntax. Values are returned without surrounding
// whitespace.

// objectMember returns the value of the member name of the object obj, and
// whether the object gives that name more than once.
func objectMember(obj []byte, name string) (value []byte, found, twice bool) {
	i := skipSpace(obj, 1)
	for obj[i] != '}' {
		end := skipString(obj, i)
		key := obj[i+1 : end-1]
		i = skipSpace(obj, end)
		i = skipSpace(obj, i+1) // the colon
		valueEnd := skipValue(obj, i)
		if memberName(key) == name {
			if found {
				return nil, false, true
			}
			value, found = obj[i:valueEnd], true
		}
		i = skipSpace(obj, valueEnd)
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
	return value, found, false
}

// memberName decodes the bytes between a member name's quotes.
func memberName(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	var s string
	quoted := append(append([]byte{'"'}, raw...), '"')
	if json.Unmarshal(quoted, &s) != nil {
		return string(raw)
	}
	return s
}

// element returns the n-th element of the array arr.
func element(arr []byte, n int) ([]byte, bool) {
	i := skipSpace(arr, 1)
	for k := 0; arr[i] != ']'; k++ {
		end := skipValue(arr, i)
		if k == n {
			return arr[i:end], true
		}
		i = skipSpace(arr, end)
		if arr[i] == ',' {
			i = skipSpace(arr, i+1)
		}
	}
	return nil, false
}

// skipValue returns the index after the value that starts at i.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i < len(b) && !isJSONDelimiter(b[i]) { // a number or a literal
		i++
	}
	return i
}

// skipString returns the index after the string that starts at i.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isJSONDelimiter(c byte) bool { return c == ',' || c == '}' || c == ']' || isJSONSpace(c) }

func trimSpace(b json.RawMessage) json.RawMessage {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// pointerTrie holds pointers by token, so that the canonicaliser can tell
// at each member or element whether it lies at (or under) one of them.
type pointerTrie struct {
	children map[string]*pointerTrie
	terminal bool // a pointer ends here: this value is ignored
}

func newPointerTrie(ps []Pointer) *pointerTrie {
	if len(ps) == 0 {
		return nil
	}
	root := new(pointerTrie)
	for _, p := range ps {
		n := root
		for _, t := range p.tokens {
			if n.children == nil {
				n.children = make(map[string]*pointerTrie)
			}
			c := n.children[t]
			if c == nil {
				c = new(pointerTrie)
				n.children[t] = c
			}
			n = c
		}
		n.terminal = true
	}
	return root
}

// child returns the node for the member or element named by token, nil
// when no pointer goes there.
func (n *pointerTrie) child(token []byte) *pointerTrie {
	if n == nil {
		return nil
	}
	return n.children[string(token)]
}
