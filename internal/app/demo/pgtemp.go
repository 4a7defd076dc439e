package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// tempCluster is a throwaway PostgreSQL cluster started from the server
// binaries on this machine, for a demo run where no server answers.
type tempCluster struct {
	dir    string
	pgCtl  string
	cred   *syscall.Credential
	URL    string
	logger func(string, ...any)
}

// findPGBin locates initdb and pg_ctl: the newest /usr/lib/postgresql/*/bin,
// else PATH.
func findPGBin() (initdb, pgctl string, err error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		i, c := filepath.Join(d, "initdb"), filepath.Join(d, "pg_ctl")
		if isExec(i) && isExec(c) {
			return i, c, nil
		}
	}
	i, err1 := exec.LookPath("initdb")
	c, err2 := exec.LookPath("pg_ctl")
	if err1 == nil && err2 == nil {
		return i, c, nil
	}
	return "", "", errors.New("no PostgreSQL server binaries (initdb, pg_ctl) found: install PostgreSQL or pass --database-url")
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

// startTempCluster initialises and starts a cluster in a temporary
// directory on a free loopback port. initdb refuses to run as root, so as
// root it runs the server as the "postgres" user.
func startTempCluster(ctx context.Context, logf func(string, ...any)) (*tempCluster, error) {
	initdb, pgctl, err := findPGBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "projector-demo-pg-")
	if err != nil {
		return nil, err
	}
	c := &tempCluster{dir: dir, pgCtl: pgctl, logger: logf}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs the \"postgres\" user to own a throwaway cluster: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := c.cmd(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off -c synchronous_commit=off", port, dir)
	if out, err := c.cmd(ctx, pgctl, "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	logf("started a throwaway PostgreSQL cluster in %s on port %d", dir, port)
	return c, nil
}

func (c *tempCluster) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// Stop stops the server and removes its files.
func (c *tempCluster) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := c.cmd(ctx, c.pgCtl, "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
		c.logger("pg_ctl stop: %v: %s", err, out)
	}
	os.RemoveAll(c.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
