package protocol

// Reply codes: the first integer of a script's reply for one request. The names are those of
// lua/lib.lua (OK, REPLAY, SOLDOUT, ...); TestReplyCodesMatchLua holds the two lists together.
const (
	OK        int64 = 0  // done
	Replay    int64 = 1  // done before, by the same request id: nothing changed
	SoldOut   int64 = 2  // nothing available
	Short     int64 = 3  // some available, less than asked
	NotLoaded int64 = 4  // the item does not exist
	Conflict  int64 = 5  // the request id was used otherwise
	Restored  int64 = 6  // the request id was given back
	UserLimit int64 = 7  // the per-user limit (the third integer: the units the user has)
	Closed    int64 = 8  // the item is closed
	Unknown   int64 = 9  // no entry for the request id
	Expired   int64 = 10 // the hold passed its deadline
	Confirmed int64 = 11 // the hold was confirmed
	Invalid   int64 = 12 // refused before any write
	// Untaken is deductmany.lua's code for a line that could have been taken but was not,
	// because another line of the cart refused.
	Untaken int64 = -1
)

// LuaCodes maps the name each reply code has in lua/lib.lua to its value here.
var LuaCodes = map[string]int64{
	"OK": OK, "REPLAY": Replay, "SOLDOUT": SoldOut, "SHORT": Short, "NOTLOADED": NotLoaded,
	"CONFLICT": Conflict, "RESTORED": Restored, "USERLIMIT": UserLimit, "CLOSED": Closed,
	"UNKNOWN": Unknown, "EXPIRED": Expired, "CONFIRMED": Confirmed, "INVALID": Invalid,
	"UNTAKEN": Untaken,
}
