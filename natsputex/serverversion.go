package natsputex

import (
	"errors"
	"fmt"
	"log"
	"strconv"
	"strings"
)

// MinClusterVersion is the oldest nats-server release whose replicated
// streams check a write's expected revision in order with the other
// writes (nats-server issue #4320, fixed in 2.9.21 and in every 2.10 and
// later release). Before it, a stream leader checked the condition of
// every KV create and update before proposing it to the other replicas,
// so writes in flight together, all conditional on the same revision,
// could all succeed: two clients held one lock.
const MinClusterVersion = "2.9.21"

// ErrUnsafeServer is the error [New] returns, wrapped with the version
// and the bucket, for a replicated bucket on a NATS server older than
// [MinClusterVersion]; check it with [errors.Is].
var ErrUnsafeServer = errors.New("natsputex: NATS server unsafe for a replicated bucket")

// UnsafeServerVersion reports whether a nats-server of version v (such as
// "2.9.10" or "v2.10.0-RC.1") has issue #4320, which makes a replicated
// bucket unsafe (see [MinClusterVersion]). A version it cannot read is
// unsafe.
func UnsafeServerVersion(v string) bool {
	return versionLess(v, MinClusterVersion)
}

// versionLess reports whether version a is older than b. Only the
// numbers of major.minor.patch count; a version that does not parse is
// older than any.
func versionLess(a, b string) bool {
	pa, oka := parseVersion(a)
	pb, _ := parseVersion(b)
	if !oka {
		return true
	}
	for i := range pa {
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return false
}

func parseVersion(v string) ([3]int, bool) {
	var p [3]int
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	f := strings.Split(v, ".")
	if len(f) != 3 {
		return p, false
	}
	for i, s := range f {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return p, false
		}
		p[i] = n
	}
	return p, true
}

// checkServer returns nil if a bucket with replicas replicas is safe on a
// server of version, and an error matching ErrUnsafeServer otherwise,
// unless o allows unsafe servers: then it passes the error to o's warning
// and returns nil.
func (o *options) checkServer(bucket, version string, replicas int) error {
	if replicas <= 1 || !UnsafeServerVersion(version) {
		return nil
	}
	if version == "" {
		version = "of unknown version"
	}
	err := fmt.Errorf("%w: bucket %q: nats-server %s with %d replicas: before %s a replicated stream checks a write's expected revision outside its Raft log, "+
		"so concurrent conditional writes can all succeed and two clients can hold one lock (nats-server issue #4320); "+
		"upgrade every node to %s or later, use a bucket with 1 replica, or pass WithUnsafeServer to run anyway",
		ErrUnsafeServer, bucket, version, replicas, MinClusterVersion, MinClusterVersion)
	if !o.unsafeServer {
		return err
	}
	if o.warn != nil {
		o.warn(err)
	} else {
		log.Printf("natsputex: warning: %v", err)
	}
	return nil
}
