package natspub_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	"github.com/stockres/stock"
	"github.com/stockres/stock/internal/queuetest"
	"github.com/stockres/stock/internal/redistest"
	"github.com/stockres/stock/internal/testkit"
	"github.com/stockres/stock/memstore"
	"github.com/stockres/stock/natspub"
	"github.com/stockres/stock/sqlstore"
	"github.com/stockres/stock/stockops"
	"github.com/stockres/stock/stocktest"
)

// ---- tests that need no server ----

var specialSKUs = []string{
	"a.b", "x*y", "p>q", ">", "*", "a.>", "a b", "tab\there", "a/b", "100%", "%2E", "ü.ß",
	"", "line\nbreak", "$JS.API", "..", "sku-42_ok",
}

func TestToken(t *testing.T) {
	assert.Equal(t, "sku-42_OK", natspub.Token("sku-42_OK"))
	assert.Equal(t, "a%2Eb", natspub.Token("a.b"))
	assert.Equal(t, "%2A", natspub.Token("*"))
	assert.Equal(t, "%3E", natspub.Token(">"))
	assert.Equal(t, "a%20b", natspub.Token("a b"))
	assert.Equal(t, "100%25", natspub.Token("100%"))
	assert.Equal(t, "", natspub.Token(""))

	seen := map[string]string{}
	for _, s := range specialSKUs {
		tok := natspub.Token(s)
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
				c == '-' || c == '_' || c == '%'
			assert.Truef(t, ok, "token %q of %q has byte %q", tok, s, c)
		}
		back, err := url.PathUnescape(tok)
		require.NoError(t, err, tok)
		assert.Equal(t, s, back, "PathUnescape reverses Token")
		assert.NotContains(t, seen, tok, "Token(%q) == Token(%q) == %q", s, seen[tok], tok)
		seen[tok] = s
	}
}

func TestSubject(t *testing.T) {
	assert.Equal(t, "stock.events.deducted.sku-1",
		natspub.Subject(natspub.DefaultPrefix, stock.EventDeducted, "sku-1"))
	assert.Equal(t, "p.q.restored.a%2Eb%2Ac%3E",
		natspub.Subject("p.q", stock.EventRestored, "a.b*c>"))
	for _, sku := range specialSKUs {
		if sku == "" {
			continue
		}
		subj := natspub.Subject("x.y", stock.EventHeld, sku)
		toks := strings.Split(subj, ".")
		require.Lenf(t, toks, 4, "subject %q of sku %q", subj, sku)
		assert.NotContains(t, []string{"*", ">"}, toks[3])
		assert.False(t, strings.ContainsAny(subj, " \t\r\n"), subj)
	}
}

func TestMsgID(t *testing.T) {
	ev := stock.Event{Type: stock.EventDeducted, SKU: "sku-1", ID: "req-9"}
	assert.Equal(t, "sku-1/req-9/deducted", natspub.MsgID(ev))

	// A '/' in a SKU or id must not make two different events share an id.
	a := stock.Event{Type: stock.EventDeducted, SKU: "a/b", ID: "c"}
	b := stock.Event{Type: stock.EventDeducted, SKU: "a", ID: "b/c"}
	assert.NotEqual(t, natspub.MsgID(a), natspub.MsgID(b))
	// Each type of one id is a different event.
	c := a
	c.Type = stock.EventRestored
	assert.NotEqual(t, natspub.MsgID(a), natspub.MsgID(c))
	// Every copy of one event has the same id.
	d := a
	d.Qty, d.User, d.At = 7, "u", time.Now()
	assert.Equal(t, natspub.MsgID(a), natspub.MsgID(d))
}

