package amqpsem

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/locks"
	"github.com/latchkey-go/latchkey/locks/driver"
)

// maxShortString is the longest AMQP short string, the limit of queue
// names, exchange names and routing keys.
const maxShortString = 255

// MaxSemaphoreSize is the largest number of slots a semaphore may have. A long
// name may allow fewer: a semaphore's slots stop at the last one whose
// slot and holder queue names fit in 255 bytes (see [Layout.SlotLimit]).
const MaxSemaphoreSize = 65535

// A Layout says how the queues of a semaphore named N are named and
// declared: the slot queues A[i], the holder queues B[i] and the
// administration mutex. Every client and administrator of one semaphore
// must use the same layout, names and arguments alike: RabbitMQ refuses a
// declare whose arguments differ from the existing queue's
// (PRECONDITION_FAILED).
//
// The [Locker] uses the layout's Mutex name and Args for its queue, so a
// lock on N is the administration mutex of the semaphore N.
type Layout struct {
	// Name names the layout in messages and [Status]: "default" and
	// "python" for the layouts of this package.
	Name string
	// Slot returns the name of A[i], for i from 1.
	Slot func(name string, i int) string
	// Holder returns the name of B[i], for i from 1.
	Holder func(name string, i int) string
	// Mutex returns the name of the administration mutex queue. It must
	// not collide with any A or B queue name of the same semaphore.
	Mutex func(name string) string
	// SlotDurable declares A queues durable, so that slots survive a
	// broker restart. B and mutex queues are always exclusive and never
	// durable.
	SlotDurable bool
	// Args are the declare arguments of every queue of the layout.
	Args amqp.Table
	// Check, if not nil, rejects names whose queues could be mistaken for
	// another semaphore's (for the default layout, names that end like a
	// slot or holder queue). It applies to semaphore and mutex names
	// alike. It returns a plain reason; the caller wraps it with
	// [locks.ErrInvalidName].
	Check func(name string) error
}

var (
	defaultReserved = regexp.MustCompile(`-[0-9]+-[AB]$`)
	pythonReserved  = regexp.MustCompile(`-[AB]-[0-9]+$`)
)

// DefaultLayout is this package's layout, the specification's naming:
// A[i] is "N-i-A" (durable), B[i] is "N-i-B", the administration mutex is
// "N"; every queue is declared with x-max-length 0, so that the probe
// messages existence checks publish never pile up. Names ending in
// "-<digits>-A" or "-<digits>-B" are rejected: their mutex would be
// another semaphore's slot or holder queue.
var DefaultLayout = Layout{
	Name:        "default",
	Slot:        func(name string, i int) string { return name + "-" + strconv.Itoa(i) + "-A" },
	Holder:      func(name string, i int) string { return name + "-" + strconv.Itoa(i) + "-B" },
	Mutex:       func(name string) string { return name },
	SlotDurable: true,
	Args:        amqp.Table{"x-max-length": int32(0)},
	Check: func(name string) error {
		if defaultReserved.MatchString(name) {
			return errors.New(`must not end in "-<digits>-A" or "-<digits>-B" (a slot or holder queue name)`)
		}
		return nil
	},
}

// PythonLayout is the layout of the existing Python implementation of the
// specification, for sharing its semaphores: A[i] is "N-A-i" and not
// durable, B[i] is "N-B-i", the administration mutex is "N", every queue
// is declared with x-max-length 0.
var PythonLayout = Layout{
	Name:        "python",
	Slot:        func(name string, i int) string { return name + "-A-" + strconv.Itoa(i) },
	Holder:      func(name string, i int) string { return name + "-B-" + strconv.Itoa(i) },
	Mutex:       func(name string) string { return name },
	SlotDurable: false,
	Args:        amqp.Table{"x-max-length": int32(0)},
	Check: func(name string) error {
		if pythonReserved.MatchString(name) {
			return errors.New(`must not end in "-A-<digits>" or "-B-<digits>" (a slot or holder queue name)`)
		}
		return nil
	},
}

