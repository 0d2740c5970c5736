package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/inbox"
	"github.com/oncekit/oncekit/ledger"
	"github.com/oncekit/oncekit/outbox"
)

// The console: oncekit ui serves pages to search and look at records, outbox events and
// the inbox, and to release, evict, retry and purge, after a dry run, with a reason and
// an audit row, as the commands do.

//go:embed ui
var uiFiles embed.FS

// Roles of the console's users.
const (
	roleViewer   = "viewer"   // looks: no action, no stored body
	roleOperator = "operator" // looks, reveals stored bodies, and acts
)

// uiFlags are the flags of oncekit ui.
type uiFlags struct {
	listen, authFile        string
	temporalUI, temporalNS  string
	insecureLocal, readOnly bool
	shutdownTimeout         time.Duration
	countCache              time.Duration
	countCacheRows          float64           // tests: the table size from which counts are reused (countCacheRowsDefault)
	ready                   func(addr string) // tests: called with the address once listening
	stop                    <-chan struct{}   // tests: closing it stops the server
}

func (a *app) uiCommand() *cobra.Command {
	var f uiFlags
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve a web console: search records, look at one, release, evict, retry and purge with a reason",
		Long: `ui serves a web console on --listen (127.0.0.1:8080 by default) over the same database,
schema and shards as the other commands: search records (by tenant, operation, state, key
or key prefix, workflow ID, run ID, activity type, activity ID, time), a record's page
(state, lease, owner, attempts, the workflow, run and activity type that wrote it,
downstream key, audit rows; the stored body hidden until an operator reveals it), counts
(reused for --count-cache on a large ledger, shown as "about"), panels of stuck claims, uncertain outcomes, dead outbox events, the outbox's backlog
by topic and the inbox, and the actions release, evict, outbox retry and purge, each
shown as a dry run first and made only with a reason, keeping the same audit rows as the
commands, naming the console's user.

Authentication is on: ONCEKIT_UI_TOKEN is an operator's token and ONCEKIT_UI_VIEWER_TOKEN
a viewer's (sent as "Authorization: Bearer TOKEN", or as the password of basic auth with
the user name operator or viewer), and --auth-file lists users, one a line:
ROLE NAME SECRET, where ROLE is viewer or operator (basic auth NAME:SECRET, or Bearer
SECRET). A viewer looks but neither acts nor reveals a stored body. Without any user, ui
refuses to start, unless --insecure-local and --listen is a loopback address: then every
request is an operator's, named "local". --read-only refuses every action to everyone.`,
		Example: `  oncekit ui
  oncekit ui --auth-file /etc/oncekit/ui-users --temporal-ui http://localhost:8233
  oncekit ui --insecure-local --read-only --listen 127.0.0.1:9090`,
		Args: args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.ui(&f); err != nil {
				return ranError{err}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "the address to serve on; a non-loopback one exposes the console to the network")
	fl.StringVar(&f.authFile, "auth-file", "", "a file of users, one a line: ROLE NAME SECRET (ROLE viewer or operator); # starts a comment")
	fl.BoolVar(&f.insecureLocal, "insecure-local", false, "serve without authentication, every request an operator's: only on a loopback --listen")
	fl.BoolVar(&f.readOnly, "read-only", false, "refuse every action (release, evict, retry, purge) to everyone")
	fl.StringVar(&f.temporalUI, "temporal-ui", "", "the address of Temporal's Web UI, such as http://localhost:8233, to link a record to its workflow")
	fl.StringVar(&f.temporalNS, "temporal-namespace", "default", "the Temporal namespace of the workflows, for the links to Temporal's Web UI")
	fl.DurationVar(&f.countCache, "count-cache", countCacheDefault, "on a ledger of more than 100000 records, how long the overview's counts are reused, shown as \"about\"; 0 counts on every load")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGINT or SIGTERM, how long requests in flight have to finish")
	return cmd
}

// uiUser is one who may use the console.
type uiUser struct {
	Name, Role string
	secret     [32]byte // SHA-256 of the secret: compared in constant time
}

// uiShard is one database the console reads: the only one, or a named shard.
type uiShard struct {
	name   string
	pool   *pgxpool.Pool
	ledger *ledger.Ledger
	outbox *outbox.Outbox
	inbox  *inbox.Inbox
	counts countCache
}

// console serves the pages.
type console struct {
	a              *app
	shards         []*uiShard
	users          []uiUser
	open           bool // --insecure-local: no authentication
	readOnly       bool
	temporalUI, ns string
	countFor       time.Duration
	countFromRows  float64
	pages          map[string]*template.Template
	log            *log.Logger
}

