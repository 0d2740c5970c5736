package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/webhook"
)

// GitHub's documented example of webhook validation: this secret and payload give this
// signature.
func TestGitHub_DocumentedExample(t *testing.T) {
	t.Parallel()
	v := webhook.GitHub([]byte("It's a Secret to Everybody"))
	h := http.Header{}
	h.Set("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	h.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	h.Set("X-GitHub-Event", "ping")
	got, err := v.Verify(h, []byte("Hello, World!"))
	require.NoError(t, err)
	require.Equal(t, webhook.Verified{ID: "72d3162e-cc78-11e3-81ab-4c9367dc0958", Event: "ping"}, got)

	_, err = v.Verify(h, []byte("Hello, World?"))
	require.ErrorIs(t, err, webhook.ErrSignature)
	h.Set("X-Hub-Signature-256", "sha1=757107ea")
	_, err = v.Verify(h, []byte("Hello, World!"))
	require.ErrorIs(t, err, webhook.ErrSignature)
	h.Del("X-Hub-Signature-256")
	_, err = v.Verify(h, []byte("Hello, World!"))
	require.ErrorIs(t, err, webhook.ErrSignature)
}

// The Standard Webhooks specification's example: secret, message ID, timestamp and
// payload give this signature.
func TestStandardWebhooks_Example(t *testing.T) {
	t.Parallel()
	const ts = 1614265330
	v := webhook.StandardWebhooks{Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", Test: webhook.TestConfig{NowFunc: func() time.Time { return time.Unix(ts+60, 0) }}}
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", strconv.Itoa(ts))
	h.Set("webhook-signature", "v1,bm9ub3RhcmVhbHNpZ25hdHVyZQ== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	body := []byte(`{"test": 2432232314}`)
	got, err := v.Verify(h, body)
	require.NoError(t, err)
	require.Equal(t, "msg_p5jXN8AQM9LWM0D4loKWxJek", got.ID)

	_, err = v.Verify(h, []byte(`{"test": 2432232315}`))
	require.ErrorIs(t, err, webhook.ErrSignature)

	late := v
	late.Test.NowFunc = func() time.Time { return time.Unix(ts+3600, 0) }
	_, err = late.Verify(h, body)
	require.ErrorIs(t, err, webhook.ErrSignature, "a replay an hour later is refused")

	bad := v
	bad.Secret = "not base64!"
	_, err = bad.Verify(h, body)
	require.ErrorIs(t, err, webhook.ErrSignature)
}

func FuzzGitHubVerify(f *testing.F) {
	secret := []byte("fuzz-secret")
	f.Add([]byte("payload"), "sha256=00", "id")
	f.Add([]byte(""), "", "")
	f.Fuzz(func(t *testing.T, body []byte, sig, id string) {
		h := http.Header{}
		h.Set("X-Hub-Signature-256", sig)
		h.Set("X-GitHub-Delivery", id)
		_, err := webhook.GitHub(secret).Verify(h, body)
		mac := hmac.New(sha256.New, secret)
		mac.Write(body)
		valid := sig == "sha256="+hex.EncodeToString(mac.Sum(nil)) && id != ""
		if valid != (err == nil) {
			// hex is case-insensitive: an upper-case rendering of the right MAC is valid too.
			if err == nil {
				got, _ := hex.DecodeString(sig[len("sha256="):])
				if hmac.Equal(got, mac.Sum(nil)) && id != "" {
					return
				}
			}
			t.Fatalf("sig %q id %q: err %v, want valid=%v", sig, id, err, valid)
		}
	})
}

func FuzzStandardWebhooksVerify(f *testing.F) {
	key := []byte("0123456789abcdef")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	f.Add([]byte("{}"), "msg_1", "1700000000", "v1,AAAA")
	f.Fuzz(func(t *testing.T, body []byte, id, ts, sigs string) {
		h := http.Header{}
		h.Set("webhook-id", id)
		h.Set("webhook-timestamp", ts)
		h.Set("webhook-signature", sigs)
		v := webhook.StandardWebhooks{Secret: secret, Test: webhook.TestConfig{NowFunc: func() time.Time { return time.Unix(1700000000, 0) }}}
		_, err := v.Verify(h, body)
		if err == nil {
			// Accepted only with a signature that really matches.
			mac := hmac.New(sha256.New, key)
			mac.Write([]byte(id + "." + ts + "."))
			mac.Write(body)
			want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
			if !containsField(sigs, "v1,"+want) {
				t.Fatalf("accepted %q for %q", sigs, body)
			}
		}
	})
}

func containsField(s, f string) bool {
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f' {
			i++
		}
		if s[:i] == f {
			return true
		}
		if i == len(s) {
			return false
		}
		s = s[i+1:]
	}
	return false
}