func TestDecode(t *testing.T) {
	ev := stock.Event{
		Type: stock.EventDeducted, SKU: "a.b*c>", ID: "req/1", User: "u1", Qty: 3,
		At: time.UnixMilli(1_700_000_000_123).UTC(), Seq: 42,
	}
	data, err := json.Marshal(ev)
	require.NoError(t, err)
	got, err := natspub.Decode(data)
	require.NoError(t, err)
	assert.Equal(t, ev, got)

	// Optional user, qty 0, unknown type and unknown fields are accepted.
	got, err = natspub.Decode([]byte(`{"type":"future","sku":"s","id":"i","qty":0,"at":"2024-01-02T03:04:05Z","extra":1}`))
	require.NoError(t, err)
	assert.Equal(t, stock.Event{Type: "future", SKU: "s", ID: "i", At: time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)}, got)

	bad := map[string]string{
		"empty":          ``,
		"garbage":        `garbage`,
		"binary":         "\x00\xff\x01",
		"array":          `[1,2]`,
		"null":           `null`,
		"empty object":   `{}`,
		"string":         `"deducted"`,
		"truncated":      `{"type":"deducted","sku":"s"`,
		"trailing":       `{"type":"deducted","sku":"s","id":"i","qty":1,"at":"2024-01-02T03:04:05Z"} x`,
		"no type":        `{"sku":"s","id":"i","qty":1,"at":"2024-01-02T03:04:05Z"}`,
		"empty sku":      `{"type":"deducted","sku":"","id":"i","qty":1,"at":"2024-01-02T03:04:05Z"}`,
		"no id":          `{"type":"deducted","sku":"s","qty":1,"at":"2024-01-02T03:04:05Z"}`,
		"no qty":         `{"type":"deducted","sku":"s","id":"i","at":"2024-01-02T03:04:05Z"}`,
		"no at":          `{"type":"deducted","sku":"s","id":"i","qty":1}`,
		"negative qty":   `{"type":"deducted","sku":"s","id":"i","qty":-1,"at":"2024-01-02T03:04:05Z"}`,
		"huge qty":       `{"type":"deducted","sku":"s","id":"i","qty":9007199254740992,"at":"2024-01-02T03:04:05Z"}`,
		"string qty":     `{"type":"deducted","sku":"s","id":"i","qty":"1","at":"2024-01-02T03:04:05Z"}`,
		"bad at":         `{"type":"deducted","sku":"s","id":"i","qty":1,"at":"yesterday"}`,
		"null fields":    `{"type":null,"sku":null,"id":null,"qty":null,"at":null}`,
		"numeric sku":    `{"type":"deducted","sku":5,"id":"i","qty":1,"at":"2024-01-02T03:04:05Z"}`,
		"fractional qty": `{"type":"deducted","sku":"s","id":"i","qty":1.5,"at":"2024-01-02T03:04:05Z"}`,
		"negative seq":   `{"type":"deducted","sku":"s","id":"i","qty":1,"at":"2024-01-02T03:04:05Z","seq":-1}`,
		"string seq":     `{"type":"deducted","sku":"s","id":"i","qty":1,"at":"2024-01-02T03:04:05Z","seq":"1"}`,
	}
	for name, payload := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := natspub.Decode([]byte(payload))
			require.ErrorIs(t, err, stock.ErrInvalid)
			assert.ErrorContains(t, err, "natspub: decode event")
		})
	}
	_, err = natspub.Decode([]byte(`{"sku":"s","id":"","qty":1}`))
	require.ErrorContains(t, err, "missing or empty type, id, at")
}

func TestNewValidates(t *testing.T) {
	_, err := natspub.New(nil)
	assert.ErrorIs(t, err, stock.ErrInvalid)

	js := &fakeJS{}
	for _, prefix := range []string{"", ".a", "a.", "a..b", "a.*", "a.>", "a b", "a.b*", "x\ty"} {
		_, err := natspub.New(js, natspub.WithPrefix(prefix))
		assert.ErrorIsf(t, err, stock.ErrInvalid, "prefix %q", prefix)
	}
	for _, name := range []string{"", "a.b", "a*", "a>", "a/b", "a b"} {
		_, err := natspub.New(js, natspub.WithStream(name))
		assert.ErrorIsf(t, err, stock.ErrInvalid, "stream %q", name)
	}
	_, err = natspub.New(js, natspub.WithTimeout(-time.Second))
	assert.ErrorIs(t, err, stock.ErrInvalid)

	p, err := natspub.New(js)
	require.NoError(t, err)
	assert.Equal(t, natspub.DefaultPrefix, p.Prefix())
	p, err = natspub.New(js, natspub.WithPrefix("shop.stock"), natspub.WithStream("S"), natspub.WithTimeout(time.Second))
	require.NoError(t, err)
	assert.Equal(t, "shop.stock", p.Prefix())

	_, err = natspub.EnsureStream(context.Background(), nil, "S", "p")
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = natspub.EnsureStream(context.Background(), js, "a.b", "p")
	assert.ErrorIs(t, err, stock.ErrInvalid)
	_, err = natspub.EnsureStream(context.Background(), js, "S", "p.>")
	assert.ErrorIs(t, err, stock.ErrInvalid)
}

// fakeJS records Publish calls; every other method panics (nil embedded interface).
type fakeJS struct {
	jetstream.JetStream
	mu       sync.Mutex
	subjects []string
	payloads [][]byte
	nopts    []int
	deadline []bool
	err      error
}

func (f *fakeJS) Publish(ctx context.Context, subj string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := ctx.Deadline()
	f.subjects = append(f.subjects, subj)
	f.payloads = append(f.payloads, data)
	f.nopts = append(f.nopts, len(opts))
	f.deadline = append(f.deadline, ok)
	if f.err != nil {
		return nil, f.err
	}
	return &jetstream.PubAck{Stream: "S", Sequence: 1}, nil
}

