package faultproxy

import (
	"bytes"
	"errors"
	"strconv"
)

// errNotRESP says the bytes are not RESP the proxy can frame; the connection is then forwarded
// without counting (and replies on it cannot be dropped).
var errNotRESP = errors.New("faultproxy: not RESP")

// maxDepth bounds the nesting of aggregates the framer follows.
const maxDepth = 64

// frame returns the length of the first complete RESP value in b (RESP2 and RESP3, with an
// attribute ('|') counted as part of the value that follows it), or 0 when b holds only the
// start of one. push reports a RESP3 push ('>'), which answers no command.
func frame(b []byte) (n int, push bool, err error) {
	if len(b) == 0 {
		return 0, false, nil
	}
	push = b[0] == '>'
	end, err := value(b, 0, 0)
	if err != nil || end < 0 {
		return 0, false, err
	}
	if b[0] == '|' { // an attribute: the reply it describes follows
		n, push, err := frame(b[end:])
		if err != nil || n == 0 {
			return 0, false, err
		}
		return end + n, push, nil
	}
	return end, push, nil
}

// command returns the length of the first complete command in b (a RESP array, or an inline
// command ended by '\n'), or 0 when b holds only the start of one, and the command's name.
func command(b []byte) (n int, name string, err error) {
	if len(b) == 0 {
		return 0, "", nil
	}
	if b[0] != '*' { // inline: "PING\r\n"
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return 0, "", nil
		}
		f := bytes.Fields(b[:i])
		if len(f) > 0 {
			name = string(f[0])
		}
		return i + 1, name, nil
	}
	end, err := value(b, 0, 0)
	if err != nil || end < 0 {
		return 0, "", err
	}
	// The name is the first element, a bulk string: "*<n>\r\n$<len>\r\n<name>\r\n".
	if i := bytes.Index(b, crlf); i > 0 && i+2 < end && b[i+2] == '$' {
		rest := b[i+3 : end]
		if j := bytes.Index(rest, crlf); j > 0 {
			if l, err := strconv.Atoi(string(rest[:j])); err == nil && l >= 0 && j+2+l <= len(rest) {
				name = string(rest[j+2 : j+2+l])
			}
		}
	}
	return end, name, nil
}

var crlf = []byte("\r\n")

// value returns the index just past the RESP value starting at b[i], or -1 when b ends before
// it does.
func value(b []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errNotRESP
	}
	if i >= len(b) {
		return -1, nil
	}
	j := bytes.Index(b[i:], crlf)
	if j < 0 {
		return -1, nil
	}
	hdr, next := b[i+1:i+j], i+j+2
	switch b[i] {
	case '+', '-', ':', '_', ',', '#', '(':
		return next, nil
	case '$', '!', '=':
		n, err := length(hdr)
		if err != nil {
			return 0, err
		}
		if n < 0 {
			return next, nil
		}
		end := next + n + 2
		if end > len(b) {
			return -1, nil
		}
		if b[end-2] != '\r' || b[end-1] != '\n' {
			return 0, errNotRESP
		}
		return end, nil
	case '*', '~', '>', '%', '|':
		n, err := length(hdr)
		if err != nil {
			return 0, err
		}
		if b[i] == '%' || b[i] == '|' {
			n *= 2
		}
		for range max(n, 0) {
			if next, err = value(b, next, depth+1); err != nil || next < 0 {
				return next, err
			}
		}
		return next, nil
	}
	return 0, errNotRESP
}

// length parses an aggregate or blob length; -1 is RESP2's null.
func length(hdr []byte) (int, error) {
	n, err := strconv.Atoi(string(hdr))
	if err != nil || n < -1 || n > 512<<20 {
		return 0, errNotRESP // includes RESP3 streamed types ("?"), which Redis never sends
	}
	return n, nil
}
