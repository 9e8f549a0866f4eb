// Package backend is the kit for the idempotency handler's storage
// backends: the guest modules in namespace http.idempotency.storage that
// give the handler its storage.Store. The built-in backends (memory,
// redis, postgres, in the packages below this one) use it exactly as a
// third party's does: a module embeds Pooled and opens its store through
// it, so that handlers with one configuration share one store across
// config reloads, requests hold the store while they run, a new store is
// pinged at start, and the admin API sees its records.
//
// The store itself is a storage.Store, in a package free of Caddy that
// passes storagetest.Run; the backend is the short Caddy adapter around it.
package backend

import "github.com/caddy-idempotency/caddy-idempotency/storage"

// Namespace is the Caddy module namespace of storage backends: a backend
// named "mine" has the ID http.idempotency.storage.mine and is configured
// as `storage mine { ... }` or {"backend": "mine", ...}.
const Namespace = "http.idempotency.storage"

// Backend is implemented by every storage backend. Provision opens or
// takes the store; Store returns it from then until Cleanup.
type Backend interface {
	Store() storage.Store
}

// Holder is implemented by backends whose store can close while a request
// still runs on it: a store shared by configurations (see Pooled) closes
// when the last configuration using it is unloaded, which on a reload is
// before the old configuration's requests are done.
type Holder interface {
	// HoldStore keeps the store open until release is called, exactly
	// once. It fails only when the store is closed already (the request
	// reached a handler of a configuration unloaded meanwhile).
	HoldStore() (release func(), ok bool)
}
