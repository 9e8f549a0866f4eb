package idempotency

import (
	"context"
	"errors"
	"testing"
)

type detachKey struct{}

func TestDetachedContextIsWithoutCancel(t *testing.T) {
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), detachKey{}, "v"))
	d := detach(parent)
	cancel(errors.New("client gone"))
	if d.Err() != nil || d.Done() != nil {
		t.Fatalf("detached context: Err %v, Done %v; want neither", d.Err(), d.Done())
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached context has a deadline")
	}
	if cause := context.Cause(d); cause != nil {
		t.Fatalf("context.Cause of the detached context = %v, want nil as WithoutCancel's", cause)
	}
	if v := d.Value(detachKey{}); v != "v" {
		t.Fatalf("value %v, want the parent's", v)
	}
	child, stop := context.WithCancel(d)
	defer stop()
	if child.Err() != nil {
		t.Fatal("a child of the detached context is cancelled with the parent")
	}
	if detach(d) != d {
		t.Fatal("detaching a detached context makes another")
	}
}
