"""Prometheus metrics, per-request records and the private request log."""
