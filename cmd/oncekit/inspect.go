package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/oncekit/oncekit/keys"
	"github.com/oncekit/oncekit/ledger"
)

func (a *app) inspectCommand() *cobra.Command {
	var showBody bool
	var purpose string
	cmd := &cobra.Command{
		Use: "inspect TENANT OPERATION KEY",
		Example: `  oncekit inspect shop payments.charge 'v1:run:0196f3c2-7d4e-7a1b-9c55-2f0e8b6d1a44:5'
  oncekit inspect shop orders.create order-17 --show-body`,
		Short: "Show one record, its downstream key and its audit rows",
		Long: `inspect shows the record of KEY in TENANT's OPERATION: its state (marked when it expired,
and, for a pending record, its owner and the time its lease has left or ran out since),
what the key is made of, the workflow, run and activity type that wrote it, the downstream key an activity sent its provider (what to ask the
provider about), the stored result (the body's size and SHA-256; the body itself only with
--show-body), and the audit rows of every release and eviction of the key, kept even when
the record is gone.`,
		Args: args(3, "TENANT OPERATION KEY"),
		RunE: a.runE(func(_ *cobra.Command, args []string) error {
			if _, err := keys.Derive("k", purpose); err != nil {
				return usageError{fmt.Sprintf("--purpose: %v", err)}
			}
			return a.inspect(keys.Scope{Tenant: args[0], Operation: args[1]}, keys.Key(args[2]), showBody, purpose)
		}),
	}
	cmd.Flags().BoolVar(&showBody, "show-body", false, "print the stored body (it may hold customer data); without it, its size and SHA-256")
	cmd.Flags().StringVar(&purpose, "purpose", purposeDefault, "the purpose the activity derived its downstream key with (activity.Opts.Purpose)")
	return cmd
}

// inspectView is what inspect prints.
type inspectView struct {
	Record *recordView `json:"record"`
	Audit  []auditView `json:"audit"`
	Now    time.Time   `json:"now"`
}

// auditView is an audit row as the command shows it.
type auditView struct {
	ID     int64      `json:"id"`
	At     time.Time  `json:"at"`
	Action string     `json:"action"`
	Actor  string     `json:"actor"`
	DBUser string     `json:"db_user"`
	Reason string     `json:"reason"`
	Forced bool       `json:"forced"`
	Before recordView `json:"before"`
}

func auditOf(e ledger.AuditEntry) auditView {
	before := view(e.Before, false)
	before.BodyBytes, before.BodySHA256 = e.BodyBytes, e.BodySHA256
	before.Stuck, before.Expired, before.LeaseLive = false, false, false
	return auditView{ID: e.ID, At: e.At, Action: string(e.Action), Actor: e.Actor, DBUser: e.DBUser, Reason: e.Reason,
		Forced: e.Forced, Before: before}
}

func (a *app) inspect(scope keys.Scope, key keys.Key, showBody bool, purpose string) error {
	if err := validRecordID(scope, key); err != nil {
		return err
	}
	l, err := a.ledger()
	if err != nil {
		return err
	}
	iv := inspectView{Audit: []auditView{}, Now: a.dbNow()}
	entries, err := l.Audit(a.ctx, scope, key)
	if err != nil {
		return err
	}
	for _, e := range entries {
		iv.Audit = append(iv.Audit, auditOf(e))
	}
	r, err := l.Get(a.ctx, scope, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
	case err != nil:
		return err
	default:
		v := view(*r, showBody)
		if dk, err := keys.DeriveIn(scope, key, purpose); err == nil {
			v.DownstreamKey = string(dk)
		}
		iv.Record = &v
	}
	if iv.Record == nil && len(iv.Audit) == 0 {
		return notFound(scope, key)
	}
	if err := a.emit(iv, func(w *tabwriter.Writer) { printInspect(w, iv, purpose) }); err != nil {
		return err
	}
	if iv.Record == nil {
		return exitError{exitNotFound, fmt.Sprintf("no record of key %q in %s now; its audit rows are above", key, scope)}
	}
	return nil
}

func notFound(scope keys.Scope, key keys.Key) error {
	return exitError{exitNotFound, fmt.Sprintf("no record of key %q in %s, and no audit row (check the tenant and operation: oncekit list --tenant %s shows what there is)",
		key, scope, scope.Tenant)}
}

