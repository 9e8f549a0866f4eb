//go:build !linux

package caddyproc

import "syscall"

// procAttr: only Linux can have a child killed when its parent dies.
func procAttr() *syscall.SysProcAttr { return nil }
