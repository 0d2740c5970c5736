package idempotency

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strconv"
)

// bodyStart is the room a recorder makes for a body whose length the handler does not
// declare: a small JSON answer fits without growing.
const bodyStart = 512

// recorder buffers a guarded handler's response until the ledger's transaction ends. It
// keeps it in the form the ledger stores, so the stored body is the buffer itself and is
// never copied: a 4-byte big-endian length, the allow-listed headers as a JSON object
// (written when the status is), then the body bytes unchanged. It refuses bytes past
// limit as they are written, so a handler that writes too much learns it at its Write,
// and the buffer never passes the limit.
//
// It implements http.ResponseWriter only: http.ResponseController's Flush, Hijack,
// SetReadDeadline, SetWriteDeadline and EnableFullDuplex return http.ErrNotSupported,
// as nothing may reach the client before the commit.
type recorder struct {
	header   http.Header // what the handler sets
	sent     http.Header // the header as it was when the status was written
	status   int
	wrote    bool
	buf      []byte // the stored form
	bodyAt   int    // where the body begins in buf
	limit    int
	replay   []string // the headers stored, canonical
	tooLarge bool     // a Write was refused: nothing is sent or stored
}

func newRecorder(limit int, replay []string) *recorder {
	return &recorder{header: http.Header{}, status: http.StatusOK, limit: limit, replay: replay}
}

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader records the final status and the headers as they are now, as a
// connection's ResponseWriter would send them; later changes to the header are ignored.
// 1xx informational responses (103 Early Hints) are not final and are dropped, as
// nothing reaches the client before the commit.
func (r *recorder) WriteHeader(status int) {
	if (status >= 100 && status < 200) || r.wrote {
		return
	}
	r.status, r.wrote = status, true
	r.sent = r.header.Clone()
	h := map[string][]string{}
	for _, name := range r.replay {
		if v := r.sent.Values(name); len(v) > 0 {
			h[name] = v
		}
	}
	hj, _ := json.Marshal(h)
	r.bodyAt = 4 + len(hj)
	if r.bodyAt > r.limit {
		r.tooLarge = true
		return
	}
	room := min(bodyStart, r.limit-r.bodyAt)
	if n, err := strconv.Atoi(r.sent.Get("Content-Length")); err == nil && n >= 0 {
		room = min(n, r.limit-r.bodyAt) // the handler says how long the body is: one buffer of that size
	}
	r.buf = make([]byte, 4, r.bodyAt+room)
	binary.BigEndian.PutUint32(r.buf, uint32(len(hj)))
	r.buf = append(r.buf, hj...)
}

// Write appends b to the body, or refuses it whole with [ErrResponseTooLarge] when the
// stored response would pass the limit; the buffer is then dropped.
func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.tooLarge {
		return 0, ErrResponseTooLarge
	}
	need := len(r.buf) + len(b)
	if need > r.limit {
		r.tooLarge, r.buf = true, nil
		return 0, ErrResponseTooLarge
	}
	if need > cap(r.buf) {
		r.grow(need)
	}
	r.buf = append(r.buf, b...)
	return len(b), nil
}

// grow makes room for need bytes, need being at most the limit. The buffer doubles, but
// stops at half the limit before its last step, to the limit itself: while it grows at
// most 1.5 times the limit is held, and under twice the limit is allocated in all.
func (r *recorder) grow(need int) {
	c := max(2*cap(r.buf), need)
	if half := r.limit / 2; need <= half {
		c = min(c, half)
	} else {
		c = r.limit
	}
	buf := make([]byte, len(r.buf), c)
	copy(buf, r.buf)
	r.buf = buf
}

// finish ends the response: a handler that wrote nothing answered 200 with an empty
// body, as it would on a connection.
func (r *recorder) finish() { r.WriteHeader(http.StatusOK) }

// writeTo sends the recorded response, with every header the handler set.
func (r *recorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.sent {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.buf[r.bodyAt:])
}

// decodeStored splits a stored response into its headers and its body.
func decodeStored(stored []byte) (map[string][]string, []byte, bool) {
	if len(stored) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(stored)
	var h map[string][]string
	if int64(n) > int64(len(stored)-4) || json.Unmarshal(stored[4:4+n], &h) != nil {
		return nil, nil, false
	}
	return h, stored[4+n:], true
}