// validRecordID refuses a tenant, operation or key the ledger would refuse, before
// connecting, with what is wrong.
func validRecordID(scope keys.Scope, key keys.Key) error {
	if err := scope.Validate(); err != nil {
		return usageError{err.Error()}
	}
	if err := key.ValidateLen(ledger.MaxKeyLenLimit); err != nil {
		return usageError{err.Error()}
	}
	return nil
}

func printInspect(w *tabwriter.Writer, iv inspectView, purpose string) {
	if v := iv.Record; v != nil {
		fmt.Fprintf(w, "tenant\t%s\noperation\t%s\nkey\t%s\n", v.Tenant, v.Operation, v.Key)
		if v.KeyParts != "" {
			fmt.Fprintf(w, "key parts\t%s\n", v.KeyParts)
		}
		if v.WorkflowID != "" || v.RunID != "" {
			wf := fmt.Sprintf("%q, run %s", v.WorkflowID, orDash(v.RunID))
			if v.WorkflowType != "" {
				wf += fmt.Sprintf(", type %s", v.WorkflowType)
			}
			fmt.Fprintf(w, "workflow\t%s\n", wf)
		}
		if v.ActivityType != "" {
			fmt.Fprintf(w, "activity type\t%s\n", v.ActivityType)
		}
		fmt.Fprintf(w, "state\t%s\n", v.stateText(iv.Now))
		if v.State == string(ledger.StatePending) {
			fmt.Fprintf(w, "owner\t%s\n", v.OwnerToken)
			if v.LeaseUntil != nil {
				fmt.Fprintf(w, "lease until\t%s\n", rfc3339(*v.LeaseUntil))
			}
		}
		fmt.Fprintf(w, "fingerprint\t%s\n", v.Fingerprint)
		switch v.State {
		case string(ledger.StateFailed):
			fmt.Fprintf(w, "error\t%s: %s\n", v.ErrorCode, v.ErrorMessage)
		case string(ledger.StateCompleted):
			fmt.Fprintf(w, "status\t%d\n", v.StatusCode)
			switch {
			case v.Body != nil:
				fmt.Fprintf(w, "body\t%d bytes: %s\n", v.BodyBytes, *v.Body)
			case v.BodyBase64 != nil:
				fmt.Fprintf(w, "body\t%d bytes, base64: %s\n", v.BodyBytes, *v.BodyBase64)
			case v.BodyBytes > 0:
				fmt.Fprintf(w, "body\t%d bytes, sha256 %s (--show-body prints it)\n", v.BodyBytes, v.BodySHA256)
			default:
				fmt.Fprintf(w, "body\tnone\n")
			}
		}
		if v.ResourceRef != "" {
			fmt.Fprintf(w, "resource\t%s\n", v.ResourceRef)
		}
		fmt.Fprintf(w, "uncertain\t%v\nattempts\t%d\n", v.Uncertain, v.Attempts)
		fmt.Fprintf(w, "created\t%s (%s)\nupdated\t%s\n", rfc3339(v.CreatedAt), ago(v.CreatedAt, iv.Now), rfc3339(v.UpdatedAt))
		expires := rfc3339(v.ExpiresAt)
		if v.Expired {
			expires += " (expired " + ago(v.ExpiresAt, iv.Now) + ": the next request with the key runs again)"
		}
		fmt.Fprintf(w, "expires\t%s\n", expires)
		fmt.Fprintf(w, "downstream key\t%s (what an activity sent its provider, derived with purpose %q)\n", v.DownstreamKey, purpose)
	}
	if len(iv.Audit) == 0 {
		fmt.Fprintf(w, "audit\tnone: no operator changed this key\n")
	}
	for _, e := range iv.Audit {
		forced := ""
		if e.Forced {
			forced = " by force, its lease live"
		}
		fmt.Fprintf(w, "audit\t%s %s%s by %s (database role %s): %q; it was %s, owner %s, attempts %d, created %s\n",
			rfc3339(e.At), pastTense(e.Action), forced, e.Actor, e.DBUser, e.Reason, e.Before.State, orDash(e.Before.OwnerToken),
			e.Before.Attempts, rfc3339(e.Before.CreatedAt))
	}
}

func pastTense(action string) string {
	if action == string(ledger.ActionRelease) {
		return "released"
	}
	return "evicted"
}

func orDash(s string) string {
	if s == "" || s == "00000000-0000-0000-0000-000000000000" {
		return "-"
	}
	return s
}
