package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"os"
	"strings"

	"github.com/projector/projector/projection"
)

// saslPasswordEnv carries the SASL password. There is deliberately no
// --kafka-sasl-password flag: a command line is visible to every user of
// the host (ps, /proc) and lands in shell history.
const saslPasswordEnv = "PROJECTOR_KAFKA_SASL_PASSWORD"

// kafkaFlags secure the connections to the brokers and say how
// transactions are read; run, rebuild, status and reset-positions share
// them.
type kafkaFlags struct {
	isolation    string
	tls          bool
	caFile       string
	certFile     string
	keyFile      string
	serverName   string
	saslMech     string
	saslUser     string
	passwordFile string
}

func (k *kafkaFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.isolation, "kafka-isolation", projection.ReadCommitted, "how records written in Kafka transactions are read: read_committed (as a Java\nconsumer with isolation.level=read_committed: committed transactions only,\nnothing past the last stable offset, lag measured to it) or read_uncommitted\n(every record as appended, those of open and aborted transactions too)")
	fs.BoolVar(&k.tls, "kafka-tls", false, "connect to the brokers over TLS, trusting the system's root CAs\n(implied by the other --kafka-tls-* flags)")
	fs.StringVar(&k.caFile, "kafka-tls-ca", "", "PEM file of the CA certificates that sign the brokers' certificates,\ninstead of the system's")
	fs.StringVar(&k.certFile, "kafka-tls-cert", "", "PEM file of this client's certificate, for brokers that require one\n(with --kafka-tls-key)")
	fs.StringVar(&k.keyFile, "kafka-tls-key", "", "PEM file of the private key of --kafka-tls-cert")
	fs.StringVar(&k.serverName, "kafka-tls-server-name", "", "name to verify the brokers' certificates against, when it is not\nthe host of --brokers")
	fs.StringVar(&k.saslMech, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; the password comes\nfrom "+saslPasswordEnv+" or --kafka-sasl-password-file, never a flag\n(use PLAIN only over TLS)")
	fs.StringVar(&k.saslUser, "kafka-sasl-username", "", "SASL username")
	fs.StringVar(&k.passwordFile, "kafka-sasl-password-file", "", "file holding the SASL password (one line; a trailing newline is dropped);\nthe alternative is "+saslPasswordEnv)
}

// apply builds the TLS and SASL settings onto brokers: a bad setting or an
// unreadable file is a usage error that names the flag.
func (k *kafkaFlags) apply(brokers []string) (projection.Kafka, error) {
	out := projection.Kafka{Brokers: brokers, Isolation: k.isolation}
	switch k.isolation {
	case projection.ReadCommitted, projection.ReadUncommitted:
	default:
		return out, usagef("--kafka-isolation %q: want %s or %s", k.isolation, projection.ReadCommitted, projection.ReadUncommitted)
	}
	if k.tls || k.caFile != "" || k.certFile != "" || k.keyFile != "" || k.serverName != "" {
		c, err := k.tlsConfig()
		if err != nil {
			return out, err
		}
		out.TLS = c
	}
	password, fromFile := os.Getenv(saslPasswordEnv), false
	if k.passwordFile != "" {
		b, err := os.ReadFile(k.passwordFile)
		if err != nil {
			return out, usagef("--kafka-sasl-password-file: %v", err)
		}
		password, fromFile = strings.TrimRight(string(b), "\r\n"), true
	}
	switch {
	case k.saslMech == "" && k.saslUser == "" && !fromFile:
		return out, nil
	case k.saslMech == "":
		return out, usagef("--kafka-sasl-username or --kafka-sasl-password-file is set without --kafka-sasl-mechanism: add --kafka-sasl-mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	}
	s := &projection.SASL{Mechanism: strings.ToUpper(k.saslMech), Username: k.saslUser, Password: password}
	switch s.Mechanism {
	case projection.SASLPlain, projection.SASLScramSHA256, projection.SASLScramSHA512:
	default:
		return out, usagef("--kafka-sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", k.saslMech)
	}
	if s.Username == "" {
		return out, usagef("--kafka-sasl-mechanism %s needs --kafka-sasl-username", s.Mechanism)
	}
	if s.Password == "" {
		return out, usagef("--kafka-sasl-mechanism %s needs a password: set %s or pass --kafka-sasl-password-file", s.Mechanism, saslPasswordEnv)
	}
	if err := s.Validate(); err != nil {
		return out, usagef("--kafka-sasl-mechanism %s: %v", s.Mechanism, err)
	}
	out.SASL = s
	return out, nil
}

func (k *kafkaFlags) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: k.serverName}
	if k.caFile != "" {
		pem, err := os.ReadFile(k.caFile)
		if err != nil {
			return nil, usagef("--kafka-tls-ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--kafka-tls-ca %s: no PEM certificate in the file", k.caFile)
		}
		c.RootCAs = pool
	}
	switch {
	case k.certFile != "" && k.keyFile != "":
		cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
		if err != nil {
			return nil, usagef("--kafka-tls-cert %s and --kafka-tls-key %s: %v", k.certFile, k.keyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case k.certFile != "" || k.keyFile != "":
		return nil, usagef("--kafka-tls-cert and --kafka-tls-key go together: give both or neither")
	}
	return c, nil
}
