"""Upstream adapters: each turns one engine's output into IR events (``gateway.ir``)."""
