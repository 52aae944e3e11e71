// Package app wires the service together: configuration, dependencies, the
// HTTP server, background jobs, and their shutdown order.
package app

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// App is one running inventoryd.
type App struct {
	cfg  Config
	log  *slog.Logger
	http *echo.Echo
	ln   net.Listener
	done chan error
}

func New(cfg Config, log *slog.Logger) (*App, error) {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.Recover())
	e.GET("/healthz", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	})
	return &App{cfg: cfg, log: log, http: e, done: make(chan error, 1)}, nil
}

// Start listens on the configured address (port 0 picks a free one) and
// serves in the background.
func (a *App) Start() error {
	ln, err := net.Listen("tcp", a.cfg.HTTPAddr)
	if err != nil {
		return err
	}
	a.ln = ln
	a.http.Listener = ln
	a.log.Info("listening", "addr", ln.Addr().String())
	go func() {
		err := a.http.Start("")
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.done <- err
	}()
	return nil
}

// Addr is the address the server listens on, once started.
func (a *App) Addr() string { return a.ln.Addr().String() }

// Done reports the server stopping on its own.
func (a *App) Done() <-chan error { return a.done }

// Shutdown stops the service in the documented order: stop accepting HTTP and
// finish in-flight requests, then stop consumers and jobs, drain, and close
// producers, Redis and the database.
func (a *App) Shutdown(ctx context.Context) error {
	start := time.Now()
	err := a.http.Shutdown(ctx)
	a.log.Info("stopped", "took", time.Since(start).String())
	return err
}
