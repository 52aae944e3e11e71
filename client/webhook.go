package client

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// DefaultWebhookTolerance is how far a delivery's X-Timestamp may be from
// the receiver's clock when VerifyWebhook is given no tolerance: as the
// service accepts payment callbacks.
const DefaultWebhookTolerance = 5 * time.Minute

// The reasons VerifyWebhook refuses a delivery; a receiver answers any of
// them with a 4xx and keeps nothing (errors.Is tells them apart).
var (
	// ErrWebhookHeaders: X-Timestamp, X-Signature or X-Event-Id is missing
	// or malformed.
	ErrWebhookHeaders = errors.New("webhook: missing or malformed X-Timestamp, X-Signature or X-Event-Id")
	// ErrWebhookSignature: X-Signature is not the HMAC of this timestamp
	// and body under the secret (a forged or altered delivery, or another
	// subscription's secret).
	ErrWebhookSignature = errors.New("webhook: the signature does not match")
	// ErrWebhookStale: X-Timestamp is further from now than the tolerance
	// (a replayed delivery, or a clock far off).
	ErrWebhookStale = errors.New("webhook: the timestamp is outside the tolerance")
	// ErrWebhookBody: the signed body is not a stock event, or its id is
	// not the one X-Event-Id names.
	ErrWebhookBody = errors.New("webhook: the body is not the stock event X-Event-Id names")
)

// VerifyWebhook checks one delivery of a webhook subscription and returns
// its stock event: X-Signature must be the hex HMAC-SHA256, under the
// subscription's secret, of X-Timestamp + "." + body (compared in constant
// time), X-Timestamp (unix seconds) within tolerance of now either way
// (DefaultWebhookTolerance when tolerance <= 0), and the body one stock
// event whose id is X-Event-Id. The signature is checked before the body
// is decoded. Deliveries are at least once: deduplicate by the event's id
// (Id, the X-Event-Id), and order a SKU's events by their Seq.
//
// A receiver reads the body whole (bounded), verifies it, and answers 2xx
// only once the event is stored:
//
//	http.HandleFunc("/hooks/inventory", func(w http.ResponseWriter, r *http.Request) {
//		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
//		if err != nil {
//			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
//			return
//		}
//		ev, err := client.VerifyWebhook(secret, r.Header, body, time.Now(), 0)
//		if err != nil {
//			http.Error(w, err.Error(), http.StatusUnauthorized)
//			return
//		}
//		if err := store.Once(ev.Id, ev); err != nil { // deduplicated by id
//			http.Error(w, "try again", http.StatusServiceUnavailable)
//			return
//		}
//		w.WriteHeader(http.StatusNoContent)
//	})
func VerifyWebhook(secret []byte, header http.Header, body []byte, now time.Time, tolerance time.Duration) (StockEvent, error) {
	if tolerance <= 0 {
		tolerance = DefaultWebhookTolerance
	}
	ts, sig, id := header.Get("X-Timestamp"), header.Get("X-Signature"), header.Get("X-Event-Id")
	if ts == "" || sig == "" || id == "" {
		return StockEvent{}, ErrWebhookHeaders
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return StockEvent{}, fmt.Errorf("%w: X-Timestamp %q is not unix seconds", ErrWebhookHeaders, ts)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return StockEvent{}, fmt.Errorf("%w: X-Signature is not a hex HMAC-SHA256", ErrWebhookHeaders)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return StockEvent{}, ErrWebhookSignature
	}
	if skew := now.Sub(time.Unix(unix, 0)); skew > tolerance || skew < -tolerance {
		return StockEvent{}, fmt.Errorf("%w: sent at %s, %s from now", ErrWebhookStale, time.Unix(unix, 0).UTC().Format(time.RFC3339), skew.Round(time.Second))
	}
	var ev StockEvent
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&ev); err != nil || dec.More() {
		return StockEvent{}, fmt.Errorf("%w: %v", ErrWebhookBody, err)
	}
	if strconv.FormatInt(ev.Id, 10) != id || ev.Type == "" {
		return StockEvent{}, fmt.Errorf("%w: the body's id is %d, X-Event-Id %q", ErrWebhookBody, ev.Id, id)
	}
	return ev, nil
}
