package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	startTimeout = 10 * time.Second // for a server to answer PING
	stopTimeout  = 10 * time.Second // for a server to exit after SIGTERM
	logName      = "redis.log"
)

// Server is a redis-server process listening on 127.0.0.1. It keeps its port
// and directory across restarts, so data persisted with AOF or RDB survives
// Kill and Start. Its output goes to Dir()/redis.log.
type Server struct {
	bin     string
	dir     string
	port    int
	busPort int // cluster bus port, 0 when not in cluster mode
	args    []string
	conf    string     // the configuration file of a sentinel (run with --sentinel); "" for a data node
	tb      testing.TB // fails on errors of Start and Stop; nil for shared servers

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartServer starts a private redis-server for t, in a directory from
// t.TempDir, and waits until it answers PING. args are extra redis-server
// arguments appended to the defaults (--bind 127.0.0.1, --port,
// --enable-debug-command local, and --save "" unless args contain --save),
// e.g. "--appendonly", "yes", "--appendfsync", "always". The server is killed
// when t ends. StartServer fails t when STOCK_REDIS_SERVER is unset.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	bin := requireBinary(t)
	s, err := newServer(bin, t.TempDir(), args, false)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s.tb = t
	t.Cleanup(s.Kill)
	return s
}

// newServer creates dir and starts a server in it on free ports, retrying
// with other ports when one was taken in the meantime.
func newServer(bin, dir string, args []string, cluster bool) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, args: args}
	if err := s.launch(cluster); err != nil {
		return nil, err
	}
	return s, nil
}

// launch starts s on free ports, retrying with other ports when one was taken in the meantime.
func (s *Server) launch(cluster bool) error {
	var err error
	for range 5 {
		os.Remove(s.logPath())
		if s.port, err = freePort(); err != nil {
			return err
		}
		if cluster {
			if s.busPort, err = freePort(); err != nil {
				return err
			}
		}
		if err = s.start(); err == nil || !strings.Contains(s.log(), "already in use") {
			return err
		}
	}
	return err
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns the server's address, 127.0.0.1:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory, which holds its data files
// and its log, redis.log.
func (s *Server) Dir() string { return s.dir }

// Client returns a new client on s, closed when t ends. Client-side caching
// is enabled.
func (s *Server) Client(t testing.TB) rueidis.Client {
	t.Helper()
	return newClient(t, rueidis.ClientOption{InitAddress: []string{s.Addr()}, ForceSingleClient: true})
}

// Kill kills the server with SIGKILL, simulating a crash, and waits for it to
// exit. It does nothing if the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kill()
}

// Stop shuts the server down with SIGTERM, which saves according to its
// configuration, and waits for it to exit. It does nothing if the server is
// not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		s.cmd = nil
	case <-time.After(stopTimeout):
		s.kill()
		s.fail("redistest: %s did not stop within %v after SIGTERM; killed it\n%s", s.Addr(), stopTimeout, s.log())
	}
}

// Start starts the stopped or killed server again on the same port and
// directory and waits until it answers PING (which it does only after it has
// loaded its data). It fails the test that started the server on error.
func (s *Server) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		select {
		case <-s.done: // exited by itself
			s.cmd = nil
		default:
			s.fail("redistest: Start: %s is already running", s.Addr())
			return
		}
	}
	if err := s.start(); err != nil {
		s.fail("redistest: %v", err)
	}
}

// Restart stops the server with Stop if it is running and starts it again
// with Start.
func (s *Server) Restart() {
	s.Stop()
	s.Start()
}

func (s *Server) fail(format string, args ...any) {
	if s.tb == nil {
		panic(fmt.Sprintf(format, args...))
	}
	s.tb.Helper()
	s.tb.Fatalf(format, args...)
}

func (s *Server) logPath() string { return filepath.Join(s.dir, logName) }

// log returns the server's log for error messages.
func (s *Server) log() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const max = 8 << 10
	if len(b) > max {
		b = append([]byte("...\n"), b[len(b)-max:]...)
	}
	return fmt.Sprintf("--- %s ---\n%s", s.logPath(), b)
}

// start runs the process and waits until it answers PING. On error no
// process is left running. The caller holds s.mu or owns s alone.
func (s *Server) start() error {
	var args []string
	if s.conf != "" {
		args = append(args, s.conf, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", "",
		"--daemonize", "no",
		"--enable-debug-command", "local",
	)
	if !slices.Contains(s.args, "--save") {
		args = append(args, "--save", "")
	}
	if s.busPort != 0 {
		args = append(args, "--cluster-port", strconv.Itoa(s.busPort))
	}
	args = append(args, s.args...)

	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(s.bin, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = s.dir, logf, logf
	killWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done

	deadline := time.Now().Add(startTimeout)
	for {
		reply, err := do(s.Addr(), "PING")
		if err == nil && reply == "PONG" {
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited (%v) at start\n%s", s.Addr(), cmd.ProcessState, s.log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on %s did not answer PING within %v (last: %q, %v)\n%s",
				s.Addr(), startTimeout, reply, err, s.log())
		}
	}
}

// kill kills the process, if any, and waits for it. The caller holds s.mu.
func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	killGroup(s.cmd)
	<-s.done
	s.cmd = nil
}

func (s *Server) flushAll() error {
	if _, err := do(s.Addr(), "FLUSHALL"); err != nil {
		return fmt.Errorf("FLUSHALL on %s: %w", s.Addr(), err)
	}
	return nil
}

// do sends one command to addr on a new connection (see query) and returns the reply as text:
// simple strings, integers and bulk strings as they are, a nil as "", error replies as errors.
// Arrays are not supported.
func do(addr string, args ...string) (string, error) {
	v, err := query(addr, args...)
	if err != nil {
		return "", err
	}
	switch v := v.(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	}
	return "", fmt.Errorf("unsupported reply %T", v)
}

// query sends one command to addr on a new connection (RESP2) and returns the reply: a
// string for simple strings, integers and bulk strings, nil for a nil, []any for an array,
// and an error for an error reply.
func query(addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, req.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn), 0)
}

func readReply(r *bufio.Reader, depth int) (any, error) {
	if depth > 8 {
		return nil, errors.New("reply nested too deep")
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r, depth+1); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported reply %q", line)
}
