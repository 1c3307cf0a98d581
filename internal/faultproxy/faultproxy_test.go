package faultproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRedis is a RESP server for the tests: PING answers +PONG, INCR key counts, PUSHPING
// answers a RESP3 push and then +PONG, anything else +OK. It counts the commands it ran.
type fakeRedis struct {
	ln  net.Listener
	mu  sync.Mutex
	n   map[string]int
	ran int
	wg  sync.WaitGroup
}

func startFake(t *testing.T) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRedis{ln: ln, n: map[string]int{}}
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeRedis) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		args, err := readCommand(r)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.ran++
		var reply string
		switch strings.ToUpper(args[0]) {
		case "PING":
			reply = "+PONG\r\n"
		case "INCR":
			f.n[args[1]]++
			reply = ":" + strconv.Itoa(f.n[args[1]]) + "\r\n"
		case "PUSHPING":
			reply = ">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n+PONG\r\n"
		default:
			reply = "+OK\r\n"
		}
		f.mu.Unlock()
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

func (f *fakeRedis) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n[key]
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if line[0] != '*' {
		return strings.Fields(line), nil
	}
	n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
	args := make([]string, n)
	for i := range args {
		if line, err = r.ReadString('\n'); err != nil {
			return nil, err
		}
		l, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:l])
	}
	return args, nil
}

func resp(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

type client struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *client {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, r: bufio.NewReader(c)}
}

func (c *client) send(cmds ...string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, strings.Join(cmds, "")); err != nil {
		c.t.Fatal(err)
	}
}

// line reads one reply line within d.
func (c *client) line(d time.Duration) (string, error) {
	c.c.SetReadDeadline(time.Now().Add(d))
	s, err := c.r.ReadString('\n')
	return strings.TrimSuffix(s, "\r\n"), err
}

// want reads one reply line per want, each within 5s, and fails the test unless they match.
func (c *client) want(want ...string) {
	c.t.Helper()
	for _, w := range want {
		got, err := c.line(5 * time.Second)
		if err != nil || got != w {
			c.t.Fatalf("reply %q, %v; want %q", got, err, w)
		}
	}
}

// setup starts a fake server, a proxy to it and a client of the proxy.
func setup(t *testing.T) (*fakeRedis, *Proxy, *client) {
	t.Helper()
	f := startFake(t)
	p := startProxy(t, f.ln.Addr().String())
	return f, p, dial(t, p)
}

func TestForward(t *testing.T) {
	_, p, c := setup(t)
	c.send(resp("PING"), resp("INCR", "a"), resp("INCR", "a"), "PING\r\n") // pipelined, one inline
	c.want("+PONG", ":1", ":2", "+PONG")
	s := p.Stats()
	assert.Equal(t, []int64{4, 4}, []int64{s.Commands, s.Replies}, "commands, replies")
	assert.Equal(t, 1, s.Accepted, "accepted")
}

func TestLatency(t *testing.T) {
	_, p, c := setup(t)
	p.SetLatency(40 * time.Millisecond)
	began := time.Now()
	c.send(resp("PING"))
	c.want("+PONG")
	assert.GreaterOrEqual(t, time.Since(began), 80*time.Millisecond, "round trip with 40ms each way")
	// Pipelined commands overlap: the latency is not paid once per command.
	began = time.Now()
	for range 10 {
		c.send(resp("PING"))
	}
	for range 10 {
		c.want("+PONG")
	}
	assert.LessOrEqual(t, time.Since(began), 400*time.Millisecond, "10 pipelined round trips")
	p.SetLatency(0)
	began = time.Now()
	c.send(resp("PING"))
	c.want("+PONG")
	assert.LessOrEqual(t, time.Since(began), 40*time.Millisecond, "round trip without latency")
}

func TestResetAll(t *testing.T) {
	_, p, c := setup(t)
	c.send(resp("PING"))
	c.want("+PONG")
	assert.Equal(t, 1, p.ResetAll(), "connections reset")
	_, err := c.line(5 * time.Second)
	assert.Error(t, err, "read after reset: want a broken connection")
	assert.NotErrorIs(t, err, errTimeout, "read after reset: want a broken connection")
	c2 := dial(t, p) // the proxy goes on
	c2.send(resp("PING"))
	c2.want("+PONG")
	s := p.Stats()
	assert.Equal(t, []int{1, 2}, []int{s.Reset, s.Accepted}, "reset, accepted")
}

var errTimeout = errors.New("timeout")

// SetTarget moves new connections to another server; an open connection stays on its server
// until it is reset, and then its client reconnects to the new one.
func TestSetTarget(t *testing.T) {
	a, b := startFake(t), startFake(t)
	p := startProxy(t, a.ln.Addr().String())
	c := dial(t, p)
	c.send(resp("INCR", "k"))
	c.want(":1")
	p.SetTarget(b.ln.Addr().String())
	assert.Equal(t, b.ln.Addr().String(), p.Target())
	c.send(resp("INCR", "k")) // the open connection is still on a
	c.want(":2")
	c2 := dial(t, p)
	c2.send(resp("INCR", "k"))
	c2.want(":1")
	p.ResetAll()
	c3 := dial(t, p)
	c3.send(resp("INCR", "k"))
	c3.want(":2")
	assert.Equal(t, []int{2, 2}, []int{a.count("k"), b.count("k")}, "INCR runs on the old target and on the new one")
	s := p.Stats()
	assert.Equal(t, []int{1, 3}, []int{s.Retargets, s.Accepted}, "retargets, accepted")
}

