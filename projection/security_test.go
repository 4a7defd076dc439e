package projection

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	mathbig "math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/projector/projector/internal/testkit/kafkatest"
	"github.com/projector/projector/internal/testkit/pgtest"
	kafkasrc "github.com/projector/projector/source/kafka"
)

// authFailWithin is how soon a refused credential or certificate must stop
// Run.
const authFailWithin = 30 * time.Second

// projectsThrough runs a projector with cfg's security on a topic of c and
// checks that records are projected.
func projectsThrough(t *testing.T, c *kafkatest.Cluster, mod func(*Config)) {
	t.Helper()
	r := &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, 2), store: pgtest.Store(t), parts: 2}
	run := r.start(r.config(mod))
	s := newStream(2)
	for _, j := range jobIDs("sec", 20) {
		s.snapshots(j, 1, 2)
	}
	s.flush(r)
	r.caughtUp(30*time.Second, run)
	r.requireModel(s)
	r.eventually(10*time.Second, "ready", func() (bool, string) { return run.p.Ready(), failing(run.p.Readiness()) })
}

// refused runs a projector that the broker must refuse, and returns Run's
// error and the log; Run must return within authFailWithin.
func refused(t *testing.T, c *kafkatest.Cluster, mod func(*Config)) (*AuthError, string) {
	t.Helper()
	r := &rig{t: t, kafka: c, topic: kafkatest.Topic(t, c, 1), store: pgtest.Store(t), parts: 1}
	logs := &logLines{t: t}
	cfg := r.config(mod, func(c *Config) { c.Logger = logs.logger() })
	p, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), authFailWithin)
	defer cancel()
	err = p.Run(ctx)
	require.NoError(t, ctx.Err(), "Run did not stop within %s", authFailWithin)
	var ae *AuthError
	require.True(t, errors.As(err, &ae), "Run returned %v, want an *AuthError", err)
	require.Contains(t, err.Error(), "authentication failed")
	return ae, strings.Join(logs.matching(""), "\n")
}

// TestSASL: for each mechanism, the right credentials project; a wrong
// password stops Run within 30 s with an error naming the mechanism and
// the user, and the password appears nowhere.
func TestSASL(t *testing.T) {
	t.Parallel()
	const user, password, wrong = "projector", "right-horse-battery", "wrong-staple-9f3"
	for _, mech := range []string{SASLPlain, SASLScramSHA256, SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			var m sasl.Mechanism = plain.Mechanism{Username: user, Password: password}
			if mech != SASLPlain {
				algo := scram.SHA256
				if mech == SASLScramSHA512 {
					algo = scram.SHA512
				}
				var err error
				m, err = scram.Mechanism(algo, user, password)
				require.NoError(t, err)
			}
			c := kafkatest.New(t,
				kafkatest.WithKfakeOptions(kfake.EnableSASL(), kfake.Superuser(mech, user, password)),
				kafkatest.WithClientSecurity(nil, m))

			projectsThrough(t, c, func(cfg *Config) { cfg.SASL = &SASL{Mechanism: mech, Username: user, Password: password} })

			ae, logs := refused(t, c, func(cfg *Config) { cfg.SASL = &SASL{Mechanism: mech, Username: user, Password: wrong} })
			require.Equal(t, mech, ae.Mechanism)
			require.Equal(t, user, ae.User)
			msg := ae.Error()
			require.Contains(t, msg, mech)
			require.Contains(t, msg, `"`+user+`"`)
			for _, secret := range []string{wrong, password} {
				require.NotContains(t, msg, secret)
				require.NotContains(t, logs, secret)
			}
		})
	}
}

// testPKI is a throwaway CA with a broker certificate for 127.0.0.1 and a
// client certificate.
type testPKI struct {
	pool           *x509.CertPool
	server, client tls.Certificate
}

func newPKI(t *testing.T) testPKI {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{
		SerialNumber: mathbig.NewInt(1), Subject: pkix.Name{CommonName: "projector test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips ...net.IP) tls.Certificate {
		k := key()
		tmpl := &x509.Certificate{
			SerialNumber: mathbig.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		require.NoError(t, err)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{
		pool:   pool,
		server: issue(2, "broker", x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1)),
		client: issue(3, "projector", x509.ExtKeyUsageClientAuth),
	}
}

// TestTLS: a broker that requires client certificates serves a projector
// with one and refuses one without (Run stops within 30 s saying
// authentication failed); a broker that does not require them serves a
// projector that only verifies the broker; a projector that does not trust
// the broker's CA is refused.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	withCert := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12}
	noCert := &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12}

	t.Run("client certificate required", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.New(t,
			kafkatest.WithKfakeOptions(kfake.TLS(&tls.Config{
				Certificates: []tls.Certificate{pki.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.pool,
			})),
			kafkatest.WithClientSecurity(withCert, nil))
		projectsThrough(t, c, func(cfg *Config) { cfg.TLS = withCert.Clone() })
		ae, _ := refused(t, c, func(cfg *Config) { cfg.TLS = noCert.Clone() })
		require.True(t, ae.TLS)
	})
	t.Run("server certificate only", func(t *testing.T) {
		t.Parallel()
		c := kafkatest.New(t,
			kafkatest.WithKfakeOptions(kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}})),
			kafkatest.WithClientSecurity(noCert, nil))
		projectsThrough(t, c, func(cfg *Config) { cfg.TLS = noCert.Clone() })
		other := newPKI(t)
		ae, _ := refused(t, c, func(cfg *Config) { cfg.TLS = &tls.Config{RootCAs: other.pool, MinVersion: tls.VersionTLS12} })
		require.True(t, ae.TLS)
		require.Contains(t, ae.Error(), "certificate")
	})
}

// TestSCRAMPasswordRefusedBySASLprepStaysSecret: a password SASLprep
// refuses (here with a control character) is a configuration error that
// names the mechanism and the user and never quotes the password, from
// Validate and from New alike (the SCRAM library's own error quotes it).
func TestSCRAMPasswordRefusedBySASLprepStaysSecret(t *testing.T) {
	t.Parallel()
	const secret = "hunter2\x07tail-9c1"
	for _, mech := range []string{SASLScramSHA256, SASLScramSHA512} {
		s := &SASL{Mechanism: mech, Username: "app", Password: secret}
		err := s.Validate()
		require.Error(t, err, mech)
		require.NotContains(t, err.Error(), "hunter2", mech)
		require.Contains(t, err.Error(), mech)
		require.Contains(t, err.Error(), `"app"`)
		_, err = kafkasrc.Connect(Kafka{Brokers: []string{"127.0.0.1:9092"}, SASL: s})
		require.Error(t, err, mech)
		require.NotContains(t, err.Error(), "hunter2", mech)
	}
}
