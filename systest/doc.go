// Package systest holds the system tests of package stock: whole-path and adversarial tests that
// run a Reserver together with relays, reconcilers, SQL stores (package sqlstore), queues and
// real servers. The package has no code of its own; its tests are in package systest_test and use
// only the public API of stock and its sibling packages. The tests of package stock itself, in
// the module's root, are the contract of each call and read as its documentation.
//
// What lives here:
//
//   - fault injection on the full path (Reserver, outbox, relay, sqlstore, reconciler): server
//     kills with AOF, SCRIPT FLUSH, a TCP proxy that resets, delays or drops replies, CLIENT PAUSE,
//     each with a negative control the checks must catch; the same through a queue
//     (fault_test.go, fault_queue_test.go, storefault_test.go);
//   - relay processes killed with SIGKILL (crash_test.go), failover and replicas
//     (failover_test.go, replica_test.go, fence_test.go), failovers under traffic on a real
//     Sentinel deployment, each with a negative control (sentinel_test.go), a partition on a
//     real Sentinel deployment after which every counter of every item must be exact
//     (partition_test.go), the repair after a failover that lost writes the store already has,
//     on every backend (repair_after_failover_test.go), least-privilege ACLs (acl_test.go);
//   - a model-based randomized test against a reference model of the documented contract
//     (model_test.go, model_ref_test.go, model_conc_test.go; its findings are in
//     testdata/model-findings.md), a property test of random interleavings (property_test.go)
//     and a linearizability check of per-item histories (linearizability_test.go);
//   - the durable path into SQL stores (durable_test.go), Consume on a queue (queue_test.go),
//     adversarial reviews of the contract (attack12_test.go, attack13_test.go), and the relay
//     benchmark into sqlstore (relay_bench_test.go).
//
// The full tier (.ci/test, which CI runs) runs this package as four go test processes at once,
// by test name, each with its own servers. The model, property and linearizability tests and the
// concurrency tests (names with Concurren… or Race…) run under the race detector; the others run
// without it, the process-kill, server-kill and failover suites among them, since the package has
// no code of its own and the library code they drive runs under -race in the root package's
// tests and in those suites. Per-backend subtests run in parallel: each backend is its own
// server. The long tier (.ci/long) runs the model test, the relay-order attack on real servers
// and the fault suite at longer sizes.
//
// By default (go test ./systest/) the tests run on miniredis, SQLite and the in-memory store, and
// the tests that need a real server are skipped. With real servers, from the module's root:
//
//	STOCK_REDIS_SERVER=path STOCK_TEST_SENTINEL=1 \
//	STOCK_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	STOCK_TEST_MYSQL='root@tcp(127.0.0.1:3306)/test?parseTime=true' \
//	STOCK_TEST_NATS='nats://127.0.0.1:4222' \
//	go test -count=1 -timeout 40m ./systest/
//
// STOCK_REDIS_SERVER is the path of a redis-server binary (or "path", to look it up on PATH); the
// tests start their own standalone servers and 3-master clusters on free loopback ports, and with
// STOCK_TEST_SENTINEL=1 Sentinel deployments (a primary, replicas, three sentinels) too. A
// variable that is set for a server that cannot be reached fails the tests. Some suites have
// knobs of their own: STOCK_FAULT_LONG and STOCK_FAULT_REPORT (fault_test.go),
// STOCK_MODEL_CHECKS and STOCK_MODEL_STEPS (model_test.go).
package systest
