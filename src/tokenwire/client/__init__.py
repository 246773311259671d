"""httpx-based Codec client pieces (fetching maps; the streaming client comes with `serve`)."""
