package redis

// The arguments of the scripts every request runs (reserve, complete), in
// one allocation each: go-redis takes them as []any, and boxing a number
// or a byte slice into an interface allocates, where boxing a pointer
// does not. go-redis writes *uint64 and *int64 as their decimal text, as
// it writes the numbers themselves, and a BinaryMarshaler as its bytes.

// bytesArg is a byte slice argument, passed by pointer.
type bytesArg []byte

func (b *bytesArg) MarshalBinary() ([]byte, error) { return *b, nil }

// reserveArgs are the reserve script's: fingerprint, token, lease and how
// long the record's key is kept.
type reserveArgs struct {
	fp          bytesArg
	token       uint64
	lease, keep int64
	list        [4]any
}

func newReserveArgs(fp []byte, token uint64, lease, keep int64) []any {
	a := &reserveArgs{fp: fp, token: token, lease: lease, keep: keep}
	a.list = [4]any{&a.fp, &a.token, &a.lease, &a.keep}
	return a.list[:]
}

// completeArgs are the complete script's: token, the response's head and
// body, the record's TTL and the request's detail.
type completeArgs struct {
	token              uint64
	head, body, detail bytesArg
	ttl                int64
	list               [5]any
}

func newCompleteArgs(token uint64, head, body []byte, ttl int64, detail []byte) []any {
	a := &completeArgs{token: token, head: head, body: body, ttl: ttl, detail: detail}
	a.list = [5]any{&a.token, &a.head, &a.body, &a.ttl, &a.detail}
	return a.list[:]
}
