// Package natsputex implements a process mutex (putex) and leader election on a NATS JetStream KV key.
package natsputex
