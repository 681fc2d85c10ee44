// Command natslock is putex's agent: it elects one node among several to
// run a service, using one key of a NATS JetStream KV bucket as the lock.
//
// Usage:
//
//	natslock [flags] <nats-url> <bucket> <key> <token>
//
// Run `natslock --help` for the meaning of R, F and C and an example.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/latchkey-go/latchkey/natsputex"
)

const usage = `natslock runs a service on at most one of several nodes, electing the node
through one key of a NATS JetStream KV bucket (putex's protocol).

Usage:
  natslock [flags] <nats-url> <bucket> <key> <token>

Every node runs natslock with the same bucket and key and its own token
(its host name, say). The token is written in the key while the node holds
it, so the bucket documents who runs the service.

Timing:
  R  lock renewal interval (-r): how often the active node runs its health
     check and rewrites its token in the key.
  F  failure threshold (-f): how many R must pass without any write to the
     key before a standby node may take it. T = F*R is the lock timeout,
     measured by each standby on its own clock (no clock sync needed), and
     the longest a health check may run.
  C  confirmation count (-c): how many R a node that took the key over
     waits, rewriting its token, before it fences the others and starts the
     service. A free key (missing or blank) is started on at once.

A failed write or health check, or another node's token in the key, stops
the service at once; an active node that could not renew for T minus a
safety margin (-margin, default R/2) begins to stop by itself then. A
standby starts no earlier than (F+C)*R after the last renewal, so the stop
command has margin + C*R to finish: choose -c for your slowest stop. A
dead node's service is taken over after about (F+C)*R.
On SIGTERM, SIGINT or SIGHUP natslock stops the service and blanks the
key. The commands run in process groups of their own, so that a command
cut short (a health check past T, a start when natslock stops) is killed
with every process it started; a signal to natslock's process group does
not reach them. Stop natslock with one of those signals, or run it under
a manager that kills its whole cgroup (systemd does): a natslock killed
outright leaves a command that is still running to finish on its own.

Example:
  natslock -r 1s -f 3 -c 1 \
    -healthcheck 'systemctl is-active --quiet db.service || [ "$1" = standby ]' \
    -start 'systemctl start db.service' -stop 'systemctl stop db.service' \
    nats://nats.cluster.local:4222 locks spof-service "$(hostname)"

Flags:
`

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	fs := flag.NewFlagSet("natslock", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	r := fs.Duration("r", time.Second, "R, the lock renewal interval")
	f := fs.Int("f", 3, "F, renewal intervals without a write before a standby takes the key")
	c := fs.Int("c", 1, "C, renewal intervals to wait after a takeover before starting the service")
	margin := fs.Duration("margin", 0, "safety margin: an active node stops after T minus this without a renewal (default R/2)")
	health := fs.String("healthcheck", "", "health-check command, run with sh -c; $1 and $NATSLOCK_STATE are active or standby")
	start := fs.String("start", "", "command that unfences this node, fences the others and starts the service")
	stop := fs.String("stop", "", "command that kills or fences the service on this node")
	creds := fs.String("creds", "", "NATS credentials file")
	tlsCert := fs.String("tlscert", "", "TLS client certificate file")
	tlsKey := fs.String("tlskey", "", "TLS client key file")
	tlsCA := fs.String("tlsca", "", "TLS CA certificate file")
	replicas := fs.Int("replicas", 1, "replicas of the bucket, if natslock creates it")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if fs.NArg() != 4 {
		fs.Usage()
		os.Exit(2)
	}
	url, bucket, key, token := fs.Arg(0), fs.Arg(1), fs.Arg(2), fs.Arg(3)

	opts := []natsputex.Option{
		natsputex.WithRenewInterval(*r), natsputex.WithFailureThreshold(*f),
		natsputex.WithConfirmations(*c), natsputex.WithReplicas(*replicas),
	}
	if *margin != 0 {
		opts = append(opts, natsputex.WithSafetyMargin(*margin))
	}
	if *health != "" {
		opts = append(opts, natsputex.WithHealthCheck(natsputex.CommandHealthCheck(*health)))
	}
	// Every argument is checked before any I/O: a typo must not wait for
	// a connection to fail first.
	if url == "" {
		fmt.Fprintln(fs.Output(), "natslock: empty NATS URL")
		os.Exit(2)
	}
	if err := natsputex.CheckSupervisor(bucket, key, token, opts...); err != nil {
		fmt.Fprintf(fs.Output(), "natslock: %v\nRun natslock -help for usage.\n", err)
		os.Exit(2)
	}
	natsOpts := []nats.Option{nats.Name("natslock " + token), nats.MaxReconnects(-1)}
	if *creds != "" {
		natsOpts = append(natsOpts, nats.UserCredentials(*creds))
	}
	if *tlsCert != "" || *tlsKey != "" {
		natsOpts = append(natsOpts, nats.ClientCert(*tlsCert, *tlsKey))
	}
	if *tlsCA != "" {
		natsOpts = append(natsOpts, nats.RootCAs(*tlsCA))
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer cancel()
	if err := run(ctx, url, bucket, key, token, *start, *stop, natsOpts, opts); err != nil {
		log.Printf("natslock: %v", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, bucket, key, token, start, stop string, natsOpts []nats.Option, opts []natsputex.Option) error {
	nc, err := nats.Connect(url, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	client, err := natsputex.New(ctx, js, bucket, opts...)
	if err != nil {
		return err
	}
	defer client.Close()
	sup, err := client.Supervisor(key, token, natsputex.CommandService(start, stop, func(e natsputex.Event) {
		log.Printf("natslock: key=%s %s", key, e)
	}))
	if err != nil {
		return err
	}
	log.Printf("natslock: key=%s token=%q T=%v: running", key, token, client.TTL())
	if err := sup.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
