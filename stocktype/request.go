package stocktype

// MaxQty is the largest quantity, stock level or limit this package accepts: 2^53-1, the
// largest integer a Lua number (a double) holds exactly.
const MaxQty = 1<<53 - 1

// MaxNameLen is the longest SKU, request id, user or prefix accepted, in bytes. A name is 1 to
// MaxNameLen bytes of valid UTF-8 without braces, '|', whitespace, control characters or
// invisible Unicode format characters (category Cf: zero-width spaces and joiners, the byte
// order mark, the soft hyphen, bidirectional controls), else ErrInvalid before anything is
// sent; the letters, marks and symbols of every script are accepted, compared byte for byte.
const MaxNameLen = 128

// Request asks to take Qty units of an item, exactly once per ID.
type Request struct {
	SKU  string // the item
	ID   string // the idempotency key: an order id or request token, unique per operation
	User string // who takes the stock, counted against WithUserLimit; optional unless WithUserRequired
	Qty  int64  // units to take, 1 to MaxQty
	// Retry marks a retry after an unknown outcome (a timeout, a broken connection). A retry's
	// refusal for lack of stock (ErrSoldOut, ErrInsufficient) is then recorded for the id, so
	// that the earlier attempt, should it reach Redis after the retry, is refused too: the
	// answer the caller got stays the final one. Every later request of the id (whatever its
	// quantity or user) gets the same error (ErrSoldOut or ErrInsufficient) and Remaining,
	// whatever was restocked or given back since, for as long as the ledger keeps the id (see
	// ReconcileOptions.Retention: the record is a ledger entry, not a Store record). Without it
	// a refusal records nothing, which keeps the sold-out path free of writes.
	Retry bool
}

// Receipt is the outcome of one request.
type Receipt struct {
	SKU, ID string
	// Qty is the number of units the id took or gave back. With ErrConflict it is the quantity
	// the id was first used with; with ErrUserLimit, the units the user already has.
	Qty int64
	// Remaining is the available stock right after the operation. For a replayed deduct or
	// hold it is the value recorded by the original operation; for a replayed restore or
	// cancel, the stock available now. With ErrSoldOut and ErrInsufficient it is the
	// stock available at the time of the refusal.
	Remaining int64
	// Replayed is true when the id had already done this operation: nothing was changed and the
	// receipt repeats the original outcome.
	Replayed bool
}

// Levels are the counters of one item. Loaded = Available + Held + Sold at every moment.
type Levels struct {
	Available int64 // units that can be taken
	Held      int64 // units in live holds
	Sold      int64 // units deducted or confirmed, net of restores
	Loaded    int64 // units loaded and restocked
	Closed    bool  // the item refuses new deducts and holds
}
