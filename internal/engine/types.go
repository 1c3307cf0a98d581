package engine

import "github.com/stockres/stock/stocktype"

// The data types of package stock, defined in package stocktype: the engine names them as
// package stock does.
type (
	RelayStats       = stocktype.RelayStats
	Report           = stocktype.Report
	PassResult       = stocktype.PassResult
	BatchPublisher   = stocktype.BatchPublisher
	BatchStore       = stocktype.BatchStore
	Cart             = stocktype.Cart
	CartError        = stocktype.CartError
	CartReceipt      = stocktype.CartReceipt
	Entry            = stocktype.Entry
	Event            = stocktype.Event
	EventType        = stocktype.EventType
	ItemLister       = stocktype.ItemLister
	Kind             = stocktype.Kind
	Levels           = stocktype.Levels
	Line             = stocktype.Line
	Observation      = stocktype.Observation
	Observer         = stocktype.Observer
	ObserverFunc     = stocktype.ObserverFunc
	Publisher        = stocktype.Publisher
	PublisherFunc    = stocktype.PublisherFunc
	Receipt          = stocktype.Receipt
	ReconcileOptions = stocktype.ReconcileOptions
	Record           = stocktype.Record
	RecordLister     = stocktype.RecordLister
	RelayOptions     = stocktype.RelayOptions
	Request          = stocktype.Request
	StartObserver    = stocktype.StartObserver
	State            = stocktype.State
	Store            = stocktype.Store
)

// The constants of those types.
const (
	MaxQty         = stocktype.MaxQty
	MaxNameLen     = stocktype.MaxNameLen
	KindDeduct     = stocktype.KindDeduct
	KindHold       = stocktype.KindHold
	KindRestock    = stocktype.KindRestock
	KindTombstone  = stocktype.KindTombstone
	StateHeld      = stocktype.StateHeld
	StateReserved  = stocktype.StateReserved
	StateApplied   = stocktype.StateApplied
	StateRestored  = stocktype.StateRestored
	StateRefused   = stocktype.StateRefused
	StateCancelled = stocktype.StateCancelled
	StateExpired   = stocktype.StateExpired
	EventDeducted  = stocktype.EventDeducted
	EventConfirmed = stocktype.EventConfirmed
	EventRestocked = stocktype.EventRestocked
	EventRestored  = stocktype.EventRestored
	EventRefused   = stocktype.EventRefused
	EventHeld      = stocktype.EventHeld
	EventCancelled = stocktype.EventCancelled
	EventExpired   = stocktype.EventExpired
)