func TestPublishWithoutServer(t *testing.T) {
	ctx := context.Background()
	js := &fakeJS{}
	p, err := natspub.New(js, natspub.WithPrefix("shop"))
	require.NoError(t, err)

	ev := stock.Event{Type: stock.EventRestocked, SKU: "a.b", ID: "r1", Qty: 5, At: time.UnixMilli(1).UTC()}
	require.NoError(t, p.Publish(ctx, ev))
	require.Len(t, js.subjects, 1)
	assert.Equal(t, "shop.restocked.a%2Eb", js.subjects[0])
	assert.Equal(t, 1, js.nopts[0], "the msg id option only")
	assert.False(t, js.deadline[0], "no timeout of its own by default")
	got, err := natspub.Decode(js.payloads[0])
	require.NoError(t, err)
	assert.Equal(t, ev, got)

	// Invalid events never reach JetStream.
	for _, bad := range []stock.Event{
		{SKU: "s", ID: "i", Qty: 1},
		{Type: stock.EventDeducted, ID: "i", Qty: 1},
		{Type: stock.EventDeducted, SKU: "s", Qty: 1},
		{Type: stock.EventDeducted, SKU: "s", ID: "i", Qty: -1},
	} {
		err := p.Publish(ctx, bad)
		assert.ErrorIs(t, err, stock.ErrInvalid)
	}
	assert.Len(t, js.subjects, 1)

	// WithStream adds the expected-stream option; WithTimeout bounds the call.
	p, err = natspub.New(js, natspub.WithStream("S"), natspub.WithTimeout(time.Second))
	require.NoError(t, err)
	require.NoError(t, p.Publish(ctx, ev))
	assert.Equal(t, 2, js.nopts[1])
	assert.True(t, js.deadline[1])

	// Errors are wrapped.
	js.err = jetstream.ErrNoStreamResponse
	err = p.Publish(ctx, ev)
	require.ErrorIs(t, err, jetstream.ErrNoStreamResponse)
	assert.ErrorContains(t, err, "natspub: publish a.b/r1 restocked")

	// A PublisherFunc-style use as a stock.Publisher.
	var _ stock.Publisher = p
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestPublishServerUnreachable(t *testing.T) {
	url := "nats://" + closedPort(t)

	// A plain connect fails fast.
	start := time.Now()
	_, err := nats.Connect(url, nats.Timeout(500*time.Millisecond), nats.MaxReconnects(0))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)

	// A connection that keeps retrying in the background: Publish fails, it does not hang.
	nc, err := nats.Connect(url,
		nats.Timeout(200*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond),
	)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.False(t, nc.IsConnected())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	p, err := natspub.New(js)
	require.NoError(t, err)
	ev := stock.Event{Type: stock.EventDeducted, SKU: "s", ID: "i", Qty: 1, At: time.Now()}
	start = time.Now()
	err = p.Publish(context.Background(), ev)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Contains(t, err.Error(), "natspub: publish s/i deducted")

	// And on a closed connection it fails at once.
	nc.Close()
	start = time.Now()
	err = p.Publish(context.Background(), ev)
	require.Error(t, err)
	assert.Less(t, time.Since(start), time.Second)
}

// silentServer is a loopback NATS server that completes the handshake and answers PINGs, but
// never answers a request: a server whose JetStream is gone. It returns its URL.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				info := `INFO {"server_id":"silent","server_name":"silent","version":"2.10.0","proto":1,` +
					`"headers":true,"max_payload":1048576,"host":"127.0.0.1","port":0}` + "\r\n"
				if _, err := c.Write([]byte(info)); err != nil {
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if strings.TrimRight(line, "\r\n") == "PING" {
						if _, err := c.Write([]byte("PONG\r\n")); err != nil {
							return
						}
					}
				}
			})
		}
	})
	return "nats://" + l.Addr().String()
}

// TestPublishServerSilent: against a server whose JetStream never answers, Publish is bounded
// by the caller's deadline, by WithTimeout, or by the JetStream context's default timeout,
// and a cancelled context fails at once.
func TestPublishServerSilent(t *testing.T) {
	nc, err := nats.Connect(silentServer(t), nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	jsShort, err := jetstream.New(nc, jetstream.WithDefaultTimeout(300*time.Millisecond))
	require.NoError(t, err)
	ev := stock.Event{Type: stock.EventDeducted, SKU: "s", ID: "i", Qty: 1, At: time.Now()}
	for _, tc := range []struct {
		name    string
		js      jetstream.JetStream
		opts    []natspub.Option
		timeout time.Duration // of the caller's context; 0: none
	}{
		{name: "caller's deadline", js: js, timeout: 300 * time.Millisecond},
		{name: "WithTimeout", js: js, opts: []natspub.Option{natspub.WithTimeout(300 * time.Millisecond)}},
		{name: "JetStream default timeout", js: jsShort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := natspub.New(tc.js, tc.opts...)
			require.NoError(t, err)
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			start := time.Now()
			assert.ErrorIs(t, p.Publish(ctx, ev), context.DeadlineExceeded)
			assert.Less(t, time.Since(start), 3*time.Second)
		})
	}
	p, err := natspub.New(jsShort)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, p.Publish(ctx, ev), context.Canceled)
}

// ---- tests against a real NATS server (STOCK_TEST_NATS) ----

type env struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	prefix string
}

func randSuffix(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

// newEnv connects to STOCK_TEST_NATS and creates a stream of its own, deleted at cleanup. It
// skips when the variable is unset, and fails (never skips) when the server is unreachable.
func newEnv(t testing.TB) *env {
	t.Helper()
	url := os.Getenv("STOCK_TEST_NATS")
	if url == "" {
		t.Skip("STOCK_TEST_NATS not set")
	}
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second), nats.MaxReconnects(0))
	require.NoError(t, err, "STOCK_TEST_NATS=%s: connect", url)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, testkit.Err(js.AccountInfo(ctx)), "STOCK_TEST_NATS=%s: JetStream unavailable", url)
	sfx := randSuffix(t)
	e := &env{nc: nc, js: js, stream: "STOCKTEST_" + sfx, prefix: "stocktest." + sfx}
	_, err = natspub.EnsureStream(ctx, js, e.stream, e.prefix)
	require.NoError(t, err)
	e.deleteAtCleanup(t, e.stream)
	return e
}

