// Package faultproxy is a TCP proxy for tests that puts network faults between a client and a
// Redis server: added latency, connections reset, replies lost after their command ran, and
// blackholes (a partition that heals).
//
// A Proxy listens on a free 127.0.0.1 port and forwards every connection it accepts to its
// target address (set by Start, changed by SetTarget), on a connection of its own. Faults are switched at any time, from any
// goroutine:
//
//   - SetLatency delays every chunk of bytes, in each direction, by a fixed time (a slow link:
//     pipelined commands still overlap).
//   - ResetAll resets every open connection at once (TCP RST to the client).
//   - DropReplies makes the next n commands (optionally only those with given names) reach
//     the server and run, and then breaks their connection instead of delivering their reply:
//     the "unknown outcome" a client must resolve by retrying with the same idempotency key.
//     Replies to earlier commands are delivered first; commands the client pipelined after
//     the doomed one are not forwarded (they never run).
//   - Blackhole stops every byte, in both directions and on new connections too, for a while;
//     then everything held back flows again, in order, as TCP would after a partition heals.
//   - SetTarget sends the connections accepted from then on to another address (a failover:
//     clients re-pointed to a promoted replica); with ResetAll, every client reconnects there.
//
// The proxy frames RESP (RESP2 and RESP3) to count the commands and replies of each
// connection, which DropReplies needs; RESP3 pushes answer no command and are not counted.
// It assumes one reply per command, as in request/response traffic (not SUBSCRIBE, MONITOR or
// CLIENT REPLY OFF). Bytes that are not RESP are forwarded as they are, and replies on such a
// connection are never dropped.
package faultproxy

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts what a proxy did.
type Stats struct {
	Accepted       int   // connections accepted
	Reset          int   // connections reset by ResetAll
	DroppedReplies int   // replies dropped by DropReplies (their connection was broken)
	Blackholes     int   // calls of Blackhole
	Retargets      int   // calls of SetTarget
	Commands       int64 // commands forwarded to the target
	Replies        int64 // replies delivered to clients
}

// Proxy forwards connections from Addr to a target with switchable faults. Its methods are
// safe for concurrent use. Create one with Start; Close it when done.
type Proxy struct {
	ln net.Listener

	mu        sync.Mutex
	target    string
	links     map[*link]struct{}
	latency   time.Duration
	drops     int             // replies still to drop
	dropNames map[string]bool // upper-case names of the commands that may be dropped; nil: any
	holdUntil time.Time       // end of the current blackhole
	heal      chan struct{}   // closed when the current blackhole ends; nil when there is none
	closed    bool
	stats     Stats

	commands, replies atomic.Int64
	wg                sync.WaitGroup
}

// Start listens on 127.0.0.1:0 and forwards every connection to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address new connections are forwarded to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// SetTarget forwards the connections accepted from now on (and those still waiting to dial,
// e.g. held by a blackhole) to target. Open connections keep their server: ResetAll makes their
// clients connect again, to the new target.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	p.stats.Retargets++
}

// SetLatency delays every chunk of bytes read from then on, in each direction, by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = max(d, 0)
}

// ResetAll resets every open connection now and returns how many it reset. Clients may
// connect again at once.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	p.stats.Reset += len(ls)
	p.mu.Unlock()
	for _, l := range ls {
		l.close(true)
	}
	return len(ls)
}

// DropReplies arms n more reply drops: each of the next n commands (of any connection) whose
// name is one of commands (case-insensitive; any command when none is given) is forwarded to
// the target, and when its reply comes back the reply is discarded and the connection is
// closed (after the replies before it were delivered). The names given replace those of
// earlier calls.
func (p *Proxy) DropReplies(n int, commands ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops += max(n, 0)
	p.dropNames = nil
	if len(commands) > 0 {
		p.dropNames = map[string]bool{}
		for _, c := range commands {
			p.dropNames[strings.ToUpper(c)] = true
		}
	}
}

// PendingDrops returns the drops armed by DropReplies that no command has used yet.
func (p *Proxy) PendingDrops() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drops
}

// CancelDrops disarms the drops no command has used yet.
func (p *Proxy) CancelDrops() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops = 0
}

// Blackhole holds back every byte, in both directions, for d from now (extending a blackhole
// under way): connections stay open and new ones are accepted, but nothing reaches the target
// or the clients until it ends; then the bytes held back are delivered in order. It returns at
// once.
func (p *Proxy) Blackhole(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Blackholes++
	until := time.Now().Add(d)
	if until.After(p.holdUntil) {
		p.holdUntil = until
	}
	if p.heal == nil {
		p.heal = make(chan struct{})
		time.AfterFunc(d, p.endBlackhole)
	}
}

// Heal ends a blackhole now.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdUntil = time.Time{}
	if p.heal != nil {
		close(p.heal)
		p.heal = nil
	}
}

func (p *Proxy) endBlackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.heal == nil {
		return // healed already
	}
	if left := time.Until(p.holdUntil); left > 0 { // extended
		time.AfterFunc(left, p.endBlackhole)
		return
	}
	close(p.heal)
	p.heal = nil
}

// Stats returns the counts so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Commands, s.Replies = p.commands.Load(), p.replies.Load()
	return s
}

