// Package model runs package stock against a reference model of its documented contract: random
// sequences of calls on several Reservers, random interleavings and a linearizability check (see
// package systest).
package model
