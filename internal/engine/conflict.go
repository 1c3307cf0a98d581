package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/stockres/stock/internal/protocol"
)

// takeKinds maps a take's kind (protocol.TakeDeduct, protocol.TakeHold) to its ledger kind.
func takeKind(kind string) Kind {
	if kind == protocol.TakeHold {
		return KindHold
	}
	return KindDeduct
}

// conflictWant is what a request that met ErrConflict asked: the kind of entry it makes or
// needs ("" when any but a restock does: a give-back), its quantity (0: not compared) and,
// when user is set, its user.
type conflictWant struct {
	kind      Kind
	qty       int64
	user      string
	checkUser bool
}

// conflictDetail says how the id's entry e differs from what the request wanted, e.g. "was
// used for a hold, not a deduct; with quantity 2, not 1; by another user", or "" when nothing
// differs. It never names the other user.
func conflictDetail(e Entry, w conflictWant) string {
	var d []string
	switch {
	case w.kind != "" && e.Kind != w.kind:
		d = append(d, fmt.Sprintf("was used for a %s, not a %s", e.Kind, w.kind))
	case w.kind == "" && e.Kind == KindRestock:
		d = append(d, "was used for a restock, which cannot be given back")
	}
	if w.qty > 0 && e.Qty != w.qty {
		d = append(d, fmt.Sprintf("with quantity %d, not %d", e.Qty, w.qty))
	}
	if w.checkUser && e.User != w.user {
		switch {
		case e.User == "":
			d = append(d, "without a user, not by "+w.user)
		case w.user == "":
			d = append(d, "by a user, not without one")
		default:
			d = append(d, "by another user")
		}
	}
	if len(d) == 0 {
		return ""
	}
	if !strings.HasPrefix(d[0], "was used") {
		d[0] = "was used " + d[0]
	}
	return strings.Join(d, "; ")
}

// conflict is the ErrConflict of a request of rc's id whose script answered CONFLICT: it reads
// the id's entry in the ledger hash ledgerKey (the item's, or the bucket's the script ran on)
// and says what differs. Kind, quantity and user of an entry never change once written, so the
// read after the script tells what the script saw; when it cannot be read (gone with the
// retention, Redis unreachable) the error gives the quantity the script answered.
func (r *Reserver) conflict(ctx context.Context, ledgerKey string, rc Receipt, w conflictWant) error {
	if s, err := r.client.Do(ctx, r.client.B().Hget().Key(ledgerKey).Field(rc.ID).Build()).ToString(); err == nil {
		if e, err := parseEntry(rc.SKU, rc.ID, s); err == nil {
			if d := conflictDetail(e, w); d != "" {
				return fmt.Errorf("%w: %s/%s %s", ErrConflict, rc.SKU, rc.ID, d)
			}
		}
	}
	return fmt.Errorf("%w: %s/%s was used with other parameters (quantity %d)", ErrConflict, rc.SKU, rc.ID, rc.Qty)
}

// cartConflict is the ErrConflict of a cart whose id names another cart in the cart log: it
// reads the recorded cart and says what differs (kind, user, lines).
func (r *Reserver) cartConflict(ctx context.Context, kind string, c Cart, lines []Line) error {
	rec, err := r.client.Do(ctx, r.client.B().Hget().Key(r.cartKeys()[0]).Field(c.ID).Build()).ToString()
	var d []string
	if err == nil {
		if k, user, got, err := parseCartRecord(rec); err == nil {
			if k != kind {
				d = append(d, fmt.Sprintf("was used for a %s cart, not a %s cart", takeKind(k), takeKind(kind)))
			}
			if user != c.User {
				switch {
				case user == "":
					d = append(d, "without a user, not by "+c.User)
				case c.User == "":
					d = append(d, "by a user, not without one")
				default:
					d = append(d, "by another user")
				}
			}
			if l := lineDiff(got, lines); l != "" {
				d = append(d, "with other lines ("+l+")")
			}
		}
	}
	if len(d) == 0 {
		return fmt.Errorf("%w: cart %s was used with other lines or another user", ErrConflict, c.ID)
	}
	if !strings.HasPrefix(d[0], "was used") {
		d[0] = "was used " + d[0]
	}
	return fmt.Errorf("%w: cart %s %s", ErrConflict, c.ID, strings.Join(d, "; "))
}

// lineDiff says how the lines asked differ from the lines recorded (both summed per item), at
// most three items: "item B: quantity 2, not 1; item C not in it".
func lineDiff(recorded, asked []Line) string {
	had := map[string]int64{}
	for _, l := range recorded {
		had[l.SKU] += l.Qty
	}
	var d []string
	for _, l := range asked {
		switch q, ok := had[l.SKU]; {
		case !ok:
			d = append(d, fmt.Sprintf("item %s not in it", l.SKU))
		case q != l.Qty:
			d = append(d, fmt.Sprintf("item %s: quantity %d, not %d", l.SKU, q, l.Qty))
		}
		delete(had, l.SKU)
	}
	for _, l := range recorded {
		if _, ok := had[l.SKU]; ok {
			d = append(d, fmt.Sprintf("item %s in it too", l.SKU))
			delete(had, l.SKU)
		}
	}
	if len(d) > 3 {
		d = append(d[:3], "…")
	}
	return strings.Join(d, "; ")
}