func (a *app) ui(f *uiFlags) error {
	host, _, err := net.SplitHostPort(f.listen)
	if err != nil {
		return usageError{fmt.Sprintf("--listen %q: give HOST:PORT, such as 127.0.0.1:8080", bounded(f.listen))}
	}
	users, err := uiUsers(f.authFile, a.getenv)
	if err != nil {
		return err
	}
	if f.countCache < 0 {
		return usageError{"--count-cache must not be negative"}
	}
	c := &console{a: a, users: users, readOnly: f.readOnly, temporalUI: strings.TrimSuffix(f.temporalUI, "/"), ns: f.temporalNS,
		countFor: f.countCache, countFromRows: cmp.Or(f.countCacheRows, countCacheRowsDefault),
		log: log.New(a.errOut, "oncekit ui: ", log.LstdFlags|log.LUTC)}
	switch {
	case len(users) > 0 && f.insecureLocal:
		return usageError{"--insecure-local serves without authentication: drop it, or the users (ONCEKIT_UI_TOKEN, ONCEKIT_UI_VIEWER_TOKEN, --auth-file)"}
	case len(users) == 0 && !f.insecureLocal:
		return usageError{"the console needs authentication: set ONCEKIT_UI_TOKEN (an operator's token) or give --auth-file; --insecure-local serves without it on a loopback address"}
	case f.insecureLocal && !isLoopback(host):
		return usageError{fmt.Sprintf("--insecure-local serves only on a loopback address such as 127.0.0.1, not %q", bounded(host))}
	}
	c.open = f.insecureLocal
	if f.temporalUI != "" && !strings.HasPrefix(f.temporalUI, "http://") && !strings.HasPrefix(f.temporalUI, "https://") {
		return usageError{"--temporal-ui: give an http:// or https:// address, such as http://localhost:8233"}
	}
	if c.pages, err = parsePages(); err != nil {
		return err
	}
	if err := c.connect(); err != nil {
		return err
	}
	defer func() {
		for _, s := range c.shards {
			s.pool.Close()
		}
	}()
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: c.handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute, ErrorLog: c.log}
	mode := "operators act"
	if c.readOnly {
		mode = "read-only"
	}
	auth := fmt.Sprintf("%d users", len(users))
	if c.open {
		auth = "no authentication (--insecure-local)"
	}
	fmt.Fprintf(a.errOut, "oncekit ui: serving http://%s (%s, %s, schema %s)\n", ln.Addr(), auth, mode, a.schema)
	if f.ready != nil {
		f.ready(ln.Addr().String())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	select {
	case err := <-done:
		return err
	case <-sig:
	case <-f.stop:
	case <-a.ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); errors.Is(err, context.DeadlineExceeded) {
		// Requests still running, or connections a browser opened ahead and never used,
		// are cut.
		return srv.Close()
	} else if err != nil {
		return err
	}
	return nil
}

// isLoopback says whether host names the loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostOnly is the host of a Host header, without its port.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

// uiUsers reads the users: the tokens of the environment, and the auth file's lines.
func uiUsers(file string, getenv func(string) string) ([]uiUser, error) {
	var users []uiUser
	add := func(role, name, secret, where string) error {
		if len(secret) < 16 {
			return usageError{fmt.Sprintf("%s: a secret of at least 16 characters, please (openssl rand -hex 32 makes one)", where)}
		}
		for _, u := range users {
			if u.Name == name {
				return usageError{fmt.Sprintf("%s: user %q is given twice", where, bounded(name))}
			}
		}
		users = append(users, uiUser{Name: name, Role: role, secret: sha256.Sum256([]byte(secret))})
		return nil
	}
	if t := getenv("ONCEKIT_UI_TOKEN"); t != "" {
		if err := add(roleOperator, roleOperator, t, "ONCEKIT_UI_TOKEN"); err != nil {
			return nil, err
		}
	}
	if t := getenv("ONCEKIT_UI_VIEWER_TOKEN"); t != "" {
		if err := add(roleViewer, roleViewer, t, "ONCEKIT_UI_VIEWER_TOKEN"); err != nil {
			return nil, err
		}
	}
	if file == "" {
		return users, nil
	}
	fh, err := os.Open(file)
	if err != nil {
		return nil, usageError{fmt.Sprintf("--auth-file: %v", err)}
	}
	defer func() { _ = fh.Close() }()
	sc := bufio.NewScanner(fh)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		where := fmt.Sprintf("--auth-file line %d", n)
		if len(fields) != 3 || (fields[0] != roleViewer && fields[0] != roleOperator) || strings.Contains(fields[1], ":") {
			// The line is not echoed: it may hold a secret.
			return nil, usageError{where + ": give ROLE NAME SECRET, ROLE viewer or operator, NAME without a colon"}
		}
		if err := add(fields[0], fields[1], fields[2], where); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, usageError{fmt.Sprintf("--auth-file: %v", err)}
	}
	return users, nil
}