// Close stops listening, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Heal()
	p.mu.Lock()
	for l := range p.links {
		l.close(false)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{p: p, client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.links[l] = struct{}{}
		p.stats.Accepted++
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// open waits out a blackhole; false when l closed meanwhile.
func (p *Proxy) open(l *link) bool {
	for {
		p.mu.Lock()
		heal := p.heal
		p.mu.Unlock()
		if heal == nil {
			return true
		}
		select {
		case <-heal:
		case <-l.done:
			return false
		}
	}
}

// takeDrop reports whether the reply of a command named name is to be dropped, and uses up
// one armed drop if so.
func (p *Proxy) takeDrop(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drops == 0 || (p.dropNames != nil && !p.dropNames[strings.ToUpper(name)]) {
		return false
	}
	p.drops--
	return true
}

func (p *Proxy) delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency
}

// link is one client connection and its connection to the target.
type link struct {
	p      *Proxy
	client net.Conn

	mu     sync.Mutex
	server net.Conn
	once   sync.Once
	done   chan struct{} // closed when the link is closed

	raw    atomic.Bool  // the client's bytes are not RESP: forwarded without counting
	doomed atomic.Int64 // the number (from 1) of the command whose reply is dropped; 0: none
}

// chunk is bytes on their way in one direction.
type chunk struct {
	data  []byte
	due   time.Time
	reset bool // after data, close the link: the reply that follows is dropped
}

func (l *link) run() {
	p := l.p
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	defer l.close(false)
	if !p.open(l) {
		return
	}
	s, err := net.DialTimeout("tcp", p.Target(), 5*time.Second)
	if err != nil {
		return
	}
	l.mu.Lock()
	l.server = s
	l.mu.Unlock()
	select {
	case <-l.done: // reset while dialing
		s.Close()
		return
	default:
	}
	up, down := make(chan chunk, 64), make(chan chunk, 64)
	var wg sync.WaitGroup
	wg.Go(func() { l.readCommands(up) })
	wg.Go(func() { l.write(s, up) })
	wg.Go(func() { l.readReplies(s, down) })
	wg.Go(func() { l.write(l.client, down) })
	wg.Wait()
}

// close closes both connections, with a TCP reset if reset is set.
func (l *link) close(reset bool) {
	l.once.Do(func() {
		l.mu.Lock()
		conns := []net.Conn{l.client, l.server}
		l.mu.Unlock()
		for _, c := range conns {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
		close(l.done)
	})
}

// send hands a chunk to a writer; false when the link is closed.
func (l *link) send(ch chan<- chunk, c chunk) bool {
	select {
	case ch <- c:
		return true
	case <-l.done:
		return false
	}
}

// readCommands reads the client's bytes and forwards complete commands, numbering them, until
// a command whose reply is to be dropped: the bytes after it are not forwarded.
func (l *link) readCommands(out chan<- chunk) {
	var seq int64
	l.pump(l.client, out, func() bool { return l.doomed.Load() == 0 }, func(b []byte) (int, verdict, error) {
		m, name, err := command(b)
		if err != nil || m == 0 {
			return m, forward, err
		}
		seq++
		l.p.commands.Add(1)
		if l.p.takeDrop(name) {
			l.doomed.Store(seq)
			return m, last, nil
		}
		return m, forward, nil
	})
}

// readReplies reads the target's bytes and forwards complete replies, numbering them (pushes
// are not numbered); at the doomed command's reply it forwards what came before and resets.
func (l *link) readReplies(s net.Conn, out chan<- chunk) {
	var seq int64
	l.pump(s, out, func() bool { return true }, func(b []byte) (int, verdict, error) {
		m, push, err := frame(b)
		if err != nil || m == 0 || push {
			return m, forward, err
		}
		seq++
		if d := l.doomed.Load(); d != 0 && seq >= d {
			return m, cut, nil // this reply and anything after it are dropped
		}
		l.p.replies.Add(1)
		return m, forward, nil
	})
}

// verdict says what pump does with a frame.
type verdict int

const (
	forward verdict = iota // forward it and read on
	last                   // forward it, and end the chunk there
	cut                    // forward nothing from it on, and reset the connection
)

// pump reads src and sends its bytes on out in chunks of whole frames, each due after the
// proxy's delay, while open says so. next returns the length of the first frame of b (0: not
// complete yet) and what to do with it; an error in the framing makes the link forward the
// rest as it comes, uncounted. It closes out when src ends or a chunk cut the link.
func (l *link) pump(src net.Conn, out chan<- chunk, open func() bool, next func(b []byte) (int, verdict, error)) {
	defer close(out) // the writer delivers what is left, then closes the link
	var pending []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && open() {
			c := chunk{due: time.Now().Add(l.p.delay())}
			if l.raw.Load() {
				c.data = append([]byte(nil), buf[:n]...)
			} else {
				pending = append(pending, buf[:n]...)
				used := 0
			scan:
				for {
					m, v, ferr := next(pending[used:])
					switch {
					case ferr != nil:
						l.raw.Store(true) // forward the rest as is, uncounted
						used = len(pending)
						break scan
					case m == 0:
						break scan
					case v == cut:
						c.reset = true
						break scan
					}
					used += m
					if v == last {
						break scan
					}
				}
				c.data = append([]byte(nil), pending[:used]...)
				pending = append(pending[:0], pending[used:]...)
			}
			if (len(c.data) > 0 || c.reset) && !l.send(out, c) {
				return
			}
			if c.reset {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write delivers chunks to dst when they are due and no blackhole holds them. When its reader
// is done, it closes the link.
func (l *link) write(dst net.Conn, in <-chan chunk) {
	defer l.close(false)
	for c := range in {
		if !l.p.open(l) {
			return
		}
		if d := time.Until(c.due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
		}
		if len(c.data) > 0 {
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
		if c.reset {
			// A plain close, not a TCP reset: the replies written just before must arrive.
			l.p.mu.Lock()
			l.p.stats.DroppedReplies++
			l.p.mu.Unlock()
			return
		}
	}
}
