package inventory

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Sign is the service's one signature scheme, HMAC-SHA256(secret,
// timestamp + "." + body), sent hex-encoded in X-Signature beside
// X-Timestamp (unix seconds): the payment provider signs its callbacks
// with it, and the service signs each webhook delivery with the
// subscription's secret.
func Sign(secret, timestamp string, body []byte) []byte {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(timestamp))
	mac.Write([]byte("."))
	mac.Write(body)
	return mac.Sum(nil)
}
