"""Which upstream serves a request: served models, and each upstream's health."""
