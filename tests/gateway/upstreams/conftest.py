"""The shared ``python -m llama_cpp.server`` peer (see :mod:`.llama_cpp_peer`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.upstreams import llama_cpp_peer as peer


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """``(url, model)`` of one llama_cpp.server at :data:`~.llama_cpp_peer.SHARED_N_CTX`,
    started when a test first asks for it and shared by every module that can use that
    configuration (a suite that needs another one starts its own with
    :func:`~.llama_cpp_peer.llama_server`). Sharing is safe because every comparison
    empties the server's prompt cache first (``_evict`` in ``test_llama_cpp_server.py``)
    and nothing here counts its access log."""
    peer.require_peer()
    with peer.llama_server(tmp_path_factory.mktemp("llama_server"),
                           n_ctx=peer.SHARED_N_CTX) as server:
        yield server.url, server.model