// connect opens the database, or each shard, and checks its schema as the other
// commands do.
func (c *console) connect() error {
	a := c.a
	shards, err := a.shards()
	if err != nil {
		return err
	}
	if len(shards) == 0 {
		shards = []shardURL{{name: "", url: a.databaseURL}}
	}
	for _, s := range shards {
		a.databaseURL = s.url
		a.pool = nil
		err := a.connect()
		if err != nil {
			if a.pool != nil {
				a.pool.Close()
				a.pool = nil
			}
			if s.name != "" {
				return shardError{s.name, err}
			}
			return err
		}
		us := &uiShard{name: s.name, pool: a.pool}
		a.pool = nil // the console closes it
		c.shards = append(c.shards, us)
		if us.ledger, err = ledger.New(us.pool, &ledger.Config{Schema: a.schema}); err != nil {
			return err
		}
		if us.outbox, err = outbox.New(us.pool, &outbox.Config{Schema: a.schema}); err != nil {
			return err
		}
		if us.inbox, err = inbox.New(us.pool, &inbox.Config{Schema: a.schema}); err != nil {
			return err
		}
	}
	return nil
}

// handler is the console's routes, behind authentication and the security headers.
func (c *console) handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(uiFiles, "ui/static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", c.page(c.home))
	mux.HandleFunc("GET /records", c.page(c.records))
	mux.HandleFunc("GET /record", c.page(c.record))
	mux.HandleFunc("POST /record/reveal", c.action(false, c.reveal))
	mux.HandleFunc("GET /change", c.page(c.changePreview))
	mux.HandleFunc("POST /change", c.action(true, c.changeDo))
	mux.HandleFunc("GET /outbox/retry", c.page(c.retryPreview))
	mux.HandleFunc("POST /outbox/retry", c.action(true, c.retryDo))
	mux.HandleFunc("GET /purge", c.page(c.purgePreview))
	mux.HandleFunc("POST /purge", c.action(true, c.purgeDo))
	return c.secure(mux)
}

// Context keys of a request.
type ctxKey int

const (
	userKey ctxKey = iota
	csrfKey
)

const csrfCookie = "oncekit_csrf"

// contentSecurityPolicy allows the console's own files only: no inline script or style,
// no frame, no form posted elsewhere.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; object-src 'none'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// statusWriter remembers the status code, for the request log.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// secure sets the security headers, authenticates, gives each browser its CSRF token and
// logs the request: its method, path, status and user, never its query, form or body.
func (c *console) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		start := time.Now()
		if c.open && !isLoopback(hostOnly(r.Host)) {
			// Without authentication, a page of another site whose name resolves to
			// 127.0.0.1 (DNS rebinding) would read the console: only loopback names pass.
			c.log.Printf("%s %s 403: host %q is not a loopback address", r.Method, r.URL.Path, clip(r.Host, 100))
			http.Error(sw, "403 forbidden: without authentication the console answers only to a loopback address, such as 127.0.0.1", http.StatusForbidden)
			return
		}
		u, ok := c.authenticate(r)
		name := "-"
		if ok {
			name = u.Name
		}
		defer func() {
			c.log.Printf("%s %s %d user=%s %s", r.Method, r.URL.Path, sw.code, name, time.Since(start).Round(time.Millisecond))
		}()
		if !ok {
			h.Set("WWW-Authenticate", `Basic realm="oncekit", charset="UTF-8"`)
			http.Error(sw, "401 unauthorized: give the console's token (Authorization: Bearer TOKEN) or a user's name and secret", http.StatusUnauthorized)
			return
		}
		token := ""
		if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 64 {
			token = ck.Value
		} else {
			var b [32]byte
			_, _ = rand.Read(b[:])
			token = hex.EncodeToString(b[:])
			http.SetCookie(sw, &http.Cookie{Name: csrfCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		}
		ctx := context.WithValue(context.WithValue(r.Context(), userKey, u), csrfKey, token)
		next.ServeHTTP(sw, r.WithContext(ctx))
	})
}

// authenticate finds the request's user: by bearer token, or by basic auth's name and
// secret; each secret is compared in constant time.
func (c *console) authenticate(r *http.Request) (uiUser, bool) {
	if c.open {
		return uiUser{Name: "local", Role: roleOperator}, true
	}
	name, secret, basic := r.BasicAuth()
	if !basic {
		t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return uiUser{}, false
		}
		secret = t
	}
	sum := sha256.Sum256([]byte(secret))
	var found uiUser
	ok := 0
	for _, u := range c.users {
		match := subtle.ConstantTimeCompare(sum[:], u.secret[:])
		if basic && u.Name != name {
			match = 0
		}
		if match == 1 && ok == 0 {
			found, ok = u, 1
		}
	}
	return found, ok == 1
}

