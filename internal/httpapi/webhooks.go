package httpapi

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/acme/inventory/internal/webhooks"
)

// webhookRoutes registers the webhook subscriptions (admin).
func (s *Server) webhookRoutes(v1 *echo.Group, admin echo.MiddlewareFunc) {
	v1.GET("/webhooks", s.listWebhooks, admin)
	v1.PUT("/webhooks/:id", s.putWebhook, admin)
	v1.GET("/webhooks/:id", s.getWebhook, admin)
	v1.DELETE("/webhooks/:id", s.deleteWebhook, admin)
	v1.POST("/webhooks/:id/resume", s.resumeWebhook, admin)
}

// resumeWebhook: POST /v1/webhooks/{id}/resume tries the subscription
// now, whatever its backoff, and marks it active; its backlog is kept.
func (s *Server) resumeWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	v, err := s.webhooks.Resume(c.Request().Context(), id)
	if err != nil {
		return err
	}
	s.onPut()
	return c.JSON(http.StatusOK, v)
}

// putWebhook: PUT /v1/webhooks/{id} {"url","secret","events","skus"}.
func (s *Server) putWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	var req struct {
		URL    *string   `json:"url"`
		Secret *string   `json:"secret"`
		Events *[]string `json:"events"`
		SKUs   *[]string `json:"skus"`
	}
	if err := bind(c, &req); err != nil {
		return err
	}
	if err := required(map[string]bool{"url": req.URL != nil, "secret": req.Secret != nil, "events": req.Events != nil}); err != nil {
		return err
	}
	spec := webhooks.Spec{URL: *req.URL, Secret: *req.Secret, Events: *req.Events}
	if req.SKUs != nil {
		spec.SKUs = *req.SKUs
	}
	v, err := s.webhooks.Put(c.Request().Context(), id, spec)
	if err != nil {
		return err
	}
	s.onPut()
	return c.JSON(http.StatusOK, v)
}

func (s *Server) getWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	v, err := s.webhooks.Get(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

func (s *Server) listWebhooks(c echo.Context) error {
	vs, err := s.webhooks.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page[webhooks.View]{Items: vs})
}

func (s *Server) deleteWebhook(c echo.Context) error {
	id, err := pathParam(c, "id")
	if err != nil {
		return err
	}
	v, err := s.webhooks.Delete(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}