// The command whose reply is dropped runs; the client gets the replies before it and then a
// closed connection; what it pipelined after it never reaches the server.
func TestDropReplies(t *testing.T) {
	f, p, c := setup(t)
	p.DropReplies(1, "incr")
	c.send(resp("PING"), resp("INCR", "a"), resp("INCR", "a"))
	c.want("+PONG")
	got, err := c.line(5 * time.Second)
	require.Error(t, err, "reply %q delivered, want it dropped", got)
	assert.Equal(t, 1, f.count("a"), "INCR runs: once, the one whose reply was dropped")
	assert.Zero(t, p.PendingDrops(), "drops pending")
	c2 := dial(t, p)
	c2.send(resp("INCR", "a"))
	c2.want(":2")
	assert.Equal(t, 1, p.Stats().DroppedReplies)
}

// Only the named commands are dropped, and pushes are not replies.
func TestDropRepliesMatch(t *testing.T) {
	_, p, c := setup(t)
	p.DropReplies(2, "INCR")
	c.send(resp("PUSHPING"), resp("PING"), resp("SET", "k", "v"))
	c.want(">2", "$10", "invalidate", "*1", "$1", "k") // the push, forwarded whole
	c.want("+PONG", "+PONG", "+OK")
	assert.Equal(t, 2, p.PendingDrops(), "drops pending")
	p.CancelDrops()
	c.send(resp("INCR", "b"))
	c.want(":1")
}

func TestBlackhole(t *testing.T) {
	f, p, c := setup(t)
	c.send(resp("PING"))
	c.want("+PONG")
	p.Blackhole(300 * time.Millisecond)
	began := time.Now()
	c.send(resp("INCR", "x"))
	got, err := c.line(100 * time.Millisecond)
	require.Error(t, err, "reply %q during the blackhole", got)
	assert.Zero(t, f.count("x"), "the command reached the server during the blackhole")
	c2 := dial(t, p) // accepted, held back
	c2.send(resp("INCR", "x"))
	// Both are delivered once it healed, in either order: the two connections race.
	r1, err1 := c.line(5 * time.Second)
	r2, err2 := c2.line(5 * time.Second)
	if err1 != nil || err2 != nil || !(r1 == ":1" && r2 == ":2" || r1 == ":2" && r2 == ":1") {
		t.Fatalf("replies %q (%v) and %q (%v); want :1 and :2, one each", r1, err1, r2, err2)
	}
	assert.GreaterOrEqual(t, time.Since(began), 250*time.Millisecond, "replies before the blackhole ended")
	p.Blackhole(time.Hour)
	p.Heal()
	c.send(resp("PING"))
	c.want("+PONG")
}

func TestClose(t *testing.T) {
	f := startFake(t)
	p, err := Start(f.ln.Addr().String())
	require.NoError(t, err)
	c := dial(t, p)
	c.send(resp("PING"))
	c.want("+PONG")
	p.Blackhole(time.Hour)
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	assert.Error(t, err, "the proxy still accepts after Close")
}

func TestFrame(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		push bool
		bad  bool
	}{
		{in: "+OK\r\n", n: 5},
		{in: "+OK\r", n: 0},
		{in: "-ERR x\r\n:1\r\n", n: 8},
		{in: "$3\r\nabc\r\n", n: 9},
		{in: "$3\r\nab", n: 0},
		{in: "$-1\r\n", n: 5},
		{in: "*-1\r\n", n: 5},
		{in: "*2\r\n$1\r\na\r\n:2\r\n", n: 15},
		{in: "*2\r\n$1\r\na\r\n", n: 0},
		{in: "%1\r\n+k\r\n+v\r\n", n: 12},
		{in: "~1\r\n_\r\n", n: 7},
		{in: ",1.5\r\n", n: 6},
		{in: "#t\r\n", n: 4},
		{in: "(123\r\n", n: 6},
		{in: "=7\r\ntxt:abc\r\n", n: 13},
		{in: ">1\r\n+x\r\n", n: 8, push: true},
		{in: "|1\r\n+a\r\n+b\r\n:1\r\n", n: 16},
		{in: "|1\r\n+a\r\n+b\r\n", n: 0},
		{in: "$3\r\nabcd\r\n", bad: true},
		{in: "$?\r\n", bad: true},
		{in: "hello\r\n", bad: true},
	} {
		n, push, err := frame([]byte(tc.in))
		if (err != nil) != tc.bad || n != tc.n || push != tc.push {
			t.Errorf("frame(%q) = %d, %v, %v; want %d, %v, bad %v", tc.in, n, push, err, tc.n, tc.push, tc.bad)
		}
	}
	n, name, err := command([]byte(resp("EVALSHA", "abc", "0") + "*1\r\n"))
	require.NoError(t, err)
	assert.Equal(t, len(resp("EVALSHA", "abc", "0")), n)
	assert.Equal(t, "EVALSHA", name)
}
