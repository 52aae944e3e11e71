package httpapi

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/acme/inventory"
	"github.com/acme/inventory/internal/tokens"
)

// Metrics are the HTTP layer's Prometheus metrics.
type Metrics struct {
	requests    *prometheus.HistogramVec
	deductions  *prometheus.CounterVec
	soldOutFlag prometheus.Counter
	notStarted  prometheus.Counter // deductions{result="not_started"}, resolved once: the answer before an opening is the cheapest path

	// observers caches requests' histogram per label set (routeStatus), so
	// a request costs one map read instead of hashing its label values.
	observers sync.Map
}

type routeStatus struct {
	method, route string
	status        int
}

func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inventory_http_request_duration_seconds", Help: "HTTP requests by route and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"method", "route", "status"}),
		deductions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inventory_deductions_total", Help: "Deductions and reservations through the API by result code.",
		}, []string{"result"}),
		soldOutFlag: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inventory_seckill_soldout_flag_hits_total", Help: "Seckill requests answered by the local sold-out flag, without Redis.",
		}),
	}
	reg.MustRegister(m.requests, m.deductions, m.soldOutFlag)
	m.notStarted = m.deductions.WithLabelValues("not_started")
	return m
}

// observe records each request with the status it is answered with.
func (m *Metrics) observe(answer func(error) int) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			status := c.Response().Status
			if err != nil {
				status = answer(err)
			}
			route := c.Path()
			if route == "" {
				route = "unmatched"
			}
			m.observer(c.Request().Method, route, status).Observe(time.Since(start).Seconds())
			return err
		}
	}
}

func (m *Metrics) observer(method, route string, status int) prometheus.Observer {
	key := routeStatus{method, route, status}
	if o, ok := m.observers.Load(key); ok {
		return o.(prometheus.Observer)
	}
	o, _ := m.observers.LoadOrStore(key, m.requests.WithLabelValues(method, route, strconv.Itoa(status)))
	return o.(prometheus.Observer)
}

// deduction counts one deduction or reservation by its result code.
func (m *Metrics) deduction(err error, n int64) {
	result := "ok"
	switch {
	case err == nil && n == inventory.Unlimited:
		result = "unlimited"
	case err == nil:
	case errors.Is(err, inventory.ErrInsufficientStock):
		result = "insufficient"
	case errors.Is(err, inventory.ErrInvalidArgument):
		result = "invalid"
	case errors.Is(err, inventory.ErrUnknownSKU):
		result = "unknown_sku"
	case errors.Is(err, inventory.ErrConflict):
		result = "conflict"
	case errors.Is(err, tokens.ErrReleased):
		result = "released"
	case errors.Is(err, inventory.ErrUnavailable):
		result = "unavailable"
	case errors.Is(err, inventory.ErrNotStarted):
		result = "not_started"
	case errors.Is(err, inventory.ErrEnded):
		result = "ended"
	default:
		result = "error"
	}
	m.deductions.WithLabelValues(result).Inc()
}
