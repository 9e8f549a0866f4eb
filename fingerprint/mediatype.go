package fingerprint

import (
	"mime"
	"net/http"
	"strings"
)

// DeclaresJSON reports whether the request's Content-Type is JSON:
// application/json or any +json type (RFC 6839), in any spelling.
func DeclaresJSON(h http.Header) bool {
	values := h["Content-Type"]
	if len(values) == 0 {
		return false
	}
	mt, _, _ := strings.Cut(values[0], ";")
	mt = strings.TrimSpace(mt)
	return strings.EqualFold(mt, "application/json") ||
		(len(mt) > 5 && strings.EqualFold(mt[len(mt)-5:], "+json") && strings.Contains(mt, "/"))
}

// isJSONType reports whether a lower-case media type is JSON.
func isJSONType(mt string) bool {
	return mt == "application/json" || (strings.HasSuffix(mt, "+json") && strings.Contains(mt, "/"))
}

// normalizeMediaType returns a media type (a Content-Type value) in one
// spelling per meaning, so that a retry that only re-spells it matches:
// type, subtype, parameter names and the charset value in lower case,
// parameters sorted, and no charset=utf-8 on JSON, which is UTF-8 by
// definition (RFC 8259). A value already in that spelling (the usual
// case) comes back unchanged, without allocating; one that does not parse
// comes back as it is.
func normalizeMediaType(v string) string {
	if isPlainMediaType(v) {
		return v
	}
	mt, params, err := mime.ParseMediaType(v)
	if err != nil {
		return v
	}
	if cs, ok := params["charset"]; ok {
		cs = strings.ToLower(cs)
		params["charset"] = cs
		if isJSONType(mt) && (cs == "utf-8" || cs == "utf8") {
			delete(params, "charset")
		}
	}
	if out := mime.FormatMediaType(mt, params); out != "" {
		return out
	}
	return v
}

// isPlainMediaType reports whether v is a lower-case type/subtype without
// parameters, which normalizeMediaType would return unchanged.
func isPlainMediaType(v string) bool {
	slash := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '+', c == '-', c == '_':
		case c == '/' && !slash && i > 0 && i < len(v)-1:
			slash = true
		default:
			return false
		}
	}
	return slash
}
