// Package failover tests failovers: replicas, the failover guard, a real Sentinel deployment
// under traffic and cut off by a partition, and the repair after a failover that lost writes (see
// package systest).
//
// In CI (.ci/test) the package runs without the race detector: the subject of its tests is
// another process dying (or a primary cut off); the library code they drive runs under -race in
// the other suites.
package failover
