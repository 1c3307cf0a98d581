// Package failover tests failovers: replicas, the failover guard, a real Sentinel deployment
// under traffic and cut off by a partition, and the repair after a failover that lost writes (see
// package systest).
package failover
