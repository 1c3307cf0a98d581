// Package eventwire is the JSON payload of a stock event as the queue adapters write and read
// it: the JSON of stocktype.Event, decoded strictly.
package eventwire

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/stockres/stock/internal/errs"
	"github.com/stockres/stock/stocktype"
)

// wire is the payload as Decode reads it: pointers tell a missing field from a zero one.
type wire struct {
	Type *stocktype.EventType `json:"type"`
	SKU  *string              `json:"sku"`
	ID   *string              `json:"id"`
	User string               `json:"user"`
	Qty  *int64               `json:"qty"`
	At   *time.Time           `json:"at"`
	Seq  int64                `json:"seq"`
}

// Check returns an error wrapping stock.ErrInvalid (errs.ErrInvalid) for an event no adapter
// publishes: no type, SKU or id, or a quantity out of range.
func Check(ev stocktype.Event) error {
	switch {
	case ev.Type == "":
		return fmt.Errorf("%w: empty event type", errs.ErrInvalid)
	case ev.SKU == "":
		return fmt.Errorf("%w: empty sku", errs.ErrInvalid)
	case ev.ID == "":
		return fmt.Errorf("%w: empty id", errs.ErrInvalid)
	case ev.Qty < 0 || ev.Qty > stocktype.MaxQty:
		return fmt.Errorf("%w: qty %d out of range [0, %d]", errs.ErrInvalid, ev.Qty, stocktype.MaxQty)
	case ev.Seq < 0:
		return fmt.Errorf("%w: negative seq %d", errs.ErrInvalid, ev.Seq)
	}
	return nil
}

// Encode checks ev and returns its payload. pkg names the caller in errors.
func Encode(pkg string, ev stocktype.Event) ([]byte, error) {
	if err := Check(ev); err != nil {
		return nil, fmt.Errorf("%s: publish %s/%s %s: %w", pkg, ev.SKU, ev.ID, ev.Type, err)
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("%s: publish %s/%s %s: encode: %w", pkg, ev.SKU, ev.ID, ev.Type, err)
	}
	return data, nil
}

// Decode parses a payload written by Encode. The payload must be one JSON object with a
// non-empty "type", "sku" and "id", a "qty" between 0 and stocktype.MaxQty, and an "at" time;
// "user" and "seq" (not negative; 0 when absent) are optional and unknown fields are ignored.
// Anything else gives an error wrapping errs.ErrInvalid. pkg names the caller in errors.
func Decode(pkg string, msg []byte) (stocktype.Event, error) {
	var w wire
	if err := json.Unmarshal(msg, &w); err != nil {
		return stocktype.Event{}, fmt.Errorf("%w: %s: decode event: %v", errs.ErrInvalid, pkg, err)
	}
	var missing []string
	if w.Type == nil || *w.Type == "" {
		missing = append(missing, "type")
	}
	if w.SKU == nil || *w.SKU == "" {
		missing = append(missing, "sku")
	}
	if w.ID == nil || *w.ID == "" {
		missing = append(missing, "id")
	}
	if w.Qty == nil {
		missing = append(missing, "qty")
	}
	if w.At == nil {
		missing = append(missing, "at")
	}
	if len(missing) > 0 {
		return stocktype.Event{}, fmt.Errorf("%w: %s: decode event: missing or empty %s",
			errs.ErrInvalid, pkg, strings.Join(missing, ", "))
	}
	ev := stocktype.Event{Type: *w.Type, SKU: *w.SKU, ID: *w.ID, User: w.User, Qty: *w.Qty, At: *w.At, Seq: w.Seq}
	if err := Check(ev); err != nil {
		return stocktype.Event{}, fmt.Errorf("%s: decode event %s/%s %s: %w", pkg, ev.SKU, ev.ID, ev.Type, err)
	}
	return ev, nil
}

// Escape escapes s for a name part that must hold only ASCII letters, digits, '-' and '_': every
// other byte becomes "%XX" (upper-case hex), so that distinct strings stay distinct and
// url.PathUnescape reverses it. Escape("") is "".
func Escape(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !safe(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if safe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

func safe(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}