// deleteAtCleanup deletes the stream name, if there is one, when the test ends.
func (e *env) deleteAtCleanup(t testing.TB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
}

func (e *env) publisher(t testing.TB, opts ...natspub.Option) *natspub.Publisher {
	t.Helper()
	p, err := natspub.New(e.js, append([]natspub.Option{natspub.WithPrefix(e.prefix)}, opts...)...)
	require.NoError(t, err)
	return p
}

func (e *env) msgs(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.stream)
	require.NoError(t, err)
	return s.CachedInfo().State.Msgs
}

// consume reads n messages with an ephemeral pull consumer (filtered by filter, if not
// empty), acks them, and returns them.
func (e *env) consume(t *testing.T, n int, filter string) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cons, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
		AckPolicy:     jetstream.AckExplicitPolicy,
		FilterSubject: filter,
	})
	require.NoError(t, err)
	var out []jetstream.Msg
	for len(out) < n && ctx.Err() == nil {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			require.NoError(t, m.Ack())
			out = append(out, m)
		}
		require.NoError(t, batch.Error())
	}
	require.Len(t, out, n)
	// Nothing more.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
	require.NoError(t, err)
	for m := range batch.Messages() {
		t.Errorf("unexpected extra message on %s: %s", m.Subject(), m.Data())
	}
	return out
}

// durable creates the durable pull consumer "store" of every event of the env's stream, whose
// unacknowledged messages are redelivered after ackWait.
func (e *env) durable(t testing.TB, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	cons, err := e.js.CreateOrUpdateConsumer(context.Background(), e.stream, jetstream.ConsumerConfig{
		Durable:       "store",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		FilterSubject: e.prefix + ".>",
	})
	require.NoError(t, err)
	return cons
}

// decode is natspub.Decode of data, failing the test on an error.
func decode(t *testing.T, data []byte) stock.Event {
	t.Helper()
	ev, err := natspub.Decode(data)
	require.NoError(t, err)
	return ev
}

func event(typ stock.EventType, sku, id string, qty int64) stock.Event {
	return stock.Event{Type: typ, SKU: sku, ID: id, User: "u-" + id, Qty: qty,
		At: time.UnixMilli(time.Now().UnixMilli()).UTC()}
}

