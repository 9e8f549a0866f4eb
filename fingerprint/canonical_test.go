package fingerprint

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
)

func canon(t testing.TB, s string) []byte {
	t.Helper()
	out, err := AppendCanonicalJSON(nil, []byte(s))
	if err != nil {
		t.Fatalf("AppendCanonicalJSON(%.80q): %v", s, err)
	}
	return out
}

// equalJSON are pairs of texts that mean the same and must canonicalise alike.
var equalJSON = []struct{ name, a, b string }{
	{"whitespace", `{"a":[1,2,{"b":null}]}`, " \t\r\n{ \"a\" :\n[ 1 ,2\t, { \"b\" : null } ] }\r\n"},
	{"member order", `{"a":1,"b":2,"c":3}`, `{"c":3,"a":1,"b":2}`},
	{"member order nested", `{"x":{"b":[{"d":1,"c":2}],"a":true}}`, `{"x":{"a":true,"b":[{"c":2,"d":1}]}}`},
	{"member order by decoded name", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
	{"member order with astral and BMP names", `{"\uffff":1,"\ud83d\ude00":2}`, `{"😀":2,"￿":1}`},
	{"member order with prefix names", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
	{"duplicates keep source order among unequal names", `{"b":0,"a":1,"a":2}`, `{"a":1,"a":2,"b":0}`},
	{"escape of a letter", `"\u0041"`, `"A"`},
	{"escaped solidus", `"a\/b"`, `"a/b"`},
	{"escaped control characters", `"\b\f\n\r\t\"\\"`, "\"\\u0008\\u000c\\u000A\\u000D\\u0009\\u0022\\u005c\""},
	{"surrogate pair", `"\ud83d\ude00"`, `"😀"`},
	{"uppercase hex escape", `"\u00E9"`, `"é"`},
	{"escaped NUL", `"\u0000"`, "\"\\u0000\""},
	{"escaped name", `{"\u006eame":1}`, `{"name":1}`},
	{"long escaped string", `"` + strings.Repeat(`\u0041`, 300) + `"`, `"` + strings.Repeat("A", 300) + `"`},
	{"1 and 1.0", `1`, `1.0`},
	{"1 and 1.00", `1`, `1.00`},
	{"1 and 10e-1", `1`, `10e-1`},
	{"1 and 0.1e1", `1`, `0.1e1`},
	{"1 and 1E0", `1`, `1E0`},
	{"1 and 1e+0", `1`, `1e+0`},
	{"1 and 1e-0", `1`, `1e-0`},
	{"100 and 1e2", `100`, `1e2`},
	{"100 and 1000e-1", `100`, `1000e-1`},
	{"0 and -0", `0`, `-0`},
	{"0 and 0.0", `0`, `0.0`},
	{"0 and 0e5", `0`, `0e5`},
	{"0 and -0.000e-7", `0`, `-0.000e-7`},
	{"negative decimals", `-1.50`, `-15e-1`},
	{"exponent leading zeros", `1e0000000000000000002`, `100`},
	{"huge precision decimal trailing zeros", `0.` + strings.Repeat("1", 500) + `000`, strings.Repeat("1", 500) + `e-500`},
	{"big integer spellings", `12345678901234567890`, `1234567890123456789.0e1`},
	{"max exponent", `1e999999999`, `10e999999998`},
	{"numbers in context", `{"price":12.50,"qty":[3,3.0,30e-1]}`, `{"qty":[3e0,0.3E1,3],"price":1250e-2}`},
	{"literals", `[true,false,null]`, `[ true , false , null ]`},
	{"empty containers", `[{},[],""]`, `[ { } , [ ] , "" ]`},
}

// unequalJSON are pairs of texts that mean different things and must not
// canonicalise alike.
var unequalJSON = []struct{ name, a, b string }{
	{"duplicate order", `{"a":1,"a":2}`, `{"a":2,"a":1}`},
	{"duplicate vs single", `{"a":1,"a":1}`, `{"a":1}`},
	{"big integers beyond float64", `12345678901234567890`, `12345678901234567891`},
	{"2^53+1", `9007199254740993`, `9007199254740992`},
	{"huge precision decimals", `0.` + strings.Repeat("3", 400) + `1`, `0.` + strings.Repeat("3", 400) + `2`},
	{"tiny difference in a long fraction", `1.000000000000000000000001`, `1`},
	{"sign", `1`, `-1`},
	{"exponent", `1e2`, `1e3`},
	{"number vs string", `1`, `"1"`},
	{"true vs string", `true`, `"true"`},
	{"null vs empty string", `null`, `""`},
	{"array vs object", `[]`, `{}`},
	{"empty array vs array with empty string", `[]`, `[""]`},
	{"nesting", `[[1],2]`, `[[1,2]]`},
	{"nested objects", `{"a":{"b":1}}`, `{"a":{},"b":1}`},
	{"string boundaries", `["ab","c"]`, `["a","bc"]`},
	{"name value boundary", `{"ab":"c"}`, `{"a":"bc"}`},
	{"case", `"a"`, `"A"`},
	{"escaped NUL vs empty", `"\u0000"`, `""`},
	{"member order inside arrays is kept", `[1,2]`, `[2,1]`},
	{"names are values, not order", `{"a":1,"b":2}`, `{"a":2,"b":1}`},
	{"normalisation form is not applied", `"é"`, `"e\u0301"`},
	{"digits vs exponent", `11`, `1e1`},
	{"10 vs 1", `10`, `1`},
	{"0.1 vs 1", `0.1`, `1`},
	{"long string length prefix", `"` + strings.Repeat("a", 200) + `"`, `"` + strings.Repeat("a", 201) + `"`},
}

func TestCanonicalJSONEqualTexts(t *testing.T) {
	for _, tc := range equalJSON {
		t.Run(tc.name, func(t *testing.T) {
			a, b := canon(t, tc.a), canon(t, tc.b)
			if !bytes.Equal(a, b) {
				t.Fatalf("canonical forms differ:\n%.200q -> %.200q\n%.200q -> %.200q", tc.a, a, tc.b, b)
			}
		})
	}
}

func TestCanonicalJSONUnequalTexts(t *testing.T) {
	for _, tc := range unequalJSON {
		t.Run(tc.name, func(t *testing.T) {
			a, b := canon(t, tc.a), canon(t, tc.b)
			if bytes.Equal(a, b) {
				t.Fatalf("%.200q and %.200q both canonicalise to %.200q", tc.a, tc.b, a)
			}
		})
	}
}

// invalidJSON are texts that must be refused.
var invalidJSON = []struct{ name, src string }{
	{"empty input", ``},
	{"only whitespace", " \n\t\r "},
	{"byte order mark", "\xEF\xBB\xBF{}"},
	{"two top-level values", `1 2`},
	{"two top-level objects", `{}{}`},
	{"trailing garbage", `{"a":1}x`},
	{"trailing comma in array", `[1,]`},
	{"trailing comma in object", `{"a":1,}`},
	{"leading comma", `[,1]`},
	{"missing colon", `{"a" 1}`},
	{"missing value", `{"a":}`},
	{"unquoted name", `{a:1}`},
	{"single quotes", `'a'`},
	{"non-string name", `{1:1}`},
	{"unterminated array", `[1,2`},
	{"unterminated object", `{"a":1`},
	{"unterminated string", `"abc`},
	{"unterminated string after escape", `"abc\`},
	{"raw control character", "\"a\x01b\""},
	{"raw newline in string", "\"a\nb\""},
	{"raw tab in string", "\"a\tb\""},
	{"invalid escape", `"\a"`},
	{"escaped single quote", `"\'"`},
	{"short unicode escape", `"\u12"`},
	{"non-hex unicode escape", `"\u12G4"`},
	{"lone high surrogate", `"\ud800"`},
	{"lone high surrogate before text", `"\ud800abcdef"`},
	{"high surrogate followed by non-surrogate", `"\ud800\u0041"`},
	{"two high surrogates", `"\ud800\ud800"`},
	{"lone low surrogate", `"\udc00"`},
	{"reversed surrogate pair", `"\ude00\ud83d"`},
	{"invalid UTF-8", "\"\xff\""},
	{"truncated UTF-8", "\"\xc3\""},
	{"overlong UTF-8", "\"\xc0\xaf\""},
	{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
	{"invalid UTF-8 outside strings", "[1]\xff"},
	{"leading zero", `01`},
	{"leading zero negative", `-01`},
	{"leading plus", `+1`},
	{"bare minus", `-`},
	{"leading dot", `.5`},
	{"trailing dot", `1.`},
	{"dot exponent", `1.e5`},
	{"empty exponent", `1e`},
	{"signed empty exponent", `1e+`},
	{"hex", `0x10`},
	{"NaN", `NaN`},
	{"Infinity", `Infinity`},
	{"exponent with ten significant digits", `1e1000000000`},
	{"exponent overflowing int64", `1e99999999999999999999`},
	{"exponent out of range after adjustment", `10e999999999`},
	{"negative exponent out of range after adjustment", `0.1e-999999999`},
	{"zero with a huge exponent", `0e10000000000`},
	{"truncated literal", `tru`},
	{"misspelled literal", `nul1`},
	{"capitalised literal", `True`},
	{"literal with trailing letters", `nullx`},
	{"comment", `{} // c`},
	{"vertical tab whitespace", "\v1"},
	{"non-breaking space", "\u00a01"},
	{"nested error", `{"a":[{"b":[1,2,}]}]}`},
}

func TestCanonicalJSONRejects(t *testing.T) {
	for _, tc := range invalidJSON {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("prefix")
			out, err := AppendCanonicalJSON(dst, []byte(tc.src))
			if err == nil {
				t.Fatalf("AppendCanonicalJSON(%q) = %q, want an error", tc.src, out)
			}
			if !errors.Is(err, ErrNotCanonical) {
				t.Errorf("error %v does not wrap ErrNotCanonical", err)
			}
			if string(out) != "prefix" {
				t.Errorf("on error the result is %q, want dst's original bytes", out)
			}
		})
	}
}

func TestCanonicalJSONAppendsToDst(t *testing.T) {
	out, err := AppendCanonicalJSON([]byte("xy"), []byte(`{"b":1,"a":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]byte("xy"), canon(t, `{"a":2,"b":1}`)...); !bytes.Equal(out, want) {
		t.Fatalf("got %q, want %q", out, want)
	}
}

func TestCanonicalJSONAcceptsEveryTopLevelType(t *testing.T) {
	for _, src := range []string{`null`, `true`, `false`, `0`, `-1.5e3`, `""`, `"x"`, `[]`, `{}`} {
		canon(t, src)
	}
}

func TestCanonicalJSONDepthLimit(t *testing.T) {
	for _, open := range []string{"[", `{"a":`} {
		closing := map[string]string{"[": "]", `{"a":`: "}"}[open]
		ok := strings.Repeat(open, MaxDepth) + "1" + strings.Repeat(closing, MaxDepth)
		if _, err := AppendCanonicalJSON(nil, []byte(ok)); err != nil {
			t.Errorf("depth %d of %q: %v", MaxDepth, open, err)
		}
		deep := strings.Repeat(open, MaxDepth+1) + "1" + strings.Repeat(closing, MaxDepth+1)
		if _, err := AppendCanonicalJSON(nil, []byte(deep)); !errors.Is(err, ErrNotCanonical) {
			t.Errorf("depth %d of %q: err %v, want ErrNotCanonical", MaxDepth+1, open, err)
		}
	}
}

func TestCanonicalJSONDepthIsNestingNotCount(t *testing.T) {
	// Many siblings at depth 1 must not count towards the limit.
	src := "[" + strings.Repeat("[],{},", 5*MaxDepth) + "[]]"
	canon(t, src)
}

func TestCanonicalJSONMillionDeepFailsCleanly(t *testing.T) {
	src := bytes.Repeat([]byte("["), 1_000_000)
	if _, err := AppendCanonicalJSON(nil, src); !errors.Is(err, ErrNotCanonical) {
		t.Fatalf("err %v, want ErrNotCanonical", err)
	}
	src = bytes.Repeat([]byte(`{"a":`), 1_000_000)
	if _, err := AppendCanonicalJSON(nil, src); !errors.Is(err, ErrNotCanonical) {
		t.Fatalf("err %v, want ErrNotCanonical", err)
	}
}

func TestCanonicalJSONMebibyteNumber(t *testing.T) {
	digits := strings.Repeat("1234567890", 1<<20/10)
	a := canon(t, digits)
	b := canon(t, "0."+digits+"e"+strconv.Itoa(len(digits)))
	if !bytes.Equal(a, b) {
		t.Fatal("two spellings of a 1 MiB integer differ")
	}
	c := canon(t, digits[:len(digits)-1]+"1")
	if bytes.Equal(a, c) {
		t.Fatal("1 MiB integers differing in the last digit are equal")
	}
	frac := canon(t, "0."+strings.Repeat("0", 1<<20)+"1")
	if !bytes.Equal(frac, canon(t, "1e-"+strconv.Itoa(1<<20+1))) {
		t.Fatal("1 MiB fraction misnormalised")
	}
}

func TestCanonicalJSONMebibyteString(t *testing.T) {
	s := strings.Repeat("é\\n\\u00e9x", 1<<20/10)
	a := canon(t, `"`+s+`"`)
	b := canon(t, `"`+strings.ReplaceAll(strings.ReplaceAll(s, `\u00e9`, "é"), `\n`, `\u000a`)+`"`)
	if !bytes.Equal(a, b) {
		t.Fatal("escape spellings of a large string differ")
	}
}

func TestCanonicalJSONIsDeterministicAcrossBuffers(t *testing.T) {
	src := []byte(`{"z":{"y":[3,2,{"b":"\u00e9","a":1e3}]},"a":"` + strings.Repeat("x", 300) + `"}`)
	want := canon(t, string(src))
	buf := make([]byte, 0, 4)
	for range 10 {
		out, err := AppendCanonicalJSON(buf[:0], src)
		if err != nil || !bytes.Equal(out, want) {
			t.Fatalf("run differs: %v", err)
		}
		buf = out
	}
}

func TestCanonicalJSONDoesNotAllocateWithCapacity(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	src := []byte(apiJSON(4<<10, 5))
	dst := make([]byte, 0, 2*len(src))
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := AppendCanonicalJSON(dst[:0], src); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("AppendCanonicalJSON allocates %v times per call", allocs)
	}
}
