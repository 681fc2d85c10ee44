package amqpsem

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The refusal RabbitMQ 4 answers a transient non-exclusive queue with
// (its text as RabbitMQ 4.0 to 4.3 send it, cut to an AMQP short string)
// is recognised, wrapped or not; other declare errors are not. This
// broker (3.x) cannot send it: TestPythonLayoutRefusedClearly sees it on
// a broker that does.
func TestTransientRefusalRecognised(t *testing.T) {
	refusal := &amqp.Error{Code: 541, Server: true, Reason: "INTERNAL_ERROR - Feature `transient_nonexcl_queues` is deprecated.\nBy default, this feature is not permitted anymore.\nThe feature will be removed from a future major RabbitMQ version, regardless of the configuration; actual version to be determined.\nTo..."}
	for _, err := range []error{refusal, fmt.Errorf("declare: %w", refusal)} {
		if !transientRefused(err) {
			t.Errorf("not recognised: %v", err)
		}
	}
	for _, err := range []error{
		&amqp.Error{Code: 406, Reason: "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q'"},
		&amqp.Error{Code: 541, Reason: "INTERNAL_ERROR"},
		nil,
	} {
		if transientRefused(err) {
			t.Errorf("recognised as the transient refusal: %v", err)
		}
	}
}
