package amqpsem_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/latchkey-go/latchkey/amqpsem"
)

// Dial's errors never show the URL's password: not for URLs that do not
// parse (net/url quotes the whole URL), brokers that cannot be reached,
// or refused credentials.
func TestDialErrorsHidePassword(t *testing.T) {
	u, _ := amqpURL(t)
	const secret = "s3cretPw"
	good, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	wrong := *good
	wrong.User = url.UserPassword("guest", secret)
	for _, raw := range []string{
		"amqp://admin:" + secret + "@host:xx/",
		"amqp://admin:" + secret + "@[::1/",
		"amqp://admin:" + secret + "@host:99999999999/",
		"amqp://admin:" + secret + "@127.0.0.1:1/",
		wrong.String(),
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := amqpsem.Dial(ctx, raw, amqpsem.WithConnectTimeout(3*time.Second))
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			t.Errorf("Dial(%s) succeeded", amqpsem.RedactURL(raw))
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Dial's error shows the password: %v", err)
		}
	}
	if got := amqpsem.RedactURL("amqp://admin:" + secret + "@h/v"); got != "amqp://admin:xxxxx@h/v" {
		t.Errorf("RedactURL = %q", got)
	}
}