// pageData is what every page's template gets.
type pageData struct {
	Title      string
	User       uiUser
	CSRF       string
	ReadOnly   bool
	CanAct     bool // an operator, not read-only
	CanReveal  bool // an operator
	Shards     []string
	Shard      string
	TemporalUI bool
	Error      string
	Notice     string
	P          any // the page's own
}

// handlerFunc serves a page: it returns the template to render with its data, or an error.
type handlerFunc func(r *http.Request, s *uiShard, d *pageData) (string, error)

// httpError is an error with its HTTP status.
type httpError struct {
	code int
	msg  string
}

func (e httpError) Error() string { return e.msg }

func (c *console) data(r *http.Request) (*pageData, *uiShard, error) {
	u, _ := r.Context().Value(userKey).(uiUser)
	d := &pageData{User: u, CSRF: r.Context().Value(csrfKey).(string), ReadOnly: c.readOnly,
		CanAct: u.Role == roleOperator && !c.readOnly, CanReveal: u.Role == roleOperator, TemporalUI: c.temporalUI != ""}
	s := c.shards[0]
	name := r.FormValue("shard")
	for _, sh := range c.shards {
		if sh.name != "" {
			d.Shards = append(d.Shards, sh.name)
		}
		if name != "" && sh.name == name {
			s = sh
		}
	}
	if name != "" && s.name != name {
		return d, s, httpError{http.StatusNotFound, fmt.Sprintf("no shard %q", bounded(name))}
	}
	d.Shard = s.name
	return d, s, nil
}

func (c *console) page(fn handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d, s, err := c.data(r)
		name := ""
		if err == nil {
			name, err = fn(r, s, d)
		}
		c.render(w, name, d, err)
	}
}

// action serves a POST: it needs the CSRF token, an operator, and, when changes is
// set, a console that is not read-only.
func (c *console) action(changes bool, fn handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			c.render(w, "", &pageData{}, httpError{http.StatusBadRequest, "the form does not parse"})
			return
		}
		d, s, err := c.data(r)
		switch {
		case err != nil:
		case !validCSRF(r):
			err = httpError{http.StatusForbidden, "403 forbidden: the form's CSRF token is missing or wrong; reload the page and try again"}
		case d.User.Role != roleOperator:
			err = httpError{http.StatusForbidden, "403 forbidden: only an operator may do this; a viewer looks"}
		case changes && c.readOnly:
			err = httpError{http.StatusForbidden, "403 forbidden: the console is read-only (--read-only)"}
		}
		name := ""
		if err == nil {
			name, err = fn(r, s, d)
		}
		c.render(w, name, d, err)
	}
}

// validCSRF compares the form's token with the cookie's, in constant time.
func validCSRF(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	form := r.PostForm.Get("csrf")
	if err != nil || len(ck.Value) != 64 || len(form) != 64 {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(ck.Value), []byte(form)) == 1
}

// render renders the page, or the error page.
func (c *console) render(w http.ResponseWriter, name string, d *pageData, err error) {
	code := http.StatusOK
	if err != nil {
		var he httpError
		var ue usageError
		var ee exitError
		switch {
		case errors.As(err, &he):
			code, d.Error = he.code, he.msg
		case errors.As(err, &ue):
			code, d.Error = http.StatusBadRequest, ue.msg
		case errors.As(err, &ee) && ee.code == exitNotFound:
			code, d.Error = http.StatusNotFound, ee.msg
		case errors.As(err, &ee):
			code, d.Error = http.StatusConflict, ee.msg
		default:
			code, d.Error = http.StatusInternalServerError, "the database failed: "+oneLine(err.Error())
		}
		name = "error"
		if d.Title == "" {
			d.Title = http.StatusText(code)
		}
	}
	if err == nil && d.Error != "" {
		code = http.StatusBadRequest // the page again, with what to mend
	}
	t := c.pages[name]
	if t == nil {
		http.Error(w, "no such page", http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", d); err != nil {
		c.log.Printf("rendering %s: %v", name, err)
		http.Error(w, "the page failed to render", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// parsePages parses each page with the layout.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	entries, err := fs.Glob(uiFiles, "ui/*.html")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		name := strings.TrimSuffix(strings.TrimPrefix(e, "ui/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New(name).Funcs(uiFuncs).ParseFS(uiFiles, "ui/layout.html", e)
		if err != nil {
			return nil, err
		}
		pages[name] = t
	}
	return pages, nil
}

// uiFuncs are the templates' functions.
var uiFuncs = template.FuncMap{
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return rfc3339(t)
	},
	"ago":    ago,
	"plural": plural,
	"clip":   func(s string) string { return clip(oneLine(s), 120) },
}
