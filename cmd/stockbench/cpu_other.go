//go:build !unix

package main

import (
	"errors"
	"time"
)

// processCPU is not available on this system: the client CPU column reads n/a.
func processCPU() (time.Duration, error) {
	return 0, errors.New("process CPU time not available on this system")
}
