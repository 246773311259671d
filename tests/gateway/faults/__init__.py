"""Fault injection: scripted upstreams, the gateway and its clients in one looptime loop."""