func TestPublishConsume(t *testing.T) {
	e := newEnv(t)
	p := e.publisher(t, natspub.WithStream(e.stream))
	ctx := context.Background()

	types := []stock.EventType{stock.EventDeducted, stock.EventRestored, stock.EventRestocked,
		stock.EventHeld, stock.EventConfirmed, stock.EventCancelled, stock.EventExpired, stock.EventRefused}
	const n = 60
	want := make([]stock.Event, n)
	for i := range want {
		want[i] = event(types[i%len(types)], fmt.Sprintf("sku-%d", i%4), fmt.Sprintf("req-%03d", i), int64(i+1))
	}
	// Concurrently: Publish is safe for concurrent use.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := 0; w < 6; w++ {
		wg.Go(func() {
			for i := w; i < n; i += 6 {
				errs[i] = p.Publish(ctx, want[i])
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoErrorf(t, err, "event %d", i)
	}
	assert.EqualValues(t, n, e.msgs(t))

	var got []stock.Event
	for _, m := range e.consume(t, n, "") {
		ev := decode(t, m.Data())
		assert.Equal(t, natspub.Subject(e.prefix, ev.Type, ev.SKU), m.Subject())
		assert.Equal(t, natspub.MsgID(ev), m.Headers().Get(jetstream.MsgIDHeader))
		got = append(got, ev)
	}
	assert.ElementsMatch(t, want, got)

	// A consumer filtered on one item by its token sees that item's events only.
	for _, m := range e.consume(t, n/4, e.prefix+".*."+natspub.Token("sku-1")) {
		assert.Equal(t, "sku-1", decode(t, m.Data()).SKU)
	}
}

func TestPublishDeduplicates(t *testing.T) {
	e := newEnv(t)
	p := e.publisher(t)
	ctx := context.Background()

	ev := event(stock.EventDeducted, "sku-dup", "req-1", 2)
	require.NoError(t, p.Publish(ctx, ev))
	require.NoError(t, p.Publish(ctx, ev), "a duplicate is acknowledged, not an error")
	// A repeat is the same event even if a retry re-read it with another timestamp.
	again := ev
	again.At = again.At.Add(time.Second)
	require.NoError(t, p.Publish(ctx, again))
	assert.EqualValues(t, 1, e.msgs(t), "the stream holds the event once")

	// Another type of the same id is another event.
	restored := ev
	restored.Type = stock.EventRestored
	require.NoError(t, p.Publish(ctx, restored))
	require.NoError(t, p.Publish(ctx, restored))
	assert.EqualValues(t, 2, e.msgs(t))

	// SKU "a/b" id "c" and SKU "a" id "b/c" are different events.
	require.NoError(t, p.Publish(ctx, event(stock.EventDeducted, "a/b", "c", 1)))
	require.NoError(t, p.Publish(ctx, event(stock.EventDeducted, "a", "b/c", 1)))
	assert.EqualValues(t, 4, e.msgs(t))

	assert.Equal(t, ev, decode(t, e.consume(t, 4, "")[0].Data()), "the first copy is the one kept")
}

// checkSubject checks that ev is on the subject Subject names: the prefix's tokens, the type
// and one token that unescapes to the SKU.
func checkSubject(t *testing.T, prefix, subject string, ev stock.Event) {
	t.Helper()
	assert.Equal(t, natspub.Subject(prefix, ev.Type, ev.SKU), subject, "subject of %q", ev.SKU)
	toks := strings.Split(subject, ".")
	require.Lenf(t, toks, strings.Count(prefix, ".")+3, "subject %q", subject)
	sku, err := url.PathUnescape(toks[len(toks)-1])
	require.NoError(t, err)
	assert.Equal(t, ev.SKU, sku, "the subject's last token unescapes to the sku")
}

func TestPublishSpecialSKUs(t *testing.T) {
	e := newEnv(t)
	p := e.publisher(t)
	ctx := context.Background()

	var want []stock.Event
	for i, sku := range specialSKUs {
		if sku == "" {
			continue
		}
		ev := event(stock.EventDeducted, sku, fmt.Sprintf("id.%d/*>", i), int64(i+1))
		require.NoErrorf(t, p.Publish(ctx, ev), "sku %q", sku)
		want = append(want, ev)
	}
	var got []stock.Event
	for _, m := range e.consume(t, len(want), "") {
		ev := decode(t, m.Data())
		got = append(got, ev)
		checkSubject(t, e.prefix, m.Subject(), ev)
	}
	assert.ElementsMatch(t, want, got)

	// The sku ">" must not be taken as a wildcard: a filter on another sku does not see it.
	only := e.consume(t, 1, e.prefix+".deducted."+natspub.Token("p>q"))
	assert.Equal(t, "p>q", decode(t, only[0].Data()).SKU)
}

func TestPublishErrors(t *testing.T) {
	e := newEnv(t)
	ev := event(stock.EventDeducted, "sku-e", "req-1", 1)

	// A cancelled context.
	p := e.publisher(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Publish(ctx, ev)
	require.ErrorIs(t, err, context.Canceled)
	// An expired one.
	ctx, cancel = context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	err = p.Publish(ctx, ev)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 0, e.msgs(t))

	// No stream bound to the prefix.
	other, err := natspub.New(e.js, natspub.WithPrefix("stocktest.unbound."+randSuffix(t)),
		natspub.WithTimeout(5*time.Second))
	require.NoError(t, err)
	err = other.Publish(context.Background(), ev)
	require.ErrorIs(t, err, jetstream.ErrNoStreamResponse)

	// The wrong expected stream.
	wrong := e.publisher(t, natspub.WithStream("NOT_"+e.stream))
	err = wrong.Publish(context.Background(), ev)
	require.Error(t, err)
	assert.EqualValues(t, 0, e.msgs(t))

	// The right one.
	right := e.publisher(t, natspub.WithStream(e.stream))
	require.NoError(t, right.Publish(context.Background(), ev))
	assert.EqualValues(t, 1, e.msgs(t))

	// A closed connection.
	nc, err := nats.Connect(e.nc.ConnectedUrl())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	closed, err := natspub.New(js, natspub.WithPrefix(e.prefix))
	require.NoError(t, err)
	nc.Close()
	start := time.Now()
	err = closed.Publish(context.Background(), ev)
	require.ErrorIs(t, err, nats.ErrConnectionClosed)
	assert.Less(t, time.Since(start), time.Second)
}

func TestEnsureStream(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Idempotent on the stream it created.
	s, err := natspub.EnsureStream(ctx, e.js, e.stream, e.prefix)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	assert.Equal(t, []string{e.prefix + ".>"}, cfg.Subjects)
	assert.Equal(t, natspub.DefaultDuplicateWindow, cfg.Duplicates)

	// An existing stream keeps its settings and gains the subjects and the window.
	sfx := randSuffix(t)
	name, prefix := "STOCKTEST_OLD_"+sfx, "stocktest.old."+sfx
	_, err = e.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{"stocktest.other." + sfx + ".>"},
		Duplicates: 10 * time.Second,
		MaxMsgs:    1000,
		Storage:    jetstream.MemoryStorage,
	})
	require.NoError(t, err)
	e.deleteAtCleanup(t, name)
	s, err = natspub.EnsureStream(ctx, e.js, name, prefix)
	require.NoError(t, err)
	cfg = s.CachedInfo().Config
	assert.ElementsMatch(t, []string{"stocktest.other." + sfx + ".>", prefix + ".>"}, cfg.Subjects)
	assert.Equal(t, natspub.DefaultDuplicateWindow, cfg.Duplicates)
	assert.EqualValues(t, 1000, cfg.MaxMsgs)
	assert.Equal(t, jetstream.MemoryStorage, cfg.Storage)

	p, err := natspub.New(e.js, natspub.WithPrefix(prefix), natspub.WithStream(name))
	require.NoError(t, err)
	require.NoError(t, p.Publish(ctx, event(stock.EventRestocked, "s", "r", 3)))

	// A subject another stream owns is an error, not a silent success.
	clash := "STOCKTEST_CLASH_" + sfx
	e.deleteAtCleanup(t, clash)
	_, err = natspub.EnsureStream(ctx, e.js, clash, prefix)
	require.Error(t, err)
}

