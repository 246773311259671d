"""The gateway: upstreams produce :mod:`~tokenwire.gateway.ir` events, APIs render them."""
