package store

import (
	"crypto/tls"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// TLSRisk says how the connections databaseURL describes (environment
// variables such as PGSSLMODE included) could be read or changed on the
// way to a server that is not on this host: for each such server reached
// without TLS, with TLS whose certificate is not verified, or with a
// plaintext fallback, what is wrong. It is empty when every server is
// reached over verified TLS (sslmode=verify-full, or verify-ca) or is on
// this host (a loopback address, localhost or a Unix socket). pgx's
// default, like libpq's, is sslmode=prefer: TLS without verification,
// and plaintext if the server offers no TLS. A URL that does not parse has
// no risk to report: opening it says what is wrong.
func TLSRisk(databaseURL string) string {
	cc, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return ""
	}
	return tlsRisk(cc)
}

// tlsRisk is [TLSRisk] of a parsed configuration: its first host and
// every fallback pgx may try after it, each with the TLS it would use.
func tlsRisk(cc *pgconn.Config) string {
	type way struct{ plain, unverified, anyCA, verified int }
	var order []string
	ways := map[string]*way{}
	note := func(host string, port uint16, tc *tls.Config) {
		if local(host, port) {
			return
		}
		addr := net.JoinHostPort(host, strconv.Itoa(int(port)))
		w, ok := ways[addr]
		if !ok {
			w = &way{}
			ways[addr] = w
			order = append(order, addr)
		}
		switch {
		case tc == nil:
			w.plain++
		case tc.InsecureSkipVerify && tc.VerifyPeerCertificate == nil:
			// sslmode=require, prefer or allow: any certificate passes.
			w.unverified++
		case tc.InsecureSkipVerify && tc.RootCAs == nil:
			// verify-ca without sslrootcert: any certificate a public CA
			// signed passes, whatever name it is for.
			w.anyCA++
		default:
			// verify-full checks the chain and the name; verify-ca (or
			// require with sslrootcert) checks the chain in
			// VerifyPeerCertificate.
			w.verified++
		}
	}
	note(cc.Host, cc.Port, cc.TLSConfig)
	for _, f := range cc.Fallbacks {
		note(f.Host, f.Port, f.TLSConfig)
	}
	var risks []string
	for _, addr := range order {
		w := ways[addr]
		switch {
		case w.plain > 0 && w.unverified == 0 && w.verified == 0:
			risks = append(risks, addr+" without TLS (sslmode=disable)")
		case w.plain > 0:
			risks = append(risks, addr+" with unverified TLS that falls back to plaintext (sslmode=prefer or allow)")
		case w.unverified > 0:
			risks = append(risks, addr+" with TLS whose certificate is not verified (sslmode=require)")
		case w.anyCA > 0:
			risks = append(risks, addr+" with TLS that accepts any certificate a public CA signed, for any name (sslmode=verify-ca without sslrootcert)")
		}
	}
	return strings.Join(risks, "; ")
}

// local reports whether host is this machine: a Unix socket, a loopback
// address or localhost.
func local(host string, port uint16) bool {
	if network, _ := pgconn.NetworkAddress(host, port); network == "unix" {
		return true
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
