// Package stocktype holds the data types of package stock: a request and its receipt, an item's
// levels, ledger entries, carts, the events of the durable side with the Store and Publisher
// interfaces, the observer's types, the options of the relay and the reconciler, and what a
// relay or a reconcile pass reports (package stockops exports those).
//
// Package stock exports each of them under the same name (stock.Request is stocktype.Request),
// and its documentation says what they mean; their fields and methods are documented here.
// Code that uses package stock never needs to import stocktype: it exists so that the engine
// under package stock, and adapters, can name the types without importing package stock.
package stocktype
