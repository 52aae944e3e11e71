package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"
)

// DeliveryWindow is how far a delivery's X-Timestamp may be from the
// receiver's clock for VerifyDelivery (as the service's own payment
// callback allows).
const DeliveryWindow = 5 * time.Minute

// ErrBadDelivery: a webhook delivery's signature or timestamp does not
// verify; answer it 401 and do not act on it.
var ErrBadDelivery = errors.New("webhook delivery does not verify")

// VerifyDelivery checks a webhook delivery the service sent a receiver:
// X-Signature must be hex HMAC-SHA256(secret, X-Timestamp + "." + body)
// and X-Timestamp (unix seconds) within DeliveryWindow of now. It reads
// r's body (up to 1 MiB) and returns it, with the event's feed id
// (X-Event-Id), which the receiver deduplicates by: delivery is at least
// once. Any failure wraps ErrBadDelivery.
func VerifyDelivery(r *http.Request, secret string, now time.Time) (body []byte, eventID int64, err error) {
	body, err = io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, 0, errors.Join(ErrBadDelivery, err)
	}
	ts := r.Header.Get("X-Timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, 0, errors.Join(ErrBadDelivery, errors.New("X-Timestamp is not unix seconds"))
	}
	if d := now.Sub(time.Unix(sec, 0)); d > DeliveryWindow || d < -DeliveryWindow {
		return nil, 0, errors.Join(ErrBadDelivery, errors.New("X-Timestamp is outside the window"))
	}
	got, err := hex.DecodeString(r.Header.Get("X-Signature"))
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	if err != nil || !hmac.Equal(got, mac.Sum(nil)) {
		return nil, 0, errors.Join(ErrBadDelivery, errors.New("X-Signature does not match"))
	}
	if eventID, err = strconv.ParseInt(r.Header.Get("X-Event-Id"), 10, 64); err != nil {
		return nil, 0, errors.Join(ErrBadDelivery, errors.New("X-Event-Id is not an event id"))
	}
	return body, eventID, nil
}
