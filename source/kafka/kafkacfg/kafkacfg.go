// Package kafkacfg holds the Kafka source's settings, apart from the
// client library, so that a configuration can hold them without linking
// it: where the brokers are, how connections are secured, and how records
// written in transactions are read.
package kafkacfg

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/xdg-go/scram"
)

// Kafka is where the brokers are and how to reach them. Every connection
// the projector makes (group membership, fetches, the group offset commits,
// re-reads, offset lookups, status and rebuild) goes through the one
// dialer and the one transport [Config.Connect] builds from it.
type Config struct {
	Brokers []string
	// TLS, when not nil, encrypts every connection; its RootCAs,
	// Certificates and ServerName say whom to trust and who we are.
	TLS *tls.Config
	// SASL, when not nil, authenticates every connection.
	SASL *SASL
	// Isolation is how records written in transactions are read:
	// ReadCommitted (also when empty) or ReadUncommitted. Where a log
	// ends for lag, for a rebuild's target, for `--to latest`, is where a
	// reader at this level reads to: the last stable offset reading
	// committed, the high watermark otherwise.
	Isolation string
}

// Isolation levels: how records written in Kafka transactions are read.
const (
	// ReadCommitted reads as a Java consumer with
	// isolation.level=read_committed: a transaction's records once it has
	// committed, never those of an aborted one, and nothing past the last
	// stable offset (the first offset of the oldest transaction still
	// open, the high watermark with none).
	ReadCommitted = "read_committed"
	// ReadUncommitted reads every record as it is appended: those of
	// transactions still open, and of aborted ones, too.
	ReadUncommitted = "read_uncommitted"
)

// readCommitted reports whether k reads committed.
func (k Config) ReadsCommitted() bool { return k.Isolation != ReadUncommitted }

// validIsolation says what is wrong with an isolation level.
func ValidIsolation(iso string) error {
	switch iso {
	case "", ReadCommitted, ReadUncommitted:
		return nil
	}
	return fmt.Errorf("isolation: %q is not %s or %s", iso, ReadCommitted, ReadUncommitted)
}

// SASL mechanisms the projector speaks.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL is a SASL mechanism and its credentials. Its String and LogValue
// never show the password.
type SASL struct {
	Mechanism string
	Username  string
	Password  string
}

func (s *SASL) String() string {
	if s == nil {
		return "none"
	}
	return fmt.Sprintf("%s user %q", s.Mechanism, s.Username)
}

// LogValue keeps the password out of logs.
func (s *SASL) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Validate says what is wrong with the mechanism or the credentials.
func (s *SASL) Validate() error {
	if s == nil {
		return nil
	}
	var errs []error
	switch s.Mechanism {
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	default:
		errs = append(errs, fmt.Errorf("sasl mechanism %q: want %s, %s or %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512))
	}
	if s.Username == "" {
		errs = append(errs, errors.New("sasl: a username is required"))
	}
	if s.Password == "" {
		errs = append(errs, errors.New("sasl: a password is required"))
	}
	if len(errs) == 0 && s.Mechanism != SASLPlain {
		if err := s.saslprep(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// saslprep checks the name and password as SCRAM prepares them
// (SASLprep), so a refused one is said when the settings are checked.
func (s *SASL) saslprep() error {
	if _, err := scram.SHA256.NewClient(s.Username, s.Password, ""); err != nil {
		return ScramRefused(s, err)
	}
	return nil
}

// ScramRefused is the error for a name or password SASLprep refuses. The
// SCRAM library's own error quotes the password: it is never passed on.
func ScramRefused(s *SASL, err error) error {
	if strings.Contains(err.Error(), "password") {
		return fmt.Errorf("sasl %s: the password of user %q holds characters SCRAM refuses (SASLprep: no control or unassigned characters)", s.Mechanism, s.Username)
	}
	return fmt.Errorf("sasl %s: username %q holds characters SCRAM refuses (SASLprep: no control or unassigned characters)", s.Mechanism, s.Username)
}

// Validate says what is wrong with the brokers or the security settings.
func (k Config) Validate() error {
	var errs []error
	if len(k.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: at least one broker address (host:port) is required"))
	}
	for _, b := range k.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil || b == "" {
			errs = append(errs, fmt.Errorf("brokers: %q is not a host:port address", b))
		}
	}
	if err := k.SASL.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := ValidIsolation(k.Isolation); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AuthError is a broker refusing our credentials or certificate, or a TLS
// handshake that cannot succeed: retrying will not help, so the projector
// stops with it.
type AuthError struct {
	// Mechanism and User are the SASL settings in use, empty without SASL.
	Mechanism, User string
	TLS             bool
	Err             error
}

func (e *AuthError) Error() string {
	what := "kafka: authentication failed"
	switch {
	case e.Mechanism != "":
		what += fmt.Sprintf(" (SASL %s as user %q", e.Mechanism, e.User)
		if e.TLS {
			what += ", over TLS"
		}
		what += ")"
	case e.TLS:
		what += " (TLS)"
	}
	return what + ": " + e.Err.Error()
}

func (e *AuthError) Unwrap() error { return e.Err }

// LegacyGroup is the consumer group every projection joined by default
// before each recorded its own: a projection that has positions and no
// recorded group keeps it.
const LegacyGroup = "projector"

// DefaultGroup is the consumer group a new projection records when none
// is given: one per projection, so two projections never split a topic's
// partitions between them.
func DefaultGroup(schema, table string) string { return "projector-" + schema + "." + table }