// TestPublishBatch: a batch is stored in order with one error per event; an invalid event fails
// alone and holds back the later events of its item (not sent, so not answered nil), not those
// of other items; a publish the stream refuses fails every event.
func TestPublishBatch(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.publisher(t, natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second))
	at := time.Now().UTC()
	mk := func(sku, id string, seq int64) stock.Event {
		return stock.Event{Type: stock.EventDeducted, SKU: sku, ID: id, Qty: 1, At: at, Seq: seq}
	}
	bad := mk("a", "bad", 2)
	bad.Qty = -1
	errs := p.PublishBatch(ctx, []stock.Event{mk("a", "1", 1), bad, mk("b", "1", 1), mk("a", "2", 3), mk("b", "2", 2)})
	require.Len(t, errs, 5)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], stock.ErrInvalid)
	assert.NoError(t, errs[2])
	assert.ErrorContains(t, errs[3], "not sent after an earlier failure")
	assert.NoError(t, errs[4])
	assert.Equal(t, uint64(3), e.msgs(t))

	// An event without id in the middle of one item: the item's later event is not sent.
	errs = p.PublishBatch(ctx, []stock.Event{queuetest.Ev("n:1", "1", 1), queuetest.Ev("n:1", "", 2),
		queuetest.Ev("n:1", "3", 3), queuetest.Ev("other", "1", 1)})
	require.Len(t, errs, 4)
	assert.NoError(t, errs[0], "the valid first event")
	assert.ErrorIs(t, errs[1], stock.ErrInvalid)
	assert.Error(t, errs[2], "the event after the item's invalid one")
	assert.NoError(t, errs[3], "another item's event")
	var ids []string
	for _, m := range e.stored(t) {
		if ev := decode(t, m.Data); ev.SKU == "n:1" {
			ids = append(ids, ev.ID)
		}
	}
	assert.Equal(t, []string{"1"}, ids, "the stream holds the item's events before the invalid one only")

	wrong := e.publisher(t, natspub.WithStream("NOT_THIS_ONE"), natspub.WithTimeout(5*time.Second))
	for _, err := range wrong.PublishBatch(ctx, []stock.Event{mk("c", "1", 1), mk("c", "2", 2)}) {
		assert.Error(t, err)
	}
	assert.Equal(t, uint64(5), e.msgs(t))
}

// stored reads every message the env's stream stores, in stream order.
func (e *env) stored(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	st, err := e.js.Stream(ctx, e.stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, m)
	}
	return out
}

// TestPublishBatchAwkwardSKUs: with awkward SKUs and ids, every event is stored once, on the
// subject Subject names (whose last token unescapes to the SKU), with its Nats-Msg-Id, and a
// second publish of the batch is dropped as a duplicate (within the window) while distinct
// events whose parts share a '/' are not.
func TestPublishBatchAwkwardSKUs(t *testing.T) {
	e := newEnv(t)
	pub := e.publisher(t, natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second))
	skus := []string{"a.b", "a*b", "a>b", "a/b", "a", "b/c", "ü~ñ", "😀", "%2E", "x y"}
	var evs []stock.Event
	for i, sku := range skus {
		evs = append(evs, queuetest.Ev(sku, "b/c", int64(i+1)), queuetest.Ev(sku, "b", int64(i+100)), queuetest.Ev(sku, "c", int64(i+200)))
	}
	// ("a", "b/c") and ("a/b", "c") must stay two events.
	ctx := context.Background()
	for round := 0; round < 2; round++ {
		for i, err := range pub.PublishBatch(ctx, evs) {
			require.NoError(t, err, "round %d: %s/%s", round, evs[i].SKU, evs[i].ID)
		}
	}
	msgs := e.stored(t)
	assert.Len(t, msgs, len(evs), "messages stored for distinct events published twice")
	seen := map[string]bool{}
	for _, m := range msgs {
		ev := decode(t, m.Data)
		checkSubject(t, e.prefix, m.Subject, ev)
		assert.Equal(t, natspub.MsgID(ev), m.Header.Get("Nats-Msg-Id"))
		k := ev.SKU + "\x00" + ev.ID
		assert.False(t, seen[k], "event %q/%q stored twice", ev.SKU, ev.ID)
		seen[k] = true
	}
}

// TestPublisherConformance runs the publisher conformance suite on natspub: a stream of its
// own per check, and a durable pull consumer whose members fetch from it, with an ack wait of
// one second (a killed member's messages come back after it), and sqlstore on SQLite.
func TestPublisherConformance(t *testing.T) {
	stocktest.TestPublisher(t, func(t *testing.T) stocktest.PublisherPair {
		e := newEnv(t)
		const ackWait = time.Second
		e.durable(t, ackWait)
		return stocktest.PublisherPair{
			Publisher: e.publisher(t, natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second)),
			NewConsumer: func(t testing.TB) stocktest.Consumer {
				cons, err := e.js.Consumer(context.Background(), e.stream, "store")
				require.NoError(t, err)
				return &jsMember{cons: cons}
			},
			Redelivery: ackWait + 500*time.Millisecond,
			// The consumers apply to sqlstore on a SQLite file, as in production.
			NewStore: func(t testing.TB) stock.Store { return openStore(t, filepath.Join(t.TempDir(), "store.sqlite")) },
		}
	})
}

