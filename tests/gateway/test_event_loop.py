"""The event loop ``tokenwire serve`` runs on: ``--loop`` / ``[server] event_loop`` (uvloop by
default where installed, asyncio's own on request). The hardening suites run on both
(``test_connection_limits.py``, ``test_http2_hardening.py``: their servers are parametrized by
``raw_sockets.EVENT_LOOPS``); here, only the choice itself."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from tokenwire.errors import ConfigError
from tokenwire.gateway.server import loop_name, serving_loop_factory
from tokenwire.gateway.settings import ServerSettings

from .test_hardening import _settings

uvloop = pytest.importorskip("uvloop")


@pytest.mark.parametrize(("argv", "server", "want"), [
    ([], None, "auto"),
    (["--loop", "asyncio"], None, "asyncio"),
    ([], {"event_loop": "asyncio"}, "asyncio"),
    (["--loop", "uvloop"], {"event_loop": "asyncio"}, "uvloop"),  # the flag wins
])
def test_the_event_loop_from_the_flag_and_the_file(argv, server, want) -> None:
    assert _settings(argv, {}, server).event_loop == want


def test_an_unknown_event_loop_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"auto, uvloop, asyncio.*'trio'"):
        _settings(["--loop", "trio"], {})


def test_uvloop_asked_for_but_not_installed_is_a_config_error(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvloop" else real(name, *a))
    with pytest.raises(ConfigError, match="needs the uvloop package"):
        ServerSettings(event_loop="uvloop")
    assert ServerSettings(event_loop="auto").event_loop == "auto"  # auto falls back instead


def test_auto_and_uvloop_serve_on_uvloop_asyncio_on_asyncio_s_own() -> None:
    assert serving_loop_factory("auto") is uvloop.new_event_loop
    assert serving_loop_factory("uvloop") is uvloop.new_event_loop
    assert serving_loop_factory("asyncio") is None  # asyncio.Runner's default loop
    assert loop_name(serving_loop_factory("auto")) == f"uvloop {uvloop.__version__}"
    assert loop_name(None) == "asyncio"
    with asyncio.Runner(loop_factory=serving_loop_factory("asyncio")) as runner:
        assert not isinstance(runner.get_loop(), uvloop.Loop)


def test_auto_falls_back_to_asyncio_where_uvloop_does_not_import(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert serving_loop_factory("auto") is None
    with pytest.raises(ImportError):
        serving_loop_factory("uvloop")
