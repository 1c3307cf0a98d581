package protocol

import (
	"errors"
	"strconv"
	"strings"
)

// CartLine is one item of a cart record.
type CartLine struct {
	SKU string
	Qty int64
}

// EncodeCart is a cart as the cart log records it: "K{user}|sku:qty|sku:qty...", with the lines
// as given (the caller sorts them by SKU). The user is part of it, so the same cart id with
// another user is another cart. No name contains a brace or '|'.
func EncodeCart(kind, user string, lines []CartLine) string {
	var b strings.Builder
	b.WriteString(kind)
	b.WriteByte('{')
	b.WriteString(user)
	b.WriteByte('}')
	for _, l := range lines {
		b.WriteByte('|') // '|' is the one separator no SKU may contain
		b.WriteString(l.SKU)
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(l.Qty, 10))
	}
	return b.String()
}

var errCart = errors.New("malformed cart record")

// ParseCartRecord reads a cart log record, "state|started|K{user}|sku:qty|sku:qty...[|{cause}]",
// as lua/cart.lua writes it from EncodeCart. No SKU contains '|' or a brace, and the quantity
// follows the last ':'. A record written before carts recorded their user has "K" alone.
func ParseCartRecord(rec string) (kind, user string, lines []CartLine, err error) {
	parts := strings.Split(rec, "|")
	if len(parts) < 4 {
		return "", "", nil, errCart
	}
	head, fields := parts[2], parts[3:]
	if i := strings.IndexByte(head, '{'); i >= 0 {
		if !strings.HasSuffix(head, "}") {
			return "", "", nil, errCart
		}
		kind, user = head[:i], head[i+1:len(head)-1]
	} else {
		kind = head
	}
	if kind != "D" && kind != "H" {
		return "", "", nil, errCart
	}
	if last := fields[len(fields)-1]; strings.HasPrefix(last, "{") {
		fields = fields[:len(fields)-1] // the undo's cause
	}
	if len(fields) == 0 {
		return "", "", nil, errCart
	}
	for _, f := range fields {
		i := strings.LastIndexByte(f, ':')
		if i <= 0 {
			return "", "", nil, errCart
		}
		q, perr := strconv.ParseInt(f[i+1:], 10, 64)
		if perr != nil || q <= 0 {
			return "", "", nil, errCart
		}
		lines = append(lines, CartLine{SKU: f[:i], Qty: q})
	}
	return kind, user, lines, nil
}

// EncodeCause is how the cart log records why a cart was undone: "code:sku", the reply code of
// the item that refused.
func EncodeCause(code int64, sku string) string {
	return strconv.FormatInt(code, 10) + ":" + sku
}

// ParseCause reads a cause written by EncodeCause; ok is false for anything else ("" for a
// cart undone by recovery).
func ParseCause(why string) (code int64, sku string, ok bool) {
	c, sku, ok := strings.Cut(why, ":")
	if !ok {
		return 0, "", false
	}
	code, err := strconv.ParseInt(c, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return code, sku, true
}
