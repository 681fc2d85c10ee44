package natsenv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// An Operator is the root of trust of servers in operator (JWT) mode,
// made for one test: an operator nkey, the system account and one
// account with JetStream, unlimited, whose JWTs the operator signed and
// which the servers find in a memory resolver. Users are made by
// [Operator.NewUser], as `nsc add user` would, and authenticate with
// their credentials file: the server stores nothing about them.
//
// Pass an Operator in [ServerConfig.Operator]; several servers may share
// one. Its methods are safe to call from several goroutines.
type Operator struct {
	claims   *jwt.OperatorClaims
	resolver *server.MemAccResolver
	account  nkeys.KeyPair // signs the users' JWTs
}

// Creds are a user's credentials: its JWT, signed by its account, and its
// nkey seed, in a credentials (.creds) file as nsc writes them and as
// nats.UserCredentials reads them.
type Creds struct {
	// File is the path of the credentials file, readable by its owner
	// only, in a temporary directory removed at the end of the test.
	File string
	// JWT is the user's JWT, as in File. It is a bearer of the user's
	// identity and permissions: like Seed, it must not appear in logs.
	JWT string
	// Seed is the user's nkey seed, as in File: its private key.
	Seed string
}

// NewOperator makes an operator, the system account and one account with
// JetStream, each with fresh nkeys. The test fails if they cannot be
// made. NewOperator must be called from the goroutine running the test.
func NewOperator(t testing.TB) *Operator {
	t.Helper()
	o, err := forTest(t).NewOperator()
	testenv.Require(t, err)
	return o
}

// NewOperator is [NewOperator] returning an error.
func (e Env) NewOperator() (*Operator, error) {
	o, err := newOperator()
	if err != nil {
		return nil, fmt.Errorf("natsenv: operator: %w", err)
	}
	return o, nil
}

func newOperator() (*Operator, error) {
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return nil, err
	}
	opub, err := okp.PublicKey()
	if err != nil {
		return nil, err
	}
	resolver := &server.MemAccResolver{}
	// account makes an account signed by the operator and stores its JWT
	// in the resolver.
	account := func(name string, limits func(*jwt.AccountClaims)) (nkeys.KeyPair, string, error) {
		akp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, "", err
		}
		apub, err := akp.PublicKey()
		if err != nil {
			return nil, "", err
		}
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if limits != nil {
			limits(ac)
		}
		ajwt, err := ac.Encode(okp)
		if err != nil {
			return nil, "", fmt.Errorf("account %s: %w", name, err)
		}
		if err := resolver.Store(apub, ajwt); err != nil {
			return nil, "", fmt.Errorf("account %s: %w", name, err)
		}
		return akp, apub, nil
	}
	_, sysPub, err := account("SYS", nil)
	if err != nil {
		return nil, err
	}
	akp, _, err := account("LATCHKEY", func(ac *jwt.AccountClaims) {
		// JetStream is enabled for an account by its limits; -1 is
		// unlimited (the server's own limits still apply).
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	})
	if err != nil {
		return nil, err
	}
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "latchkey-test"
	oc.SystemAccount = sysPub
	// Encoded and decoded again, as the server reads an operator JWT
	// from its configuration: that validates the claims and sets the
	// issuer.
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	if oc, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	return &Operator{claims: oc, resolver: resolver, account: akp}, nil
}

// NewUser makes a user of the operator's JetStream account, named name,
// with fresh nkeys and no limits or permissions of its own, and writes its
// credentials file. The test fails if they cannot be made. NewUser must be
// called from the goroutine running the test.
func (o *Operator) NewUser(t testing.TB, name string) Creds {
	t.Helper()
	c, err := forTest(t).NewUser(o, name)
	testenv.Require(t, err)
	return c
}

// NewUser is [Operator.NewUser] returning an error; the credentials file
// is removed at the testenv.Env's Close.
func (e Env) NewUser(o *Operator, name string) (Creds, error) {
	dir, err := e.TempDir()
	if err != nil {
		return Creds{}, err
	}
	c, err := o.newUser(name, dir)
	if err != nil {
		return Creds{}, fmt.Errorf("natsenv: user %s: %w", name, err)
	}
	return c, nil
}

func (o *Operator) newUser(name, dir string) (Creds, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return Creds{}, err
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		return Creds{}, err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return Creds{}, err
	}
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	ujwt, err := uc.Encode(o.account)
	if err != nil {
		return Creds{}, err
	}
	file, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		return Creds{}, err
	}
	path := filepath.Join(dir, name+".creds")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		return Creds{}, err
	}
	return Creds{File: path, JWT: ujwt, Seed: string(seed)}, nil
}
