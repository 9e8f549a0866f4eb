package fingerprint

import (
	"errors"
	"strings"
	"testing"
	"unsafe"
)

// acceptedKeys are header lines ParseKey must accept, with the key it must
// return. maxLen 0 means the default limit of 255.
var acceptedKeys = []struct {
	name   string
	values []string
	maxLen int
	want   string
}{
	{"UUID starting with a digit", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, 0, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
	{"bare with punctuation", []string{`a!#$%&'*+-.^_|~:/?@[]{}<>=;"\`}, 0, `a!#$%&'*+-.^_|~:/?@[]{}<>=;"\`},
	{"single character", []string{"x"}, 0, "x"},
	{"sf-string", []string{`"abc"`}, 0, "abc"},
	{"sf-string equals its bare spelling", []string{`"8e03978e-40d5"`}, 0, "8e03978e-40d5"},
	{"sf-string with spaces", []string{`"order 42 retry"`}, 0, "order 42 retry"},
	{"sf-string with escapes", []string{`"a\"b\\c"`}, 0, `a"b\c`},
	{"sf-string of only a space", []string{`" "`}, 0, " "},
	{"sf-string with comma inside", []string{`"a,b"`}, 0, "a,b"},
	{"sf-string with a flag parameter", []string{`"abc";v`}, 0, "abc"},
	{"sf-string with typed parameters", []string{`"abc";a=1;b=-2.5;c="x\"y";d=tok/en:1;e=:aGk=:;f=?0;g=?1;*h=@1700000000;i=%"caf%c3%a9"`}, 0, "abc"},
	{"sf-string with SP after semicolon", []string{`"abc";  a=1; b`}, 0, "abc"},
	{"surrounding OWS", []string{" \t abc \t "}, 0, "abc"},
	{"surrounding OWS around sf-string", []string{"\t \"abc\"  "}, 0, "abc"},
	{"length exactly at the limit", []string{strings.Repeat("k", 255)}, 0, strings.Repeat("k", 255)},
	{"quoted length at the limit counts unescaped bytes", []string{`"` + strings.Repeat(`\"`, 10) + `"`}, 10, strings.Repeat(`"`, 10)},
	{"no limit", []string{strings.Repeat("k", 10000)}, -1, strings.Repeat("k", 10000)},
}

// rejectedKeys are header lines ParseKey must refuse with a *KeyError whose
// message contains wantIn.
var rejectedKeys = []struct {
	name   string
	values []string
	maxLen int
	wantIn string
}{
	{"several lines", []string{"a", "b"}, 0, "appears on 2 lines"},
	{"several identical lines", []string{"a", "a", "a"}, 0, "appears on 3 lines"},
	{"empty", []string{""}, 0, "is empty"},
	{"only whitespace", []string{" \t "}, 0, "is empty"},
	{"empty sf-string", []string{`""`}, 0, "is empty"},
	{"empty sf-string with parameter", []string{`"";a`}, 0, "is empty"},
	{"too long", []string{strings.Repeat("k", 256)}, 0, "is 256 characters long; the limit is 255"},
	{"10k bytes", []string{strings.Repeat("k", 10000)}, 0, "is 10000 characters long"},
	{"length counted on the unquoted key", []string{`"` + strings.Repeat("k", 11) + `"`}, 10, "is 11 characters long; the limit is 10"},
	{"control byte", []string{"ab\x07c"}, 0, "non-printable byte 0x07 at offset 2"},
	{"NUL", []string{"\x00"}, 0, "non-printable byte 0x00 at offset 0"},
	{"DEL", []string{"abc\x7f"}, 0, "non-printable byte 0x7F at offset 3"},
	{"tab inside a bare key", []string{"a\tb"}, 0, "non-printable byte 0x09 at offset 1"},
	{"space inside a bare key", []string{"a b"}, 0, "a space at offset 1"},
	{"byte 0x80", []string{"a\x80"}, 0, "non-ASCII byte 0x80 at offset 1"},
	{"byte 0xFF", []string{"\xffabc"}, 0, "non-ASCII byte 0xFF at offset 0"},
	{"UTF-8 letter", []string{"café"}, 0, "non-ASCII byte 0xC3 at offset 3"},
	{"control byte in sf-string", []string{"\"a\x01\""}, 0, "non-printable byte 0x01 at offset 2"},
	{"non-ASCII in sf-string", []string{"\"é\""}, 0, "non-ASCII byte 0xC3 at offset 1"},
	{"offset counts leading OWS", []string{"  a\x02"}, 0, "offset 3"},
	{"bare list", []string{"k1,k2"}, 0, "is a list"},
	{"bare list folded by a proxy", []string{"k1, k2"}, 0, "is a list"},
	{"quoted list", []string{`"k1", "k2"`}, 0, "is a list"},
	{"quoted list without space", []string{`"k1","k2"`}, 0, "is a list"},
	{"quoted list after parameters", []string{`"k1";a=1, "k2"`}, 0, "is a list"},
	{"unterminated", []string{`"abc`}, 0, "unterminated string"},
	{"unterminated by an escaped quote", []string{`"abc\"`}, 0, "unterminated string"},
	{"unterminated after a backslash", []string{`"abc\`}, 0, "unterminated string"},
	{"only a quote", []string{`"`}, 0, "unterminated string"},
	{"bad escape", []string{`"\a"`}, 0, "invalid escape at offset 1"},
	{"escaped slash", []string{`"a\/b"`}, 0, "invalid escape"},
	{"garbage after sf-string", []string{`"abc"def`}, 0, "unexpected characters after the quoted key at offset 5"},
	{"space before parameter", []string{`"abc" ;a`}, 0, "unexpected characters"},
	{"parameter with uppercase key", []string{`"abc";A=1`}, 0, "invalid parameter at offset 5"},
	{"parameter without key", []string{`"abc";=1`}, 0, "invalid parameter"},
	{"parameter without value", []string{`"abc";a=`}, 0, "invalid parameter"},
	{"parameter integer too long", []string{`"abc";a=1234567890123456`}, 0, "invalid parameter"},
	{"parameter decimal fraction too long", []string{`"abc";a=1.2345`}, 0, "invalid parameter"},
	{"parameter decimal without fraction", []string{`"abc";a=1.`}, 0, "invalid parameter"},
	{"parameter bad boolean", []string{`"abc";a=?2`}, 0, "invalid parameter"},
	{"parameter unterminated binary", []string{`"abc";a=:aGk=`}, 0, "invalid parameter"},
	{"parameter bad display string", []string{`"abc";a=%"%C3%A9"`}, 0, "invalid parameter"},
	{"parameter display string invalid UTF-8", []string{`"abc";a=%"%ff"`}, 0, "invalid parameter"},
	{"parameter display string truncated UTF-8", []string{`"abc";a=%"%c3"`}, 0, "invalid parameter"},
	{"parameter decimal date", []string{`"abc";a=@1.5`}, 0, "unexpected characters"},
	{"parameter unterminated string", []string{`"abc";a="x`}, 0, "invalid parameter"},
}

func TestParseKeyAccepts(t *testing.T) {
	for _, tc := range acceptedKeys {
		t.Run(tc.name, func(t *testing.T) {
			maxLen := tc.maxLen
			if maxLen == 0 {
				maxLen = 255
			}
			got, err := ParseKey(tc.values, maxLen)
			if err != nil {
				t.Fatalf("ParseKey(%q) error: %v", tc.values, err)
			}
			if got != tc.want {
				t.Fatalf("ParseKey(%q) = %q, want %q", tc.values, got, tc.want)
			}
		})
	}
}

func TestParseKeyRejects(t *testing.T) {
	for _, tc := range rejectedKeys {
		t.Run(tc.name, func(t *testing.T) {
			maxLen := tc.maxLen
			if maxLen == 0 {
				maxLen = 255
			}
			got, err := ParseKey(tc.values, maxLen)
			if err == nil {
				t.Fatalf("ParseKey(%q) = %q, want an error", tc.values, got)
			}
			var ke *KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("ParseKey(%q) error %v (%T), want *KeyError", tc.values, err, err)
			}
			if got != "" {
				t.Errorf("ParseKey(%q) returned key %q with its error", tc.values, got)
			}
			if !strings.Contains(err.Error(), tc.wantIn) {
				t.Errorf("ParseKey(%q) error %q, want it to contain %q", tc.values, err, tc.wantIn)
			}
			if !strings.HasPrefix(err.Error(), "the Idempotency-Key") {
				t.Errorf("error %q does not start like a client-facing sentence", err)
			}
		})
	}
}

func TestParseKeyMissingHeader(t *testing.T) {
	for _, values := range [][]string{nil, {}} {
		if _, err := ParseKey(values, 255); !errors.Is(err, ErrMissing) {
			t.Errorf("ParseKey(%q) error = %v, want ErrMissing", values, err)
		}
	}
}

// TestParseKeyErrorsNeverEchoTheKey uses a distinctive key body in every
// kind of failure: the message goes back to the client verbatim and must not
// reflect what it sent.
func TestParseKeyErrorsNeverEchoTheKey(t *testing.T) {
	const secret = "SECRETzzKEY"
	long := strings.Repeat(secret, 100)
	cases := [][]string{
		{secret, secret},
		{long},
		{secret + "\x07"},
		{secret + " x"},
		{secret + "\xff"},
		{secret + "," + secret},
		{`"` + secret + `", "` + secret + `"`},
		{`"` + secret},
		{`"` + secret + `\q"`},
		{`"` + secret + `"` + secret},
		{`"` + secret + `";` + secret},
		{`"` + long + `"`},
	}
	for _, values := range cases {
		_, err := ParseKey(values, 255)
		if err == nil {
			t.Fatalf("ParseKey(%q) accepted", values)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "KEY") {
			t.Errorf("error %q echoes the key", err)
		}
		if len(err.Error()) > 200 {
			t.Errorf("error %q is not a short sentence", err)
		}
	}
}

func TestParseKeyNoLimitWhenMaxLenNotPositive(t *testing.T) {
	key := strings.Repeat("k", 1<<16)
	for _, maxLen := range []int{0, -1} {
		if got, err := ParseKey([]string{key}, maxLen); err != nil || got != key {
			t.Errorf("maxLen %d: err %v, len %d", maxLen, err, len(got))
		}
	}
}

func TestParseKeyBareDoesNotAllocate(t *testing.T) {
	values := []string{" 8e03978e-40d5-43e8-bc93-6894a57f9324 "}
	quoted := []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324";v=1`}
	for _, in := range [][]string{values, quoted} {
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := ParseKey(in, 255); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("ParseKey(%q) allocates %v times per call", in, allocs)
		}
	}
}

// TestParseKeyReturnsSubstring checks the bare fast path really aliases the
// header value instead of copying it.
func TestParseKeyReturnsSubstring(t *testing.T) {
	v := "  abcdef  "
	got, err := ParseKey([]string{v}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != "abcdef" || unsafe.StringData(got) != unsafe.StringData(v[2:]) {
		t.Fatalf("got %q, not a substring of the header value", got)
	}
}