// jsMember is one member of a durable pull consumer.
type jsMember struct {
	cons jetstream.Consumer
	dead atomic.Bool
}

func (m *jsMember) Receive(_ context.Context, n int, wait time.Duration) ([]stocktest.Delivery, error) {
	if m.dead.Load() {
		return nil, nil
	}
	batch, err := m.cons.Fetch(n, jetstream.FetchMaxWait(max(wait, 100*time.Millisecond)))
	if err != nil {
		return nil, err
	}
	var out []stocktest.Delivery
	for msg := range batch.Messages() {
		out = append(out, jsDelivery{msg})
	}
	return out, batch.Error()
}

// Crash stops the member: what it fetched and did not acknowledge is redelivered after the
// ack wait, as for a killed process.
func (m *jsMember) Crash() { m.dead.Store(true) }

type jsDelivery struct{ m jetstream.Msg }

func (d jsDelivery) Event() (stock.Event, error)   { return natspub.Decode(d.m.Data()) }
func (d jsDelivery) Ack(ctx context.Context) error { return d.m.DoubleAck(ctx) }
func (d jsDelivery) Retry(context.Context) error   { return d.m.NakWithDelay(100 * time.Millisecond) }

// BenchmarkPublish measures events/s published one by one (Publish: one acknowledgement waited
// for each) and in batches of 128 events of one item (PublishBatch: 128 asynchronous publishes,
// then their acknowledgements, as the Relay calls it), on the server of STOCK_TEST_NATS:
//
//	STOCK_TEST_NATS=nats://127.0.0.1:4222 go test -run '^$' -bench Publish -benchtime 3s ./natspub
func BenchmarkPublish(b *testing.B) {
	e := newEnv(b)
	queuetest.BenchPublish(b, e.publisher(b, natspub.WithStream(e.stream)))
}

// The queue path with consumer processes killed by SIGKILL (queuetest.KillRig): Reserver →
// Relay (no store) → natspub → JetStream → a durable pull consumer in a child process →
// stock.Consume → sqlstore on a SQLite file that the parent reads too.

// childBroker is how a consumer child reaches JetStream.
type childBroker struct {
	NATS, Stream, Durable string
	Batch                 int
}

var child = queuetest.Child{
	Env:      "STOCK_NATSPUB_CONSUMER_CHILD",
	NewStore: newSQLStore,
	Consumer: func(t *testing.T, cfg queuetest.ChildConfig) queuetest.Receiver {
		var b childBroker
		require.NoError(t, json.Unmarshal(cfg.Broker, &b))
		if cfg.HangAfterAcks > 0 {
			b.Batch = 2
		}
		nc, err := nats.Connect(b.NATS)
		require.NoError(t, err)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		cons, err := js.Consumer(context.Background(), b.Stream, b.Durable)
		require.NoError(t, err)
		return func(ctx context.Context) (iter.Seq[queuetest.Message], error) {
			batch, err := cons.Fetch(b.Batch, jetstream.FetchMaxWait(300*time.Millisecond))
			if err != nil {
				return nil, err
			}
			return func(yield func(queuetest.Message) bool) {
				for m := range batch.Messages() {
					ev, err := natspub.Decode(m.Data())
					delivered := uint64(0)
					if md, _ := m.Metadata(); md != nil {
						delivered = md.NumDelivered
					}
					if !yield(queuetest.Message{Event: ev, Err: err, Body: m.Data(), Delivered: delivered,
						Ack:   func() error { return m.DoubleAck(ctx) },
						Retry: func() { _ = m.NakWithDelay(100 * time.Millisecond) },
						Drop:  func() { _ = m.Term() }}) {
						return
					}
				}
			}, nil
		}
	},
}

// openStore opens sqlstore on the SQLite file path, as the consumer children do.
func openStore(t testing.TB, path string) queuetest.Store {
	return queuetest.OpenSQLite(t, path, newSQLStore)
}

func newSQLStore(db *sql.DB) (queuetest.Store, error) { return sqlstore.New(db, sqlstore.SQLite) }

// TestConsumerProcess is the consumer child; it skips unless child.Env is set.
func TestConsumerProcess(t *testing.T) { queuetest.RunChild(t, child) }

// newKillRig starts the rig on a stream of the test's own and a durable consumer whose
// unacknowledged messages are redelivered after ackWait; the rig is settled once the
// consumer has every message of the stream acknowledged.
func newKillRig(t *testing.T, ackWait time.Duration) *queuetest.KillRig {
	var e *env
	var cb childBroker
	return queuetest.NewKillRig(t, queuetest.Kill{
		Child: child,
		Broker: func() (any, stock.Publisher) {
			e = newEnv(t)
			cb = childBroker{NATS: e.nc.ConnectedUrl(), Stream: e.stream, Durable: "store", Batch: 8}
			e.durable(t, ackWait)
			return cb, e.publisher(t, natspub.WithStream(e.stream), natspub.WithTimeout(5*time.Second))
		},
		Settled: func() bool {
			ctx := context.Background()
			cons, err := e.js.Consumer(ctx, cb.Stream, cb.Durable)
			require.NoError(t, err)
			info, err := cons.Info(ctx)
			require.NoError(t, err)
			return info.NumPending == 0 && info.NumAckPending == 0
		},
	})
}

