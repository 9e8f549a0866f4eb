// Package opterr is the configuration error that names the options it is
// about, shared by the handler, its storage backends and the storage
// libraries whose checks they run. The Caddyfile parsers (backend/cfargs)
// report such an error at the line of its option, so that no parser needs
// to read an option's name back out of a message. It sits beside the
// storage libraries, free of Caddy, so that they (which know nothing of
// Caddy) and any backend, built in or not, can import it.
package opterr

import (
	"errors"
	"fmt"
)

// Error is a configuration error about one option, or about a rule
// between options. Its message is Err's alone: the names are not added to
// it (messages already say which option they are about).
type Error struct {
	// Options are the options the error is about, as JSON and the
	// Caddyfile spell them ("max_bytes"): one for a value, each option of
	// a rule between options ("url", "addresses") in any order.
	Options []string
	Err     error
	// Missing says that the option is required and not given.
	Missing bool
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// New returns err as an Error about options; nil when err is nil.
func New(err error, options ...string) error {
	if err == nil {
		return nil
	}
	return &Error{Options: options, Err: err}
}

// Errorf returns an Error about option with the formatted message.
func Errorf(option, format string, a ...any) error {
	return &Error{Options: []string{option}, Err: fmt.Errorf(format, a...)}
}

// Missing returns err as the absence of option, which is required.
func Missing(option string, err error) error {
	return &Error{Options: []string{option}, Err: err, Missing: true}
}

// IsMissing reports whether err is about a required option not given.
func IsMissing(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Missing
}

// Options returns the options err is about; nil when it names none.
func Options(err error) []string {
	var e *Error
	if errors.As(err, &e) {
		return e.Options
	}
	return nil
}
