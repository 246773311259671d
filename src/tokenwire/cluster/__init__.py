"""Several ``tokenwire serve`` instances on one machine: a launcher and a small balancer
(README "Deployment: several instances"). Not part of the gateway: a demo and test tool
standing where a real load balancer (nginx, HAProxy, Envoy, a cloud one) stands in
production."""
