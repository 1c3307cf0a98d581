// Package chaos injects faults on the whole path (Reserver, outbox, relay, store, reconciler) and
// kills relay processes, each fault with a negative control its checks must catch (see package
// systest).
package chaos
