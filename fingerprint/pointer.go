package fingerprint

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

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
// zeros. doc must be valid JSON (the error says when it is not); among
// members with one name the last counts, as in most JSON parsers.
func (p Pointer) Lookup(doc []byte) (value json.RawMessage, found bool, err error) {
	cur := json.RawMessage(doc)
	if !json.Valid(cur) {
		return nil, false, errors.New("the body is not valid JSON")
	}
	for _, t := range p.tokens {
		cur = trimSpace(cur)
		switch {
		case len(cur) > 0 && cur[0] == '{':
			var m map[string]json.RawMessage
			if err := json.Unmarshal(cur, &m); err != nil {
				return nil, false, err
			}
			v, ok := m[t]
			if !ok {
				return nil, false, nil
			}
			cur = v
		case len(cur) > 0 && cur[0] == '[':
			i, err := strconv.Atoi(t)
			if err != nil || i < 0 || (len(t) > 1 && t[0] == '0') {
				return nil, false, nil
			}
			var a []json.RawMessage
			if err := json.Unmarshal(cur, &a); err != nil {
				return nil, false, err
			}
			if i >= len(a) {
				return nil, false, nil
			}
			cur = a[i]
		default:
			return nil, false, nil
		}
	}
	return trimSpace(cur), true, nil
}

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
