// Package fingerprint parses Idempotency-Key header values and computes the
// request fingerprints that tell a genuine retry from a different request
// reusing the same key.
//
// It implements the key syntax of draft-ietf-httpapi-idempotency-key-header
// (an RFC 8941/9651 sf-string, plus the bare spelling clients actually send,
// such as unquoted UUIDs) and an injective canonical encoding of JSON bodies,
// so that retries which differ only in whitespace, member order, string
// escapes or number spelling keep the same fingerprint.
//
// The package depends on the standard library only: it serves the Caddy
// handler and equally any other consumer of keyed work, such as a queue
// consumer whose message id is the key.
package fingerprint
