package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5/pgxpool"
)

// servers are the tools' providers, each keeping what it did in PostgreSQL.
type servers struct {
	pool   *pgxpool.Pool
	seed   uint64
	email  string // base URL of the email API
	refund string // base URL of the refund API
	smtp   string // host:port of the SMTP server
	close  []func()
}

func startServers(pool *pgxpool.Pool, seed uint64) (*servers, error) {
	s := &servers{pool: pool, seed: seed}
	var err error
	if s.email, err = s.serveHTTP(http.HandlerFunc(s.sendEmail)); err != nil {
		return nil, err
	}
	if s.refund, err = s.serveHTTP(http.HandlerFunc(s.refundCharge)); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) { return &smtpSession{s: s, c: c}, nil }))
	srv.Domain = "localhost"
	srv.ErrorLog = log.New(io.Discard, "", 0) // the connections the demo drops on purpose
	go func() { _ = srv.Serve(l) }()
	s.smtp = l.Addr().String()
	s.close = append(s.close, func() { _ = srv.Close() })
	return s, nil
}

func (s *servers) Close() {
	for _, c := range s.close {
		c()
	}
}

func (s *servers) serveHTTP(h http.Handler) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	s.close = append(s.close, func() { _ = srv.Close() })
	return "http://" + l.Addr().String(), nil
}

// loseAnswer reports whether the answer to this request is to be lost: once per
// ticket and kind, for the tickets the seed picks.
func (s *servers) loseAnswer(ctx context.Context, agentName string, ticket int, what string, p float64) bool {
	if chance(s.seed, agentName, ticket, "lose-"+what) >= p {
		return false
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO faults (agent, ticket, fault) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, agentName, ticket, "lost-"+what)
	return err == nil && tag.RowsAffected() == 1
}

// drop closes the connection without an answer, after the effect committed.
func drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// insertKeyed records an effect once per Idempotency-Key, or every time without one.
func (s *servers) insertKeyed(ctx context.Context, table, key string, agentName string, ticket int, detail string) (int64, error) {
	var id int64
	if key == "" {
		err := s.pool.QueryRow(ctx, `INSERT INTO `+table+` (agent, ticket, detail) VALUES ($1, $2, $3) RETURNING id`, agentName, ticket, detail).Scan(&id)
		return id, err
	}
	err := s.pool.QueryRow(ctx, `INSERT INTO `+table+` (agent, ticket, detail, idem_key) VALUES ($1, $2, $3, $4)
		ON CONFLICT (idem_key) DO UPDATE SET idem_key = excluded.idem_key RETURNING id`, agentName, ticket, detail, key).Scan(&id)
	return id, err
}

func (s *servers) effect(w http.ResponseWriter, r *http.Request, table, what string, lose float64) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	agentName := r.Header.Get("X-Agent")
	ticket, _ := strconv.Atoi(r.Header.Get("X-Ticket"))
	id, err := s.insertKeyed(r.Context(), table, r.Header.Get("Idempotency-Key"), agentName, ticket, string(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if s.loseAnswer(r.Context(), agentName, ticket, what, lose) {
		drop(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"id": fmt.Sprintf("%s_%d", what, id)})
}

func (s *servers) sendEmail(w http.ResponseWriter, r *http.Request) {
	s.effect(w, r, "emails", "email", 0.10)
}
func (s *servers) refundCharge(w http.ResponseWriter, r *http.Request) {
	s.effect(w, r, "refunds", "refund", 0.05)
}

// smtpSession receives one message and records it; the message's X-Agent and X-Ticket
// header lines say whose it is. It takes no idempotency key: SMTP has none.
type smtpSession struct {
	s *servers
	c *smtp.Conn
}

func (x *smtpSession) Reset()                               {}
func (x *smtpSession) Logout() error                        { return nil }
func (x *smtpSession) Mail(string, *smtp.MailOptions) error { return nil }
func (x *smtpSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (x *smtpSession) Data(r io.Reader) error {
	body, err := io.ReadAll(io.LimitReader(r, 1<<16))
	if err != nil {
		return err
	}
	var agentName string
	var ticket int
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "X-Agent: "); ok {
			agentName = v
		}
		if v, ok := strings.CutPrefix(line, "X-Ticket: "); ok {
			ticket, _ = strconv.Atoi(v)
		}
	}
	ctx := context.Background()
	if _, err := x.s.insertKeyed(ctx, "smtp_messages", "", agentName, ticket, string(body)); err != nil {
		return err
	}
	if x.s.loseAnswer(ctx, agentName, ticket, "smtp", 0.05) {
		_ = x.c.Close() // the message is queued; the client never hears so
	}
	return nil
}