func (l Layout) validate() error {
	if l.Slot == nil || l.Holder == nil || l.Mutex == nil {
		return driver.InvalidOption("layout needs Slot, Holder and Mutex functions")
	}
	if err := l.Args.Validate(); err != nil {
		return driver.InvalidOption("layout arguments: %v", err)
	}
	a, b, m := l.Slot("n", 1), l.Holder("n", 1), l.Mutex("n")
	if a == b || a == m || b == m || a == l.Slot("n", 2) || b == l.Holder("n", 2) {
		return driver.InvalidOption("layout gives colliding queue names: %q, %q, %q", a, b, m)
	}
	return nil
}

// queueName checks one queue name the way RabbitMQ will: a short string of
// at most 255 bytes, not starting with the reserved prefix "amq.".
func queueName(q string) error {
	switch {
	case len(q) > maxShortString:
		return fmt.Errorf("queue name %.40q... is %d bytes, longer than %d", q, len(q), maxShortString)
	case strings.HasPrefix(q, "amq."):
		return fmt.Errorf("queue name %q starts with the reserved prefix \"amq.\"", q)
	}
	return nil
}

// names is the rule for what the caller gives: non-empty UTF-8 without
// control characters. The queue names made from it are checked after.
var names = driver.NameRule{What: "amqpsem name", MaxLen: maxShortString}

// checkMutexName validates a mutex name and returns its queue. The
// queue must not look like a shared wake queue (see [turnQueue]), and the
// layout's Check applies: a mutex on a name that ends like a slot or
// holder queue would be that queue (for [DefaultLayout], a mutex on
// "jobs-3-A" would create slot 3 of the semaphore jobs).
func (l Layout) checkMutexName(name string) (string, error) {
	if err := names.Check(name); err != nil {
		return "", err
	}
	if l.Check != nil {
		if err := l.Check(name); err != nil {
			return "", fmt.Errorf("%w %q: %w", locks.ErrInvalidName, name, err)
		}
	}
	q := l.Mutex(name)
	if err := queueName(q); err != nil {
		return "", fmt.Errorf("%w %q: %w", locks.ErrInvalidName, name, err)
	}
	for _, p := range []string{turnPrefix, turnHashPrefix} {
		if strings.HasPrefix(q, p) {
			// It would be, or block, another name's shared wake queue.
			return "", fmt.Errorf("%w %q: queue name %q starts with %q, which amqpsem reserves for its wake queues", locks.ErrInvalidName, name, q, p)
		}
	}
	return q, nil
}

// CheckName reports whether name is a valid semaphore name under l: the
// check every [Semaphore] and [Admin] call makes before any I/O. The
// error matches [locks.ErrInvalidName].
func (l Layout) CheckName(name string) error { return l.checkSemName(name) }

// checkSemName validates a semaphore name: its mutex queue and its first
// slot and holder queues must be legal queue names. Slots whose queue
// names would be too long are beyond the name's [Layout.SlotLimit].
func (l Layout) checkSemName(name string) error {
	if _, err := l.checkMutexName(name); err != nil {
		return err
	}
	for _, q := range []string{l.Slot(name, 1), l.Holder(name, 1)} {
		if err := queueName(q); err != nil {
			return fmt.Errorf("%w %q: %w", locks.ErrInvalidName, name, err)
		}
	}
	return nil
}

// SlotLimit returns the largest number of slots the semaphore name can
// have under l: [MaxSemaphoreSize], or fewer for a name so long that the queue
// names of higher slots would not fit in 255 bytes (a name of 251 bytes
// in [PythonLayout] has "name-A-9" but not "name-A-10"). It is 0 for a
// name whose first slot does not fit. Creating or adding slots beyond it
// fails with [ErrInvalidSlots]; status checks and scans stop there.
func (l Layout) SlotLimit(name string) int {
	fits := func(i int) bool {
		return len(l.Slot(name, i)) <= maxShortString && len(l.Holder(name, i)) <= maxShortString
	}
	// Name lengths grow with the number of digits: try the largest
	// number of each length.
	for _, i := range []int{MaxSemaphoreSize, 9999, 999, 99, 9} {
		if fits(i) {
			return i
		}
	}
	return 0
}

// name returns the layout's name for messages.
func (l Layout) name() string {
	if l.Name == "" {
		return "custom"
	}
	return l.Name
}
