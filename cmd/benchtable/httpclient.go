package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// rawClient is the load generator's HTTP/1.1 client: one keep-alive
// connection, requests written from bytes it builds itself, answers read by
// status line and Content-Length (or chunks), as wrk does. net/http's client spends two
// goroutines and their hand-offs per connection; on a 2-core machine where
// the load generator shares the cores with the service, that cost lands on
// every phase alike and blurs the ratios the table is about.
type rawClient struct {
	addr    string
	head    []byte // request line and headers up to Content-Length
	timeout time.Duration

	conn net.Conn
	r    *bufio.Reader
	buf  []byte

	// retryAfter says whether the last answer had a Retry-After header
	// (a campaign's sale_not_started has one; its sold-out 409 has none).
	retryAfter bool

	// revalidate sends the last answer's ETag back in If-None-Match, as a
	// browser revalidates a page it holds (etag: that ETag).
	revalidate bool
	etag       []byte
}

func newRawClient(rawURL string, h http.Header, timeout time.Duration) *rawClient {
	return newRawRequest(http.MethodPost, rawURL, h, timeout)
}

// newRawRequest is a rawClient sending method (a GET's body is empty).
func newRawRequest(method, rawURL string, h http.Header, timeout time.Duration) *rawClient {
	u, err := url.Parse(rawURL)
	must(err)
	var head bytes.Buffer
	fmt.Fprintf(&head, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, u.RequestURI(), u.Host)
	must(h.Write(&head))
	return &rawClient{addr: u.Host, head: head.Bytes(), timeout: timeout}
}

// post sends body and returns the answer's status; the body is read and
// dropped. A broken connection is closed, and the next call dials again.
func (c *rawClient) post(body string) (int, error) {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, c.timeout)
		if err != nil {
			return 0, err
		}
		c.conn, c.r = conn, bufio.NewReaderSize(conn, 4096)
	}
	status, err := c.roundTrip(body)
	if err != nil {
		c.Close()
	}
	return status, err
}

func (c *rawClient) roundTrip(body string) (int, error) {
	_ = c.conn.SetDeadline(time.Now().Add(c.timeout))
	c.buf = append(c.buf[:0], c.head...)
	if c.revalidate && len(c.etag) > 0 {
		c.buf = append(c.buf, "If-None-Match: "...)
		c.buf = append(c.buf, c.etag...)
		c.buf = append(c.buf, "\r\n"...)
	}
	c.buf = append(c.buf, "Content-Length: "...)
	c.buf = strconv.AppendInt(c.buf, int64(len(body)), 10)
	c.buf = append(c.buf, "\r\n\r\n"...)
	c.buf = append(c.buf, body...)
	if _, err := c.conn.Write(c.buf); err != nil {
		return 0, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 201 Created\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	length, chunked, closing := -1, false, false
	c.retryAfter = false
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, fmt.Errorf("bad header line %q", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, fmt.Errorf("bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			closing = true
		case bytes.EqualFold(name, []byte("Retry-After")):
			c.retryAfter = true
		case c.revalidate && bytes.EqualFold(name, []byte("ETag")):
			c.etag = append(c.etag[:0], value...)
		}
	}
	switch {
	case status == http.StatusNotModified || status == http.StatusNoContent:
		// no body, whatever the headers say
	case chunked:
		if err := c.discardChunks(); err != nil {
			return 0, err
		}
	case length >= 0:
		if _, err := c.r.Discard(length); err != nil {
			return 0, err
		}
	default:
		return 0, errors.New("answer without Content-Length or chunked body")
	}
	if closing {
		c.Close()
	}
	return status, nil
}

// discardChunks reads a chunked body to its end (trailers included).
func (c *rawClient) discardChunks() error {
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil {
			return fmt.Errorf("bad chunk size %q", line)
		}
		if n == 0 {
			for { // trailers, up to the blank line
				line, err := c.r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := c.r.Discard(int(n) + 2); err != nil { // the chunk and its CRLF
			return err
		}
	}
}

func (c *rawClient) Close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.r = nil, nil
	}
}
