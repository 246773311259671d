"""httpx-based Codec client: the streaming client (sync and async twins over a sans-IO core),
discovery under ``/.well-known/codec/``, and fetching maps by URL with a pinned hash."""

from tokenwire.client.codec_client import AsyncCodecClient, CodecClient

__all__ = ["AsyncCodecClient", "CodecClient"]
