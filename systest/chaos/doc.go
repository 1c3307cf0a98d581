// Package chaos injects faults on the whole path (Reserver, outbox, relay, store, reconciler) and
// kills relay processes, each fault with a negative control its checks must catch (see package
// systest).
//
// In CI (.ci/test) the package runs without the race detector: the subject of its tests is
// another process dying (or a primary cut off); the library code they drive runs under -race in
// the other suites.
package chaos
