package chaos_test

import (
	"bytes"
	"database/sql"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql drivers of the SQL stores the tests open
	_ "modernc.org/sqlite"

	"github.com/stockres/stock/internal/redistest"
)

// TestMain starts and stops the real servers the tests ask for (redistest.Run).
func TestMain(m *testing.M) { os.Exit(redistest.Run(m)) }

// The shared harness of the package: the SQL stores the suites drain into, and the child
// processes the crash tests kill.

// sqliteDSN is the DSN of a new SQLite database in dir, for relays in several connections (and
// processes) at once: WAL, a busy timeout, and write transactions that lock at their start.
func sqliteDSN(dir string) string {
	return "file:" + filepath.Join(dir, "db.sqlite") + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}

// dropTables drops the sqlstore tables of prefix at the end of the test (on a database server:
// a SQLite file goes with its temporary directory).
func dropTables(t testing.TB, db *sql.DB, prefix string) {
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + prefix + "items")
		_, _ = db.Exec("DROP TABLE IF EXISTS " + prefix + "records")
	})
}

// childProc is this test binary run again as a child process, to run one of the package's
// ...ChildProcess tests (the relay of TestRelayKilledProcess, the buyers of
// TestTransferKilledProcess). The child reads its stdin until it closes, which happens when this
// process dies by any means, and then exits: no child outlives the test. Its output (stdout and
// stderr) is kept, and each line of it is handed to onLine, under mu; the line readyLine closes
// ready instead.
type childProc struct {
	cmd   *exec.Cmd
	stdin io.Closer
	exit  chan struct{} // closed when cmd has exited
	ready chan struct{} // closed when the child printed readyLine

	readyLine string
	onLine    func(line string)

	mu   sync.Mutex
	buf  bytes.Buffer
	line []byte
}

// errChildExited is awaitReady's answer when the child ended before it was ready.
var errChildExited = errors.New("the child ended before it was ready")

// startChild starts the test named test in a child process with env.
func startChild(test string, env []string, readyLine string, onLine func(line string)) (*childProc, error) {
	ch := &childProc{exit: make(chan struct{}), ready: make(chan struct{}), readyLine: readyLine, onLine: onLine}
	ch.cmd = exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	ch.cmd.Env, ch.cmd.Stdout, ch.cmd.Stderr = env, ch, ch
	stdin, err := ch.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	ch.stdin = stdin
	if err := ch.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = ch.cmd.Wait()
		close(ch.exit)
	}()
	return ch, nil
}

// awaitReady waits up to d for the child's ready line: nil, errChildExited, or an error after d.
func (ch *childProc) awaitReady(d time.Duration) error {
	select {
	case <-ch.ready:
		return nil
	case <-ch.exit:
		return errChildExited
	case <-time.After(d):
		return errors.New("the child was not ready after " + d.String())
	}
}

// kill kills the child with SIGKILL unless it has exited already, waits for it, and reports
// whether it was still running and died of the SIGKILL.
func (ch *childProc) kill() bool {
	killed := false
	select {
	case <-ch.exit:
	default:
		killed = true
		_ = ch.cmd.Process.Kill()
		<-ch.exit
	}
	ch.stdin.Close()
	return killed && ch.cmd.ProcessState.ExitCode() == -1
}

func (ch *childProc) Write(p []byte) (int, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.buf.Write(p)
	for _, b := range p {
		if b != '\n' {
			ch.line = append(ch.line, b)
			continue
		}
		l := string(ch.line)
		ch.line = ch.line[:0]
		if strings.TrimSpace(l) == ch.readyLine {
			close(ch.ready)
		} else {
			ch.onLine(l)
		}
	}
	return len(p), nil
}

// output is the child's whole output.
func (ch *childProc) output() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.buf.String()
}

// tail is the last 4 KiB of the child's output.
func (ch *childProc) tail() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	b := ch.buf.Bytes()
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
