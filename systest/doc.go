// Package systest holds the system tests of package stock: whole-path and adversarial tests
// that run a Reserver together with relays, reconcilers, SQL stores (package sqlstore), queues
// and real servers, through the public API only. The tests of package stock itself, in the
// module's root, are the contract of each call and read as its documentation.
//
// The tests live in one package per kind, so that a tier picks them by package:
//
//   - contract: the promises of the package docs and the README, one file per behaviour:
//     requests and their repeats (requests_test.go), holds (holds_test.go), carts
//     (carts_test.go), the sold-out fast path (sold_out_test.go), an item's lifecycle
//     (lifecycle_test.go), items split over buckets (split_items_test.go), the relay and the
//     queue path (relay_test.go), Run (run_test.go), reconcile and repair (reconcile_test.go),
//     retention (retention_test.go), faults of the servers and stores (faults_test.go), the
//     memory policy (memory_policy_test.go), key names (names_test.go), the stocktest kit
//     (stocktest_test.go) and least-privilege ACLs (acl_test.go);
//   - model: a model-based randomized test against a reference model of the documented
//     contract (model_test.go, model_ref_test.go, model_retention_test.go, model_conc_test.go;
//     its findings are in model/testdata/model-findings.md), a property test of random
//     interleavings (property_test.go) and a linearizability check of per-item histories
//     (linearizability_test.go);
//   - chaos: fault injection on the full path (Reserver, outbox, relay, sqlstore, reconciler),
//     each fault with a negative control the checks must catch (fault_test.go,
//     fault_queue_test.go, storefault_test.go), relay processes killed with SIGKILL
//     (crash_test.go, crashxfer_test.go) and the relay benchmark into sqlstore;
//   - failover: failovers, replicas and the failover guard's fence (failover_test.go), a real
//     Sentinel deployment under traffic (sentinel_test.go) and cut off by a partition
//     (partition_test.go), the repair after a failover that lost writes the store already
//     has (repair_after_failover_test.go);
//   - idle: what Run costs and does while nothing happens: commands per idle item, hints,
//     clocks that drift (idle_test.go).
//
// internal/kit is the harness they share: the backends, a Reserver, levels and ledger checks,
// draining a relay, and the fault suites' report.
//
// The full tier (.ci/test, which CI runs) runs each package as its own go test process, at
// once, each with its own servers; model under the race detector. The long tier
// (.ci/long) runs the model test, the split items' relay order on real servers and the fault
// suite at longer sizes.
//
// By default (go test ./systest/...) the tests run on miniredis, SQLite and the in-memory store,
// and the tests that need a real server are skipped. With real servers, from the module's root:
//
//	STOCK_REDIS_SERVER=path STOCK_TEST_SENTINEL=1 \
//	STOCK_TEST_POSTGRES='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' \
//	STOCK_TEST_MYSQL='root@tcp(127.0.0.1:3306)/test?parseTime=true' \
//	STOCK_TEST_NATS='nats://127.0.0.1:4222' \
//	go test -count=1 -timeout 40m ./systest/...
//
// STOCK_REDIS_SERVER is the path of a redis-server binary (or "path", to look it up on PATH); the
// tests start their own standalone servers and 3-master clusters on free loopback ports, and with
// STOCK_TEST_SENTINEL=1 Sentinel deployments (a primary, replicas, three sentinels) too. A
// variable that is set for a server that cannot be reached fails the tests. Some suites have
// knobs of their own: STOCK_FAULT_LONG and STOCK_FAULT_REPORT (chaos/fault_test.go),
// STOCK_MODEL_CHECKS and STOCK_MODEL_STEPS (model/model_test.go), STOCK_TEST_LONG (the split
// items' relay order on real servers, contract/split_items_test.go).
package systest
