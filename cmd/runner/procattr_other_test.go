//go:build !linux

package main

import "syscall"

func runnerProcAttr() *syscall.SysProcAttr { return nil }
