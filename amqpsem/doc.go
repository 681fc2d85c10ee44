// Package amqpsem implements a persistent semaphore on RabbitMQ.
package amqpsem
