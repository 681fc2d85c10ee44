package main_test

import (
	"net"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/latchkey-go/latchkey/contracttest/cmdtest"
	"github.com/latchkey-go/latchkey/contracttest/testenv"
)

// The command as operators use it (issue 18): wait and status see every
// held removed slot, one name is one layout's semaphore, a missing
// semaphore says so, no password is ever printed, and the messages say
// what is wrong.

// holder is a plain AMQP connection that holds exclusive queues, as a
// client holding slots does.
func holder(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func hold(t *testing.T, ch *amqp.Channel, q string) {
	t.Helper()
	if _, err := ch.QueueDeclare(q, false, false, true, false, amqp.Table{"x-max-length": int32(0)}); err != nil {
		t.Fatalf("holding %q: %v", q, err)
	}
}

func let(t *testing.T, ch *amqp.Channel, q string) {
	t.Helper()
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		t.Fatalf("deleting %q: %v", q, err)
	}
}

// A holder of slot 80 of 100 after "resize NAME 5": status shows it and
// wait does not report success until it lets go.
func TestCommandWaitSeesHighSlot(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := cmdtest.Build(t, ".")
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url)
	t.Cleanup(func() { run("destroy", name) })
	expect(0, "created", "create", name, "100")
	ch := holder(t, url)
	hold(t, ch, name+"-80-B")
	expect(0, "to 5 slots", "resize", name, "5")
	expect(0, "slot 80: removed, still held", "status", name)
	expect(3, "80", "--timeout", "15s", "wait", name)
	let(t, ch, name+"-80-B")
	expect(0, "no removed slot", "--timeout", "30s", "wait", name)
}

// One name, one layout: the command refuses to create a semaphore beside
// one of the other layout, status says which layout a name is in, and
// AMQPSEM_LAYOUT sets the layout.
func TestCommandOneLayout(t *testing.T) {
	url := testenv.AMQPURL(t)
	needTransient(t, url)
	bin := cmdtest.Build(t, ".")
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url)
	t.Cleanup(func() {
		run("--layout", "python", "destroy", name)
		run("destroy", name)
	})
	expect(0, "created "+name+" with 2 slots", "--layout", "python", "create", name, "2")
	expect(1, "python layout", "create", name, "3")
	expect(1, "python layout", "resize", name, "3")
	expect(1, "python layout", "status", name)
	out, code := cmdtest.RunEnv(t, bin, []string{"AMQPSEM_LAYOUT=python"}, "--url", url, "status", name)
	if code != 0 || !strings.Contains(out, "(python layout): 2 slots, 0 held") {
		t.Fatalf("AMQPSEM_LAYOUT=python status: exit %d:\n%s", code, out)
	}
	// Nothing was created in the default layout, and destroy says so.
	expect(1, "it is a semaphore of the python layout", "destroy", name)
}

// Acquiring a semaphore that does not exist fails at once, saying so,
// instead of waiting.
func TestCommandAcquireMissing(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := cmdtest.Build(t, ".")
	_, expect := runner(t, bin, "--url", url)
	start := time.Now()
	out := expect(1, "no slots", "--timeout", "20s", "acquire", uniqueName(), "--", "true")
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("acquire of a missing semaphore took %v:\n%s", d, out)
	}
}

// No password is printed: not in --help (the URL's default comes from
// AMQPSEM_URL), nor in errors for URLs that do not parse, brokers that
// cannot be reached, or refused credentials.
func TestCommandNeverPrintsPassword(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := cmdtest.Build(t, ".")
	const secret = "s3cretPw"
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	wrong := *u
	wrong.User = neturl.UserPassword("guest", secret)
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{[]string{"AMQPSEM_URL=amqp://admin:" + secret + "@127.0.0.1:1/"}, []string{"--help"}},
		{[]string{"AMQPSEM_URL=amqp://admin:" + secret + "@127.0.0.1:1/"}, []string{"status", "x"}},
		{nil, []string{"--url", "amqp://admin:" + secret + "@host:xx/", "status", "x"}},
		{nil, []string{"--url", "amqp://admin:" + secret + "@[::1/", "status", "x"}},
		{nil, []string{"--url", "amqp://admin:" + secret + "@127.0.0.1:1/", "status", "x"}},
		{nil, []string{"--url", wrong.String(), "status", "x"}},
		{[]string{"AMQPSEM_URL=" + wrong.String()}, []string{"acquire", "x", "--", "true"}},
	} {
		out, code := cmdtest.RunEnv(t, bin, tc.env, tc.args...)
		if strings.Contains(out, secret) {
			t.Errorf("%v %v (exit %d) printed the password:\n%s", tc.env, tc.args, code, out)
		}
	}
}

