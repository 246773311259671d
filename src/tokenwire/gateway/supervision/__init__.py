"""Between upstreams and APIs, written once: the admission queue, retry budgets, deadlines
and heartbeats (the gateway seed's failure semantics)."""
