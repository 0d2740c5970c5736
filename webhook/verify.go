package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrSignature is matched by every verification failure.
var ErrSignature = errors.New("oncekit/webhook: signature verification failed")

// SignatureError says why a delivery failed verification. It matches [ErrSignature].
type SignatureError struct{ Reason string }

func (e *SignatureError) Error() string {
	return "oncekit/webhook: signature verification failed: " + e.Reason
}

// Is matches [ErrSignature].
func (e *SignatureError) Is(target error) bool { return target == ErrSignature }

func sigErr(format string, args ...any) error {
	return &SignatureError{Reason: fmt.Sprintf(format, args...)}
}

// Verified is what a verifier learned from an authentic delivery.
type Verified struct {
	// ID is the sender's delivery ID, the same on every redelivery.
	ID string
	// Event is the event type, when the sender names it in a header.
	Event string
}

// Verifier authenticates a delivery from its headers and raw body. Implementations
// compare signatures in constant time and return a [*SignatureError] on failure.
type Verifier interface {
	Verify(h http.Header, body []byte) (Verified, error)
}

// GitHub returns the verifier of GitHub webhooks: X-Hub-Signature-256 is "sha256=" and
// the hex HMAC-SHA256 of the body under secret; X-GitHub-Delivery is the delivery ID and
// X-GitHub-Event the event.
//
// GitHub's signature covers the body only, not X-GitHub-Delivery nor any time: a
// captured delivery re-sent under a new delivery ID verifies, and is processed again.
// A handler that must not repeat its effect keys it by the event's business identity
// (an issue's or payment's ID) or orders events with [Delivery.Newer]. Standard
// Webhooks signs the ID and a timestamp, which closes that gap.
func GitHub(secret []byte) Verifier { return githubVerifier{secret: secret} }

type githubVerifier struct{ secret []byte }

func (g githubVerifier) check() error {
	if len(g.secret) == 0 {
		return errors.New("oncekit/webhook: the GitHub verifier has no secret: pass the webhook's secret")
	}
	return nil
}

func (g githubVerifier) Verify(h http.Header, body []byte) (Verified, error) {
	if len(g.secret) == 0 {
		return Verified{}, sigErr("no secret configured")
	}
	sig := h.Get("X-Hub-Signature-256")
	hexSig, ok := strings.CutPrefix(sig, "sha256=")
	if !ok {
		return Verified{}, sigErr("X-Hub-Signature-256 missing or not sha256=")
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || len(got) != sha256.Size {
		return Verified{}, sigErr("X-Hub-Signature-256 is not a hex SHA-256")
	}
	mac := hmac.New(sha256.New, g.secret)
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return Verified{}, sigErr("X-Hub-Signature-256 does not match the body")
	}
	id := h.Get("X-GitHub-Delivery")
	if id == "" {
		return Verified{}, sigErr("X-GitHub-Delivery missing")
	}
	return Verified{ID: id, Event: h.Get("X-GitHub-Event")}, nil
}

// ToleranceDefault is how far a Standard Webhooks timestamp may be from now.
const ToleranceDefault = 5 * time.Minute

// StandardWebhooks verifies the Standard Webhooks scheme: webhook-signature lists
// space-separated "v1,<base64 HMAC-SHA256>" signatures of "id.timestamp.body" under the
// base64 secret (the part after "whsec_"); webhook-id is the delivery ID; the
// webhook-timestamp must be within Tolerance of now, which bounds replays of a captured
// request.
type StandardWebhooks struct {
	// Secret is the signing secret, "whsec_" and base64.
	Secret string
	// Tolerance bounds the timestamp's distance from now. Defaults to [ToleranceDefault].
	Tolerance time.Duration
	// Test holds knobs for tests only, such as checking a provider's recorded test
	// vectors; production code leaves it zero.
	Test TestConfig
}

// TestConfig holds the knobs that exist for tests.
type TestConfig struct {
	// NowFunc returns the current time. Defaults to time.Now.
	NowFunc func() time.Time
}

func (s StandardWebhooks) key() ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s.Secret, "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, errors.New("oncekit/webhook: the Standard Webhooks secret is not \"whsec_\" followed by base64: copy it whole from the sender's settings")
	}
	return key, nil
}

// check refuses a secret that can verify nothing, when the receiver is made rather
// than as a 401 on every delivery.
func (s StandardWebhooks) check() error {
	_, err := s.key()
	return err
}

// Verify implements [Verifier].
func (s StandardWebhooks) Verify(h http.Header, body []byte) (Verified, error) {
	key, err := s.key()
	if err != nil {
		return Verified{}, sigErr("the secret is not whsec_ and base64")
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return Verified{}, sigErr("webhook-id, webhook-timestamp or webhook-signature missing")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return Verified{}, sigErr("webhook-timestamp is not Unix seconds")
	}
	tol, now := s.Tolerance, time.Now
	if tol == 0 {
		tol = ToleranceDefault
	}
	if s.Test.NowFunc != nil {
		now = s.Test.NowFunc
	}
	if d := now().Sub(time.Unix(sec, 0)); d > tol || d < -tol {
		return Verified{}, sigErr("webhook-timestamp is %s from now, beyond the tolerance of %s", d.Round(time.Second), tol)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(sigs) {
		ver, b64, ok := strings.Cut(sig, ",")
		if !ok || ver != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return Verified{ID: id, Event: h.Get("webhook-type")}, nil
		}
	}
	return Verified{}, sigErr("no v1 signature in webhook-signature matches the body")
}