// silentListener accepts connections and never answers, like a broker
// host whose AMQP port is black-holed after the TCP handshake.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// What operators type, and what they are told.
func TestCommandOperatorMessages(t *testing.T) {
	url := testenv.AMQPURL(t)
	bin := cmdtest.Build(t, ".")
	name := uniqueName()
	run, expect := runner(t, bin, "--url", url)
	t.Cleanup(func() { run("destroy", name) })

	expect(64, `unknown command "stauts"`, "stauts", name)
	expect(64, "missing NAME", "status")
	expect(64, "no command", "--try")
	// A semaphore that does not exist is not "0 slots".
	expect(1, "no semaphore "+name, "status", name)
	expect(1, "no semaphore "+name, "destroy", name)
	// "1 slot", and no internal "locks:" prefix.
	expect(0, "created "+name+" with 1 slot\n", "create", name, "1")
	expect(0, name+" (default layout): 1 slot, 0 held", "status", name)
	for _, args := range [][]string{
		{"create", "amq.nope", "2"},
		{"create", name, "1"},
		{"--layout", "python", "create", name, "1"},
	} {
		// One report: a usage error's plain "amqpsem: " line, or one
		// structured line with level=ERROR and no prefix in its error.
		out, code := run(args...)
		plain, logged := strings.Count(out, "amqpsem:"), strings.Count(out, "level=ERROR")
		if code == 0 || strings.Contains(out, "locks:") || plain+logged != 1 || logged == 1 && !strings.Contains(out, " command=create name=") {
			t.Errorf("amqpsem %v: exit %d, output with internal or repeated prefixes, or not one report:\n%s", args, code, out)
		}
	}
	ch := holder(t, url)
	hold(t, ch, name+"-1-B")
	if out := expect(3, "", "--try", "acquire", name, "--", "true"); strings.Contains(out, "locks:") {
		t.Errorf("--try acquire of a held slot shows an internal prefix:\n%s", out)
	}
	let(t, ch, name+"-1-B")

	// resize waiting for the administration mutex says so.
	hold(t, ch, name)
	b := cmdtest.Start(t, bin, "--url", url, "resize", name, "+1")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.Out.String(), `level=INFO msg="waiting for the administration mutex: `) || !strings.Contains(b.Out.String(), " command=resize name="+name+" mutex_queue="+name) {
		if time.Now().After(deadline) {
			t.Fatalf("resize waiting for the mutex said nothing in 10s:\n%s", b.Out.String())
		}
		b.Running(t)
		time.Sleep(50 * time.Millisecond)
	}
	let(t, ch, name)
	if code := b.ExitCode(t, 20*time.Second); code != 0 || !strings.Contains(b.Out.String(), "from 1 to 2 slots") {
		t.Fatalf("resize after the mutex was freed: exit %d:\n%s", code, b.Out.String())
	}

	// A broker that never answers: --connect-timeout ends the dial (exit
	// 1), and --timeout too (exit 3, "not acquired / timed out").
	silent := "amqp://guest:guest@" + silentListener(t) + "/"
	start := time.Now()
	expect(1, "connect timeout", "--url", silent, "--connect-timeout", "1s", "status", name)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("--connect-timeout 1s took %v", d)
	}
	expect(3, "deadline", "--url", silent, "--timeout", "1s", "status", name)

	// Python-layout names of 248 to 251 bytes, which the Python client
	// uses, are accepted.
	needTransient(t, url)
	long := name + strings.Repeat("p", 248-len(name))
	t.Cleanup(func() { run("--layout", "python", "destroy", long) })
	expect(0, "created", "--layout", "python", "create", long, "2")
	expect(0, "2 slots", "--layout", "python", "status", long)
}

// needTransient skips the rest of a test of the Python layout on a broker
// that refuses its transient slot queues (RabbitMQ 4.3+ by default).
func needTransient(t *testing.T, url string) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, false, false, nil)
	if err != nil && strings.Contains(err.Error(), "transient_nonexcl_queues") {
		t.Skip("this broker refuses transient non-exclusive queues, which the Python layout's slot queues are")
	}
	if err != nil {
		t.Fatal(err)
	}
	_, _ = ch.QueueDelete(q.Name, false, false, false)
}
