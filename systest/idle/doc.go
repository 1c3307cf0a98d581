// Package idle tests what Run costs and does while nothing happens: commands per idle item, hints
// of due holds and new events, and clocks that disagree (see package systest).
package idle
