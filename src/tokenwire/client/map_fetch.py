"""Load a tokenizer map from a URL, verified against its pinned sha256 (codec-spec 3.2, 6.4).

The URL is untrusted and the hash is the trust anchor, so the hash is required unless the
caller explicitly opts out; the body is read with a size cap and within ``deadline``
seconds in all (:mod:`tokenwire.client.deadline`) because a peer controls both.
Sync and async twins share everything but the one request.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from tokenwire.client.bounded_read import BodyOverBudget, aread_bounded, read_bounded
from tokenwire.client.deadline import DEFAULT_DEADLINE_S, Deadline
from tokenwire.codec.maps import MapCache, TokenizerMap, load_map_bytes, parse_hash
from tokenwire.errors import DecompressionError, MapError

__all__ = ["MAX_MAP_BYTES", "MapFetchError", "afetch_map", "fetch_map"]

# The largest published map (cl100k) is 3.8 MB; 64 MiB leaves room for 256k-token vocabularies
# while stopping a hostile server from streaming us gigabytes.
MAX_MAP_BYTES = 64 * 1024 * 1024

_shared_cache = MapCache()


class MapFetchError(MapError):
    """The map could not be fetched (HTTP status, scheme, size, transport)."""


def _check_url(url: str, allow_http: bool) -> None:
    scheme = urlsplit(url).scheme.lower()
    if scheme == "https" or (allow_http and scheme == "http"):
        return
    allowed = "https or http" if allow_http else "https (pass allow_http=True for http)"
    raise MapFetchError(f"map URL {url!r} must be {allowed}")


def _check_status(url: str, status: int) -> None:
    if status != 200:
        raise MapFetchError(f"GET {url} answered {status}")


def _pinned(expected_hash: str | None, unverified: bool) -> str | None:
    if expected_hash is None and not unverified:
        raise MapFetchError("a map fetched by URL needs expected_hash (or unverified=True)")
    return parse_hash(expected_hash) if expected_hash is not None else None


def fetch_map(
    url: str,
    *,
    expected_hash: str | None,
    client: httpx.Client | None = None,
    cache: MapCache | None = _shared_cache,
    allow_http: bool = False,
    unverified: bool = False,
    deadline: float | None = DEFAULT_DEADLINE_S,
) -> TokenizerMap:
    pinned = _pinned(expected_hash, unverified)
    _check_url(url, allow_http)
    if pinned is not None and cache is not None and (hit := cache.get(pinned)) is not None:
        return hit
    own = client is None
    http = client or httpx.Client(timeout=30.0)
    whole = Deadline(deadline)
    try:
        with http.stream("GET", url, timeout=whole.timeout(http.timeout)) as resp:
            _check_status(url, resp.status_code)
            body = read_bounded(resp, MAX_MAP_BYTES, whole)
    except BodyOverBudget:
        raise MapFetchError(f"map at {url} is over {MAX_MAP_BYTES} bytes") from None
    except DecompressionError as exc:
        raise MapFetchError(f"map at {url} does not decode: {exc}") from None
    except httpx.HTTPError as exc:
        whole.check()
        raise MapFetchError(f"GET {url} failed: {exc}") from exc
    finally:
        if own:
            http.close()
    tmap = load_map_bytes(body, expected_hash=pinned, source=url)
    return cache.put(tmap) if cache is not None else tmap


async def afetch_map(
    url: str,
    *,
    expected_hash: str | None,
    client: httpx.AsyncClient | None = None,
    cache: MapCache | None = _shared_cache,
    allow_http: bool = False,
    unverified: bool = False,
    deadline: float | None = DEFAULT_DEADLINE_S,
) -> TokenizerMap:
    pinned = _pinned(expected_hash, unverified)
    _check_url(url, allow_http)
    if pinned is not None and cache is not None and (hit := cache.get(pinned)) is not None:
        return hit
    own = client is None
    http = client or httpx.AsyncClient(timeout=30.0)
    whole = Deadline(deadline)
    try:
        with whole.cancelling():
            async with http.stream("GET", url, timeout=whole.timeout(http.timeout)) as resp:
                _check_status(url, resp.status_code)
                body = await aread_bounded(resp, MAX_MAP_BYTES, whole)
    except BodyOverBudget:
        raise MapFetchError(f"map at {url} is over {MAX_MAP_BYTES} bytes") from None
    except DecompressionError as exc:
        raise MapFetchError(f"map at {url} does not decode: {exc}") from None
    except httpx.HTTPError as exc:
        whole.check()
        raise MapFetchError(f"GET {url} failed: {exc}") from exc
    finally:
        if own:
            await http.aclose()
    tmap = load_map_bytes(body, expected_hash=pinned, source=url)
    return cache.put(tmap) if cache is not None else tmap
