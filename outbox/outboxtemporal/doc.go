// Package outboxtemporal publishes outbox events to Temporal: each event starts a
// workflow (or signals one) whose ID comes from the event ID, so Temporal itself refuses
// a second publication of the same event.
//
// It lives apart from package outbox so that a service that publishes over HTTP does
// not import the Temporal SDK.
package outboxtemporal
