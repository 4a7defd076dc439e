package sqsemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Region and the static credentials every client of the emulator uses: it
// checks neither.
const (
	Region    = "us-east-1"
	AccessKey = "test"
	SecretKey = "test"
)

// ErrMissing means Node.js or the emulator package is not installed; its
// message says how to provide them.
var ErrMissing = errors.New("the SQS emulator (fauxqs) is not installed: install Node.js 20 or later and run `npm ci` at the repository root (it installs the version package.json pins into node_modules)")

// appScript is the emulator's module, relative to the directory that holds
// node_modules.
const appScript = "node_modules/fauxqs/dist/app.js"

// launcher starts the emulator on a port the system picks, prints that
// port, and exits when its standard input closes (the parent died or
// closed it).
const launcher = `const { startFauxqs } = await import(process.argv[1]);
const server = await startFauxqs({ port: 0, logger: false });
process.stdout.write("PORT " + server.port + "\n");
process.stdin.on("data", () => {});
process.stdin.on("end", () => process.exit(0));
process.stdin.on("error", () => process.exit(0));`

// Emulator is a running fauxqs.
type Emulator struct {
	// Endpoint is its base URL on loopback, for the SDK's BaseEndpoint.
	Endpoint string
	cmd      *exec.Cmd
	stdin    io.Closer
	done     chan struct{}
	stderr   *tail
	once     sync.Once
}

// Locate returns the emulator's module, looked for in the directory named
// by FAUXQS_DIR, else in the current directory and each of its parents.
func Locate() (string, error) {
	var dirs []string
	if d := os.Getenv("FAUXQS_DIR"); d != "" {
		dirs = append(dirs, d)
	} else if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			dirs = append(dirs, d)
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, appScript)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w (looked for %s in %s)", ErrMissing, appScript, strings.Join(dirs[:min(len(dirs), 3)], ", "))
}

// Start runs the emulator and returns once it answers an SQS request, or
// with an error wrapping [ErrMissing] when it is not installed.
func Start(ctx context.Context) (*Emulator, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%w: node: %v", ErrMissing, err)
	}
	app, err := Locate()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(node, "--input-type=module", "-e", launcher, app)
	cmd.Env = append(os.Environ(), "FAUXQS_LOGGER=false")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("sqsemu: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("sqsemu: %w", err)
	}
	e := &Emulator{cmd: cmd, stdin: stdin, done: make(chan struct{}), stderr: &tail{}}
	cmd.Stderr = e.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sqsemu: start %s: %w", node, err)
	}
	go func() {
		_ = cmd.Wait()
		close(e.done)
	}()
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "PORT "); ok {
				port <- p
			}
		}
	}()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case p := <-port:
		if _, err := strconv.Atoi(p); err != nil {
			e.Close()
			return nil, fmt.Errorf("sqsemu: the emulator printed port %q", p)
		}
		e.Endpoint = "http://127.0.0.1:" + p
	case <-e.done:
		return nil, fmt.Errorf("sqsemu: the emulator exited before it listened (%s): %s", cmd.ProcessState, e.stderr)
	case <-sctx.Done():
		e.Close()
		return nil, fmt.Errorf("sqsemu: the emulator did not listen within 30s: %s", e.stderr)
	}
	// It listens: wait until it answers.
	c := e.Client()
	for {
		rctx, rcancel := context.WithTimeout(sctx, 2*time.Second)
		_, err := c.ListQueues(rctx, &sqs.ListQueuesInput{})
		rcancel()
		if err == nil {
			return e, nil
		}
		select {
		case <-sctx.Done():
			e.Close()
			return nil, fmt.Errorf("sqsemu: the emulator at %s does not answer: %w", e.Endpoint, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops the emulator and waits for it to exit.
func (e *Emulator) Close() {
	e.once.Do(func() {
		_ = e.stdin.Close()
		select {
		case <-e.done:
		case <-time.After(2 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.done
		}
	})
}

// Client is an SQS client of the emulator.
func (e *Emulator) Client() *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       Region,
		BaseEndpoint: aws.String(e.Endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
}

// CreateFIFO creates a FIFO queue named name (".fifo" is appended when
// missing) with content-based deduplication and the given visibility
// timeout (whole seconds, at least 1), and returns its URL.
func (e *Emulator) CreateFIFO(ctx context.Context, name string, visibility time.Duration) (string, error) {
	if !strings.HasSuffix(name, ".fifo") {
		name += ".fifo"
	}
	out, err := e.Client().CreateQueue(ctx, &sqs.CreateQueueInput{
		QueueName: aws.String(name),
		Attributes: map[string]string{
			string(types.QueueAttributeNameFifoQueue):                 "true",
			string(types.QueueAttributeNameContentBasedDeduplication): "true",
			string(types.QueueAttributeNameVisibilityTimeout):         strconv.Itoa(max(int(visibility/time.Second), 1)),
		},
	})
	if err != nil {
		return "", fmt.Errorf("sqsemu: create queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// tail keeps the last 4 KiB written to it, for error messages.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = t.buf[len(t.buf)-4096:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == 0 {
		return "(no output)"
	}
	return strings.TrimSpace(string(t.buf))
}
