"""API renderers: each turns IR events into one wire format, sans-IO (STYLE §6 item 10)."""
