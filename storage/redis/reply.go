package redis

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/caddy-idempotency/caddy-idempotency/storage"
)

// reply reads a script's array reply. A reply of the wrong shape (only a
// tampered record or a foreign script could make one) becomes an error
// wrapping storage.ErrCorrupt, never a panic; the first problem is kept so
// that callers check once, with check.
type reply struct {
	v   any
	err error
}

// fail records err unless an earlier problem was recorded; nil is ignored.
func (r *reply) fail(err error) {
	if r.err == nil && err != nil {
		r.err = err
	}
}

func (r *reply) at(i int) any {
	a, ok := r.v.([]any)
	if !ok {
		r.fail(fmt.Errorf("%w: reply %T, want an array", storage.ErrCorrupt, r.v))
		return nil
	}
	if i >= len(a) {
		r.fail(fmt.Errorf("%w: reply of %d elements, want more than %d", storage.ErrCorrupt, len(a), i))
		return nil
	}
	return a[i]
}

func (r *reply) int(i int) int64 {
	v := r.at(i)
	n, ok := v.(int64)
	if !ok && v != nil {
		r.fail(fmt.Errorf("%w: reply element %d is %T, want an integer", storage.ErrCorrupt, i, v))
	}
	return n
}

func (r *reply) str(i int) string {
	v := r.at(i)
	s, ok := v.(string)
	if !ok && v != nil {
		r.fail(fmt.Errorf("%w: reply element %d is %T, want a string", storage.ErrCorrupt, i, v))
	}
	return s
}

// bytes returns element i without copying it: go-redis made the string
// for this reply alone, and callers treat what the store returns as
// read-only, so the bytes are never written. A replayed body is then
// allocated once, by the reply reader, however large it is.
func (r *reply) bytes(i int) []byte {
	s := r.str(i)
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// check returns the first problem, or an error unless the reply has
// exactly n elements.
func (r *reply) check(n int) error {
	if r.err != nil {
		return r.err
	}
	a, ok := r.v.([]any)
	if !ok {
		return fmt.Errorf("%w: reply %T, want an array", storage.ErrCorrupt, r.v)
	}
	if len(a) != n {
		// The elements stay out of the message: they may hold a body.
		return fmt.Errorf("%w: reply of %d elements, want %d", storage.ErrCorrupt, len(a), n)
	}
	return nil
}

// unpackReplay splits the reserve script's packed replay (see
// reserveScript): "created expiry len(head) len(body) " then head, body
// and detail, the rest. The parts alias packed, as bytes does; an empty
// body or detail is nil.
func unpackReplay(packed string) (created, expiry int64, head, body, detail []byte, err error) {
	var nums [4]int64
	rest := packed
	for i := range nums {
		field, after, ok := strings.Cut(rest, " ")
		n, perr := strconv.ParseInt(field, 10, 64)
		if !ok || perr != nil || n < 0 {
			return 0, 0, nil, nil, nil, fmt.Errorf("%w: packed replay, field %d of its %d bytes is not a number", storage.ErrCorrupt, i, len(packed))
		}
		nums[i], rest = n, after
	}
	headLen, bodyLen := nums[2], nums[3]
	if headLen > int64(len(rest)) || bodyLen > int64(len(rest))-headLen {
		return 0, 0, nil, nil, nil, fmt.Errorf("%w: packed replay of %d bytes holds no head of %d and body of %d", storage.ErrCorrupt, len(packed), headLen, bodyLen)
	}
	part := func(s string) []byte {
		if s == "" {
			return nil
		}
		return unsafe.Slice(unsafe.StringData(s), len(s))
	}
	return nums[0], nums[1], part(rest[:headLen]), part(rest[headLen : headLen+bodyLen]), part(rest[headLen+bodyLen:]), nil
}
