package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// HTTPPublisher POSTs each event's payload to url with the event ID as the
// Idempotency-Key (a Structured Field string) and the topic as X-Event-Topic. The
// Content-Type is application/json when the payload is JSON, else
// application/octet-stream.
//
// A 2xx is success; 408, 409, 425, 429 and 5xx are retried. Any other status is
// permanent: another 4xx says the request itself is wrong, and a 3xx reaches the
// publisher only when the client did not follow it (the standard client follows 307
// and 308 with the body), which a retry would not change. A topic that is not a valid
// header value is permanent before any request. A nil hc is a client without a timeout
// of its own: the dispatcher's PublishTimeout bounds each publication.
func HTTPPublisher(hc *http.Client, url string) Publisher {
	if hc == nil {
		hc = http.DefaultClient
	}
	return PublisherFunc(func(ctx context.Context, e Event) error {
		if !validHeaderValue(e.Topic) {
			return fmt.Errorf("%w: topic %q is not a valid X-Event-Topic header value", ErrPermanent, e.Topic)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(e.Payload))
		if err != nil {
			return fmt.Errorf("%w: %w", ErrPermanent, err)
		}
		if json.Valid(e.Payload) {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		req.Header.Set("Idempotency-Key", `"`+e.ID.String()+`"`)
		req.Header.Set("X-Event-Topic", e.Topic)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		switch s := resp.StatusCode; {
		case s/100 == 2:
			return nil
		case s == 408 || s == 409 || s == 425 || s == 429 || s >= 500:
			return fmt.Errorf("POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
		default:
			return fmt.Errorf("%w: POST %s: %s: %s", ErrPermanent, url, resp.Status, bytes.TrimSpace(body))
		}
	})
}

// validHeaderValue reports whether s can be sent as an HTTP header field value: no
// control characters other than horizontal tab (RFC 9110, section 5.5).
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