// TestConsumerKilledKeepsOrder: one unit; deduct a, restore a, deduct b, published to
// JetStream. A consumer process acks D(a), takes R(a) and is killed by SIGKILL before it acks
// it; its successor is handed D(b) first, R(a) only after the ack wait. The store must still
// get R(a) before D(b) (Consume applies R(a) from Redis first): b's sale is applied, not
// refused and given back.
func TestConsumerKilledKeepsOrder(t *testing.T) {
	queuetest.ConsumerKilledKeepsOrder(t, newKillRig(t, 2*time.Second), func(results []string) {
		require.GreaterOrEqual(t, len(results), 2)
		assert.True(t, strings.HasPrefix(results[1], "MSG deducted b "),
			"the successor must be handed D(b) before the redelivered R(a), or the test proves nothing: %s", results[1])
	})
}

// TestConsumersKilledRandom: buyers deduct and restore at the edge of the stock of a few items
// while the relay publishes to JetStream and consumer processes apply the events; three
// consumers are killed by SIGKILL at random moments, each successor getting redeliveries out
// of order. No valid sale may be refused by the store, and Redis and the store end equal.
func TestConsumersKilledRandom(t *testing.T) {
	queuetest.ConsumersKilledRandom(t, newKillRig(t, time.Second), queuetest.Random{Buyers: 4, Seed: 7,
		PauseMin: 1, PauseSpread: 4, AliveMin: 400, AliveSpread: 1200, Redelivers: true})
}

// TestConsumerDiesMidBatch, with the package doc's consumer wiring on real JetStream: one unit
// sold and given back over and over; a consumer takes a batch, acks part of it and dies; a
// reconcile pass while it is dead adjusts nothing; its successor gets the rest redelivered
// after the AckWait, out of order: the store refuses nothing and ends equal to Redis.
func TestConsumerDiesMidBatch(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	pub := e.publisher(t, natspub.WithStream(e.stream))
	_, c := redistest.Miniredis(t)
	r, err := stock.New(c, stock.WithCoalescing(0))
	require.NoError(t, err)
	st := memstore.New()
	const sku = "one.unit*sku"
	require.NoError(t, r.Load(ctx, sku, 1))
	require.NoError(t, st.Load(ctx, sku, 1))
	const n = 15
	for i := 0; i < n; i++ {
		id := fmt.Sprint("o", i)
		_, err := r.Deduct(ctx, stock.Request{SKU: sku, ID: id, Qty: 1})
		require.NoError(t, err)
		if i < n-1 {
			_, err := r.Restore(ctx, sku, id)
			require.NoError(t, err)
		}
	}
	rl, err := stockops.NewRelay(r, nil, pub, nil)
	require.NoError(t, err)
	_, err = rl.Once(ctx)
	require.NoError(t, err)
	cons := e.durable(t, time.Second)
	handle := func(m jetstream.Msg) (refusedOrBad bool) {
		ev, err := natspub.Decode(m.Data())
		if err != nil {
			_ = m.Term()
			return true
		}
		switch err := stock.Consume(ctx, r, st, ev); {
		case err == nil:
			_ = m.Ack()
		case errors.Is(err, stock.ErrInvalid):
			_ = m.Term()
			t.Errorf("terminated %+v: %v", ev, err)
		default:
			_ = m.NakWithDelay(200 * time.Millisecond)
		}
		return false
	}
	// consumer 1: takes 10, handles (acks) the 2nd and 4th only, dies.
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(3*time.Second))
	require.NoError(t, err)
	k := 0
	for m := range batch.Messages() {
		k++
		if k == 2 || k == 4 {
			handle(m)
		}
	}
	// consumer down: reconcile
	rc, _ := stockops.NewReconciler(r, st, nil)
	res, err := rc.Pass(ctx)
	require.NoError(t, err)
	for _, rp := range res.Reports {
		assert.True(t, rp.Adjusted == 0 && rp.Drift == 0 && rp.Resynced == 0, "pass with the consumer dead: %s", rp)
	}
	// consumer 2
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, _, err := stockops.Pending(ctx, r, sku)
		require.NoError(t, err)
		res, _ := rc.Pass(ctx)
		done := p == 0 && len(res.Reports) == 1 && res.Reports[0].Published == 0
		if done {
			break
		}
		_, err = rl.Once(ctx)
		require.NoError(t, err)
		batch, err := cons.Fetch(5, jetstream.FetchMaxWait(500*time.Millisecond))
		require.NoError(t, err)
		for m := range batch.Messages() {
			handle(m)
		}
	}
	rem, _ := st.Remaining(ctx, sku)
	lv, _ := r.Levels(ctx, sku)
	assert.Zero(t, rem, "store remaining")
	assert.Zero(t, lv.Available, "redis available")
	recs, err := st.List(ctx, sku, "", 1000)
	require.NoError(t, err)
	for _, rec := range recs {
		assert.NotEqual(t, stock.StateRefused, rec.Status, "store refused a valid sale: %+v", rec)
	}
	le, _ := r.Ledger(ctx, sku, fmt.Sprint("o", n-1))
	assert.Equal(t, stock.StateApplied, le.State, "the last sale")
	assert.LessOrEqual(t, st.MaxApplications(), 1, "double application")
}
