// Package tests holds the tests of lockotel, in a module of their own so
// that lockotel's go.mod needs neither the OpenTelemetry SDK nor the
// brokers' clients: the SDK's in-memory reader and span recorder check
// what the wrappers record, over memlock and over real brokers
// (natsputex on an embedded NATS server, amqpsem on RabbitMQ, redlockprio
// on redis-server masters it starts).
//
// The tests should not produce false positives, may produce false
// negatives, and run under the race detector.
package tests
