package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/oncekit/oncekit/ledger"
)

// Records as the command shows them: the view of a ledger record that inspect, list,
// release and evict print, and the database clock they are reckoned by.

// purposeDefault is the purpose activity.External derives its downstream key with
// (activity.PurposeDefault; the command does not import package activity, which would
// bring Temporal's SDK into it).
const purposeDefault = "downstream"

// maxListLimit bounds --limit.
const maxListLimit = 1000

func (a *app) ledger() (*ledger.Ledger, error) {
	if err := a.connect(); err != nil {
		return nil, err
	}
	return ledger.New(a.pool, &ledger.Config{Schema: a.schema})
}

// dbNow is the database's clock, by which leases and expiry are reckoned.
func (a *app) dbNow() time.Time {
	var now time.Time
	if err := a.pool.QueryRow(a.ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Now()
	}
	return now
}

// recordView is a record as the command shows it.
type recordView struct {
	Tenant        string     `json:"tenant"`
	Operation     string     `json:"operation"`
	Key           string     `json:"key"`
	KeyParts      string     `json:"key_parts,omitempty"`
	State         string     `json:"state"`
	Stuck         bool       `json:"stuck"`
	Expired       bool       `json:"expired"`
	Fingerprint   string     `json:"fingerprint"`
	StatusCode    int        `json:"status_code"`
	BodyBytes     int        `json:"body_bytes"`
	BodySHA256    string     `json:"body_sha256,omitempty"`
	Body          *string    `json:"body,omitempty"`
	BodyBase64    *string    `json:"body_base64,omitempty"`
	ResourceRef   string     `json:"resource_ref,omitempty"`
	ErrorCode     string     `json:"error_code,omitempty"`
	ErrorMessage  string     `json:"error_message,omitempty"`
	OwnerToken    string     `json:"owner_token,omitempty"`
	LeaseUntil    *time.Time `json:"lease_until,omitempty"`
	LeaseLive     bool       `json:"lease_live"`
	Uncertain     bool       `json:"uncertain"`
	Attempts      int        `json:"attempts"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	ExpiresAt     time.Time  `json:"expires_at"`
	DownstreamKey string     `json:"downstream_key,omitempty"`
	// The record's origin: the Temporal workflow, run and activity that wrote it.
	WorkflowID   string `json:"workflow_id,omitempty"`
	RunID        string `json:"run_id,omitempty"`
	WorkflowType string `json:"workflow_type,omitempty"`
	ActivityType string `json:"activity_type,omitempty"`
}

// view shows r; its body only when showBody is set, its size and digest always.
func view(r ledger.Record, showBody bool) recordView {
	v := recordView{Tenant: r.Scope.Tenant, Operation: r.Scope.Operation, Key: string(r.Key), KeyParts: describeKey(r.Key),
		State: string(r.State), Stuck: r.State == ledger.StatePending && r.LeaseExpired, Expired: r.Expired,
		Fingerprint: string(r.Fingerprint), StatusCode: r.Response.Code, BodyBytes: len(r.Response.Body),
		ResourceRef: r.Response.ResourceRef, ErrorCode: r.ErrorCode, ErrorMessage: r.ErrorMessage, Uncertain: r.Uncertain,
		Attempts: r.Attempts, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt,
		WorkflowID: r.Origin.WorkflowID, RunID: r.Origin.RunID, WorkflowType: r.Origin.WorkflowType, ActivityType: r.Origin.ActivityType}
	if len(r.Response.Body) > 0 {
		sum := sha256.Sum256(r.Response.Body)
		v.BodySHA256 = hex.EncodeToString(sum[:])
	}
	if showBody && r.Response.Body != nil {
		if utf8.Valid(r.Response.Body) {
			s := string(r.Response.Body)
			v.Body = &s
		} else {
			s := base64.StdEncoding.EncodeToString(r.Response.Body)
			v.BodyBase64 = &s
		}
	}
	if r.State == ledger.StatePending {
		v.OwnerToken = r.OwnerToken.String()
		if !r.LeaseUntil.IsZero() {
			lu := r.LeaseUntil
			v.LeaseUntil = &lu
		}
		v.LeaseLive = !r.LeaseExpired
	}
	return v
}

// stateText is the state with what it means now: expired, stuck, lease left.
func (v recordView) stateText(now time.Time) string {
	s := v.State
	switch {
	case v.Stuck && v.LeaseUntil != nil:
		s += fmt.Sprintf(" (stuck: its lease ran out %s)", ago(*v.LeaseUntil, now))
	case v.LeaseLive && v.LeaseUntil != nil:
		s += fmt.Sprintf(" (lease live, %s left)", v.LeaseUntil.Sub(now).Round(time.Second))
	}
	if v.Expired {
		s += " (expired: counts as absent)"
	}
	return s
}
