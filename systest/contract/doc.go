// Package contract tests the promises of package stock's docs and README through its public API,
// one file per behaviour, on miniredis and, with STOCK_REDIS_SERVER set, on a real standalone
// server and a real 3-master cluster (see package systest).
package contract
