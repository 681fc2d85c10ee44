package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TLS is a certificate authority made for one test, and one certificate it
// signed for 127.0.0.1, ::1 and localhost, usable by servers and by
// clients (mutual TLS). It is there as PEM files, for servers and
// commands, and as tls.Configs, for Go clients and in-process servers.
type TLS struct {
	CAFile   string // the authority's certificate
	CertFile string // the certificate for 127.0.0.1 and localhost
	KeyFile  string // its private key

	Server *tls.Config // presents the certificate; verifies client certificates it is given
	Client *tls.Config // trusts only the authority; presents the certificate
}

// NewTLS makes a fresh authority and certificate, valid for an hour, in a
// temporary directory removed at the end of the test. NewTLS must be
// called from the goroutine running the test.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	certs, err := ForTest(t).NewTLS()
	Require(t, err)
	return certs
}

// NewTLS is [NewTLS] returning an error; the directory is removed at
// [Env.Close].
func (e *Env) NewTLS() (*TLS, error) {
	certs, err := e.newTLS()
	if err != nil {
		return nil, fmt.Errorf("testenv: TLS: %w", err)
	}
	return certs, nil
}

func (e *Env) newTLS() (*TLS, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "latchkey test CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}

	dir, err := e.TempDir()
	if err != nil {
		return nil, err
	}
	files := &TLS{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "cert.pem"),
		KeyFile:  filepath.Join(dir, "key.pem"),
	}
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{{files.CAFile, "CERTIFICATE", caDER}, {files.CertFile, "CERTIFICATE", leafDER}, {files.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return nil, err
		}
	}
	pair, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	files.Server = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	files.Client = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return files, nil
}

// TLSFront listens with TLS on a free port of 127.0.0.1 and forwards each
// connection, decrypted, to upstream (host:port): a TLS endpoint in front
// of a broker that has none, such as the local RabbitMQ, so that clients'
// amqps:// support is tested against the real broker. It returns the
// address to dial; everything stops at the end of the test. TLSFront must
// be called from the goroutine running the test.
func TLSFront(t testing.TB, upstream string, certs *TLS) string {
	t.Helper()
	addr, err := ForTest(t).TLSFront(upstream, certs)
	Require(t, err)
	return addr
}

// TLSFront is [TLSFront] returning an error if it cannot listen; it
// stops at [Env.Close].
func (e *Env) TLSFront(upstream string, certs *TLS) (string, error) {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", certs.Server)
	if err != nil {
		return "", fmt.Errorf("testenv: TLS front for %s: %w", upstream, err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Go(func() {
				u, err := net.DialTimeout("tcp", upstream, proxyDialTimeout)
				if err != nil {
					c.Close()
					return
				}
				track(u)
				var pair sync.WaitGroup
				pair.Go(func() { _, _ = io.Copy(u, c); u.Close() })
				pair.Go(func() { _, _ = io.Copy(c, u); c.Close() })
				pair.Wait()
			})
		}
	})
	err = e.OnClose(func() error {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
		return nil
	})
	if err != nil {
		return "", err
	}
	return ln.Addr().String(), nil
}
