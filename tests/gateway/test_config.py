"""Configuration errors are clear, found at start-up, and never show a secret (issue 4 item 3).

The table holds bad files and flags, each with its exact message. Start-up checks that
need the upstream (reachable, serving the configured model) run ``build_gateway`` with
fake adapter classes in place of the registry.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import ClassVar

import pytest

from tokenwire.cli import serve as serve_cmd
from tokenwire.errors import ConfigError
from tokenwire.gateway.config import (
    ENV_CONFIG,
    ENV_UPSTREAM,
    load_config_file,
    parse_config,
    resolve,
)
from tokenwire.gateway.ir import IdsSource
from tokenwire.gateway.server import build_gateway
from tokenwire.gateway.settings import ServerSettings
from tokenwire.gateway.upstreams import ADAPTERS, openai_compat, sse_http
from tokenwire.gateway.upstreams.base import UpstreamConfig, UpstreamHealth, UpstreamState

FIXTURE_MAP = Path(__file__).parent.parent / "fixtures" / "maps" / "openai" / "r50k_base.json"
SECRET = "sk-live-DO-NOT-PRINT-0123456789"
ENV = {"VLLM_KEY": SECRET}

GOOD = """
[server]
port = 9000
[[upstreams]]
name = "vllm"
kind = "openai"
base_url = "http://10.0.0.5:8000/v1/"
api_key_env = "VLLM_KEY"
max_concurrent = 8
connect_timeout_s = 5
read_timeout_s = 120
[[upstreams.models]]
name = "smol"
upstream_model = "HuggingFaceTB/SmolLM2-135M-Instruct"
map = "huggingfacetb/smollm2"
"""

_UP = '[[upstreams]]\nname = "u"\nkind = "openai"\nbase_url = "http://h:1/v1"\n'
_EMB = '[[upstreams]]\nname = "e"\nkind = "embedded"\n'

BAD_FILES = [
    ("top-level typo", "[sever]\nport = 1\n" + _UP,
     "{f}: unknown key 'sever'; expected one of server, upstreams, fallbacks, "
     "context_fallbacks, keys, state"),
    ("server typo", "[server]\nprot = 1\n" + _UP,
     "{f}: [server]: unknown key 'prot'; expected one of host, port, coalesce_ms, queue_size, "
     "max_body_bytes, legacy_finish_reason, public_url, compress_event_streams, "
     "default_model, probe, "
     "health_interval_s, api_keys_env, allowed_origins, max_concurrent, idle_timeout_s, "
     "request_cap_s, heartbeat_s, retries, drain_grace_s, head_timeout_s, body_timeout_s, "
     "max_connections, max_connections_per_client, http2, tls_cert, tls_key, "
     "responses_websocket, ws_max_sockets, ws_max_sockets_per_client, ws_idle_timeout_s, "
     "ws_session_cap_s, event_loop"),
    ("server type", "[server]\nport = \"80\"\n" + _UP,
     "{f}: [server]: port must be an integer, got '80'"),
    ("bool is not int", "[server]\nport = true\n" + _UP,
     "{f}: [server]: port must be an integer, got True"),
    ("no upstreams", "[server]\nport = 1\n", "{f}: no [[upstreams]]; declare at least one"),
    ("upstream typo", _UP + "base-url = \"x\"\n",
     "{f}: [[upstreams]] #1: unknown key 'base-url'; expected one of name, kind, base_url, "
     "api_key_env, max_concurrent, connect_timeout_s, read_timeout_s, probe, headers, "
     "options, models, context_length, replicas, breaker, probe_interval_s, "
     "affinity_prefix_chars, panic_threshold, affinity_load_factor, affinity_load_slack"),
    ("no name", "[[upstreams]]\nkind = \"openai\"\n", "{f}: [[upstreams]] #1: name is required"),
    ("unknown kind", "[[upstreams]]\nname = \"u\"\nkind = \"grpc\"\n",
     "{f}: upstream 'u': unknown kind 'grpc'; expected one of embedded, openai, codec, "
     "responses, anthropic"),
    ("bad url", "[[upstreams]]\nname = \"u\"\nkind = \"openai\"\nbase_url = \"localhost:8000\"\n",
     "{f}: upstream 'u': base_url 'localhost:8000' is not an http:// or https:// URL with "
     "a host"),
    ("missing url", "[[upstreams]]\nname = \"u\"\nkind = \"openai\"\n",
     "{f}: upstream 'u': base_url '' is not an http:// or https:// URL with a host"),
    ("embedded url", "[[upstreams]]\nname = \"e\"\nkind = \"embedded\"\nbase_url = \"http://h\"\n",
     "{f}: upstream 'e': an embedded upstream has no base_url"),
    ("missing key env", _UP + "api_key_env = \"NOPE_KEY\"\n",
     "{f}: upstream 'u': api_key_env names NOPE_KEY, which is not set"),
    ("zero concurrency", _UP + "max_concurrent = 0\n",
     "{f}: upstream 'u': max_concurrent must be at least 1"),
    # A value of the wrong type is reported by its type; max_concurrent's was compared
    # with 1 too, and the start ended in a TypeError's traceback.
    ("concurrency string", _UP + "max_concurrent = \"8\"\n",
     "{f}: [[upstreams]] #1: max_concurrent must be an integer, got '8'"),
    # A window an upstream reports past 2**24 is not believed (context_window.py); the
    # file's went to every client as max_model_len (10**30 in /v1/models and /tokenize,
    # past what Codex's 64-bit integers or JavaScript's doubles hold).
    ("huge context", _UP + "context_length = 1000000000000000000000000000000\n",
     "{f}: upstream 'u': context_length must be a number of tokens from 1 to 16777215, got "
     "1000000000000000000000000000000"),
    ("huge model context", _UP + "[[upstreams.models]]\nname = \"m\"\n"
     "context_length = 16777216\n",
     "{f}: upstream 'u' model #1 ('m'): context_length must be a number of tokens from 1 "
     "to 16777215, got 16777216"),
    ("negative timeout", _UP + "read_timeout_s = -1\n",
     "{f}: upstream 'u': read_timeout_s must be a positive number of seconds up to 86400, "
     "got -1"),
    # NaN passed '<= 0' (every comparison is False) and was handed to asyncio.timeout and
    # httpx (uvloop raises on it; asyncio's never fires); infinity waited for ever.
    ("NaN timeout", _UP + "read_timeout_s = nan\n",
     "{f}: upstream 'u': read_timeout_s must be a positive number of seconds up to 86400, "
     "got nan"),
    ("infinite timeout", _UP + "connect_timeout_s = inf\n",
     "{f}: upstream 'u': connect_timeout_s must be a positive number of seconds up to "
     "86400, got inf"),
    ("NaN health interval", "[server]\nhealth_interval_s = nan\n" + _UP,
     "{f}: [server]: health_interval_s must be a number of seconds from 0 up to 86400, "
     "got nan"),
    ("negative health interval", "[server]\nhealth_interval_s = -1\n" + _UP,
     "{f}: [server]: health_interval_s must be a number of seconds from 0 up to 86400, "
     "got -1"),
    ("header value", _UP + "[upstreams.headers]\nx-a = 1\n",
     "{f}: upstream 'u': header values must be strings"),
    ("duplicate upstream", _UP + _UP, "{f}: two upstreams are named 'u'"),
    ("duplicate model", _UP + "[[upstreams.models]]\nname = \"m\"\n"
     + _UP.replace('"u"', '"v"') + "[[upstreams.models]]\nname = \"m\"\n",
     "{f}: model 'm' is declared by upstreams 'u' and 'v'; model names must be unique"),
    ("model typo", _UP + "[[upstreams.models]]\nname = \"m\"\nmap_id = \"x\"\n",
     "{f}: upstream 'u' model #1: unknown key 'map_id'; expected one of name, "
     "upstream_model, map, map_path, context_length, chat_template"),
    ("chat template missing", _UP + "[[upstreams.models]]\nname = \"m\"\n"
     "chat_template = \"/nonexistent/t.jinja\"\n",
     "{f}: upstream 'u' model #1 ('m'): chat_template '/nonexistent/t.jinja' is not a file"),
    ("model without name", _UP + "[[upstreams.models]]\nmap = \"x\"\n",
     "{f}: upstream 'u' model #1: name is required"),
    ("unknown map id", _UP + "[[upstreams.models]]\nname = \"m\"\nmap = \"acme/nope\"\n",
     "{f}: upstream 'u' model #1 ('m'): unknown map id 'acme/nope' (no bundled map "
     "'acme/nope')"),
    ("map and map_path", _UP + "[[upstreams.models]]\nname = \"m\"\nmap = \"a/b\"\n"
     "map_path = \"x.json\"\n",
     "{f}: upstream 'u' model #1 ('m'): give map or map_path, not both"),
    ("unreadable map file", _UP + "[[upstreams.models]]\nname = \"m\"\n"
     "map_path = \"/nonexistent/m.json\"\n",
     "{f}: upstream 'u' model #1 ('m'): cannot read map file '/nonexistent/m.json': "
     "No such file or directory"),
    ("default not configured", "[server]\ndefault_model = \"z\"\n" + _UP
     + "[[upstreams.models]]\nname = \"m\"\n",
     "{f}: [server] default_model 'z' is not a configured model; configured: m"),
    # [upstreams.options] are the kind's adapter's, checked when the file is read (not when
    # the adapter is built, after its HTTP client).
    ("responses option type", _UP.replace('"openai"', '"responses"')
     + "[upstreams.options]\nwebsocket = \"yes\"\n",
     "{f}: upstream 'u': options.websocket must be true or false"),
    ("responses option typo", _UP.replace('"openai"', '"responses"')
     + "[upstreams.options]\nweb_socket = true\n",
     "{f}: upstream 'u': unknown responses option 'web_socket' in [upstreams.options]; "
     "known: ['websocket']"),
    ("openai option value", _UP + "[upstreams.options]\nids = \"vlm\"\n",
     "{f}: upstream 'u': options.ids must be one of ('auto', 'vllm', 'llama.cpp', 'none'), "
     "not 'vlm'"),
    ("openai empty field", _UP + "[upstreams.options]\nmax_tokens_field = \"\"\n",
     "{f}: upstream 'u': options.max_tokens_field must be a non-empty string"),
    ("openai option typo", _UP + "[upstreams.options]\nid = \"vllm\"\n",
     "{f}: upstream 'u': unknown openai option 'id' in [upstreams.options]; known: "
     "['api', 'developer_role', 'empty_stream', 'ids', 'json_schema', 'max_tokens_field', "
     "'truncation']"),
    ("openai option type", _UP + "[upstreams.options]\ndeveloper_role = \"yes\"\n",
     "{f}: upstream 'u': options.developer_role must be true or false"),
    ("openai field type", _UP + "[upstreams.options]\nmax_tokens_field = 1\n",
     "{f}: upstream 'u': options.max_tokens_field must be a non-empty string"),
    ("openai word type", _UP + "[upstreams.options]\napi = true\n",
     "{f}: upstream 'u': options.api must be one of ('auto', 'chat', 'completions'), "
     "not True"),
    ("codec option value", _UP.replace('"openai"', '"codec"')
     + "[upstreams.options]\nstream_format = \"json\"\n",
     "{f}: upstream 'u': stream_format must be 'msgpack' or 'protobuf', got 'json'"),
    ("anthropic option", _UP.replace('"openai"', '"anthropic"')
     + "[upstreams.options]\nanthropic_version = \"2023-06-01\"\n",
     "{f}: upstream 'u': unknown anthropic option 'anthropic_version' in "
     "[upstreams.options]; anthropic upstreams take none"),
    ("embedded option typo", _EMB + "[upstreams.options]\nnctx = 4096\n",
     "{f}: upstream 'e': unknown embedded option 'nctx' in [upstreams.options]; known: "
     "['model_path', 'n_ctx', 'queue_size', 'threads']"),
    ("embedded option type", _EMB + "[upstreams.options]\nn_ctx = \"4k\"\n",
     "{f}: upstream 'e': options.n_ctx must be an integer from 1 to 1048576, not '4k'"),
    ("embedded unbounded queue", _EMB + "[upstreams.options]\nqueue_size = 0\n",
     "{f}: upstream 'e': options.queue_size must be an integer from 1 to 1024, not 0"),
    ("embedded threads", _EMB + "[upstreams.options]\nthreads = 513\n",
     "{f}: upstream 'e': options.threads must be an integer from 1 to 512, not 513"),
    ("embedded model file", _EMB + "[upstreams.options]\nmodel_path = \"/nonexistent.gguf\"\n",
     "{f}: upstream 'e': options.model_path must name a GGUF file; '/nonexistent.gguf' is "
     "not a file"),
    ("not toml", "[[upstreams]\n", "{f}: not valid TOML: Expected ']]' at the end of an array "
     "declaration (at line 1, column 12)"),
]


@pytest.mark.parametrize(("case", "text", "message"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_config_files_fail_at_startup_with_their_message(tmp_path, case, text,
                                                             message) -> None:
    f = tmp_path / "tokenwire.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config_file(f, env=ENV)
    assert str(info.value) == message.format(f=f)


@pytest.mark.parametrize(("kind", "module", "options"), [
    ("responses", sse_http, {"websocket": "yes"}),
    ("openai", openai_compat, {"json_schema": "strict"}),
    ("openai", openai_compat, {"max_token_field": "max_completion_tokens"}),
])
def test_bad_options_fail_before_the_adapter_builds_its_http_client(
        monkeypatch, kind, module, options) -> None:
    """An adapter built from a config that did not go through the file (tests, the flags)
    still checks its options first: a client built before the check would be left open."""
    clients: list[object] = []
    monkeypatch.setattr(module, "http_client", lambda *a, **kw: clients.append(a) or a)
    cfg = UpstreamConfig(name="u", kind=kind, base_url="http://h:1/v1", options=options)
    with pytest.raises(ConfigError, match=r"upstream 'u': (options\.|unknown \w+ option)"):
        ADAPTERS[kind].from_config(cfg)
    assert clients == []


@pytest.mark.parametrize(("kind", "options", "message"), [
    ("anthropic", {"beta": "x"}, "unknown anthropic option 'beta'"),
    ("embedded", {"n_ctx": -1}, "options.n_ctx must be an integer from 1 to"),
])
def test_bad_options_fail_before_the_adapter_loads_or_connects(monkeypatch, kind, options,
                                                               message) -> None:
    """Built without the file (the flags, tests): the options are still checked first, before
    an HTTP client exists or the model is loaded."""
    from tokenwire.gateway.upstreams import embedded

    built: list[object] = []
    monkeypatch.setattr(sse_http, "http_client", lambda *a, **kw: built.append(a) or a)
    monkeypatch.setattr(embedded.EmbeddedEngine, "load", lambda *a, **kw: built.append(a))
    cfg = UpstreamConfig(name="u", kind=kind, base_url="http://h:1", options=options)
    with pytest.raises(ConfigError, match=f"upstream 'u': {message}"):
        ADAPTERS[kind].from_config(cfg)
    assert built == []


def test_missing_config_file_names_the_path(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_file(tmp_path / "nope.toml")
    assert str(info.value) == f"cannot read config file {tmp_path / 'nope.toml'}: " \
                              "No such file or directory"


def test_good_file_gives_upstream_configs_and_loaded_maps(tmp_path) -> None:
    f = tmp_path / "t.toml"
    f.write_text(GOOD)
    cfg = load_config_file(f, env=ENV)
    (up,) = cfg.upstreams
    assert (up.name, up.kind, up.base_url, up.api_key_env) == (
        "vllm", "openai", "http://10.0.0.5:8000/v1", "VLLM_KEY")
    assert (up.max_concurrent, up.connect_timeout_s, up.read_timeout_s) == (8, 5.0, 120.0)
    assert up.models[0].sent_as == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg.maps["smol"].id == "huggingfacetb/smollm2" and cfg.server == {"port": 9000}


def test_map_path_loads_a_map_file() -> None:
    doc = {"upstreams": [{"name": "u", "kind": "openai", "base_url": "http://h/v1",
                          "models": [{"name": "g", "map_path": str(FIXTURE_MAP)}]}]}
    assert parse_config(doc, env={}).maps["g"].id == "openai/r50k_base"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


BAD_FLAGS = [
    (["--config", "x.toml", "--upstream", "http://h/v1"], {},
     "--config and --upstream cannot be combined; declare the upstream in the config file"),
    (["--upstream-kind", "openai"], {},
     "--upstream-kind, --upstream-api-key-env, --upstream-max-concurrent and "
     "--upstream-context-length need --upstream URL"),
    (["--config", "x.toml", "--upstream-max-concurrent", "8"], {},
     "--upstream-kind, --upstream-api-key-env, --upstream-max-concurrent and "
     "--upstream-context-length apply to --upstream; set them in the config file"),
    (["--upstream", "http://h/v1", "--upstream-max-concurrent", "0"], {},
     "--upstream: upstream 'h': max_concurrent must be at least 1"),
    (["--upstream", "http://h/v1", "--upstream-context-length", "0"], {},
     "--upstream: upstream 'h': context_length must be a number of tokens from 1 to "
     "16777215, got 0"),
    (["--upstream", "ftp://h/v1"], {},
     "--upstream: upstream 'h': base_url 'ftp://h/v1' is not an http:// or https:// URL "
     "with a host"),
    (["--upstream", "http://h/v1", "--upstream-kind", "soap"], {},
     "--upstream: upstream 'h': unknown kind 'soap'; expected one of embedded, openai, "
     "codec, responses, anthropic"),
    (["--upstream", "http://h/v1", "--upstream-api-key-env", "MISSING"], {},
     "--upstream: upstream 'h': api_key_env names MISSING, which is not set"),
    ([], {ENV_UPSTREAM: "h:8000"},
     "--upstream: upstream 'upstream': base_url 'h:8000' is not an http:// or https:// URL "
     "with a host"),
    ([], {ENV_CONFIG: "/nonexistent/t.toml"},
     "cannot read config file /nonexistent/t.toml: No such file or directory"),
]


@pytest.mark.parametrize(("argv", "env", "message"), BAD_FLAGS,
                         ids=[" ".join(a) or next(iter(e)) for a, e, _ in BAD_FLAGS])
def test_bad_flags_and_environment_fail_with_their_message(argv, env, message) -> None:
    with pytest.raises(ConfigError) as info:
        serve_cmd.gateway_config_from_args(_args(*argv), env=env)
    assert str(info.value) == message


def test_no_flags_and_no_environment_serve_the_embedded_engine() -> None:
    assert serve_cmd.gateway_config_from_args(_args(), env={}) is None


def test_flags_override_the_environment_and_environment_gives_upstreams() -> None:
    cfg = resolve(upstream_urls=["http://a:1/v1"], env={ENV_UPSTREAM: "http://b:2/v1"})
    assert [u.base_url for u in cfg.upstreams] == ["http://a:1/v1"]
    cfg = resolve(env={ENV_UPSTREAM: "http://b:2/v1, http://c:3/v1"})
    assert [u.name for u in cfg.upstreams] == ["b:2#1", "c:3#2"]
    assert cfg.upstreams[0].kind == "openai" and not cfg.no_probe
    assert resolve(upstream_urls=["http://a:1/v1"], probe=False, env={}).no_probe == {"a:1"}


def test_server_flags_override_the_files_server_table(tmp_path) -> None:
    file_server = {"port": 9000, "host": "0.0.0.0", "coalesce_ms": 10}
    s = serve_cmd.settings_from_args(_args("--port", "9100"), file_server)
    assert (s.host, s.port, s.window_s) == ("0.0.0.0", 9100, 0.01)


# -- start-up checks that need the upstream ------------------------------------------------


class FakeAdapter:
    """An adapter whose probe reports ``options['lists']`` and ``options['state']``."""

    kind = "openai"
    ids_source = IdsSource.RETOKENIZED
    built: ClassVar[list[FakeAdapter]] = []

    def __init__(self, config: UpstreamConfig) -> None:
        self.config, self.name, self.closed = config, config.name, False
        self.model_id = config.name

    @classmethod
    def from_config(cls, config, *, transport=None, maps=None) -> FakeAdapter:
        cls.built.append(adapter := cls(config))
        return adapter

    def submit(self, request):  # pragma: no cover - routing is tested elsewhere
        raise NotImplementedError

    async def probe(self) -> UpstreamHealth:
        opts = self.config.options
        return UpstreamHealth(
            name=self.name, kind=self.kind, state=UpstreamState(opts.get("state", "up")),
            models=tuple(opts.get("lists", ())), detail=str(opts.get("detail", "")))

    async def aclose(self) -> None:
        self.closed = True


def _build(doc: dict, env: dict | None = None):
    # The fake reads its own keys from the options: read and built with the same table, so
    # the real openai adapter's checks (which refuse those keys) do not apply to it.
    adapters = {"openai": FakeAdapter}
    cfg = parse_config(doc, source="t.toml", env=env or {}, adapters=adapters)
    return asyncio.run(build_gateway(cfg, ServerSettings(), adapters=adapters))


def _up(**kw) -> dict:
    return {"name": "u", "kind": "openai", "base_url": "http://h:1/v1", **kw}


STARTUP = [
    ("unreachable", _up(options={"state": "down", "detail": "connection refused"}),
     "upstream 'u' (openai at http://h:1/v1) is unreachable: connection refused; start it "
     "first, or set probe = false (--no-probe) if it starts later"),
    ("model not listed", _up(options={"lists": ["a", "b"]},
                             models=[{"name": "m", "upstream_model": "c"}]),
     "upstream 'u' (openai at http://h:1/v1) does not serve model 'c' (configured as 'm'); "
     "it lists: a, b"),
    ("nothing to discover", _up(options={"lists": []}),
     "upstream 'u' lists no models; name them under [[upstreams.models]]"),
    ("not probed, no models", _up(probe=False),
     "upstream 'u' declares no models and is not probed: list them under [[upstreams.models]]"),
]


@pytest.mark.parametrize(("case", "up", "message"), STARTUP, ids=[c[0] for c in STARTUP])
def test_startup_probe_failures_are_config_errors(case, up, message) -> None:
    FakeAdapter.built.clear()
    with pytest.raises(ConfigError) as info:
        _build({"upstreams": [up]})
    assert str(info.value) == message
    assert all(a.closed for a in FakeAdapter.built)  # nothing left open after a failed start


def test_an_upstream_that_accepts_and_never_answers_fails_start_up_at_the_probe_deadline(
        monkeypatch) -> None:
    """The real adapter's probe against a socket that accepts and says nothing waited for
    its read timeout (120 s; per read, so for ever from one that drips): start-up now gives
    up at the probe's deadline (10 s; shortened here) with the unreachable error."""
    import socket
    import threading

    from tokenwire.gateway import server

    monkeypatch.setattr(server, "PROBE_TIMEOUT_S", 0.3)
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    try:
        cfg = parse_config({"upstreams": [{"name": "u", "kind": "openai", "base_url": url}]},
                           source="t.toml", env={})
        with pytest.raises(ConfigError) as info:
            asyncio.run(build_gateway(cfg, ServerSettings()))
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert str(info.value) == (
        f"upstream 'u' (openai at {url}) is unreachable: probe timed out after 0.3 s; "
        "start it first, or set probe = false (--no-probe) if it starts later")


def test_probe_false_skips_the_check_for_an_upstream_started_later() -> None:
    gw = _build({"upstreams": [_up(probe=False, options={"state": "down"},
                                   models=[{"name": "m"}])]})
    assert gw.state.router.names == ("m",) and gw.probes == ()


def test_models_are_discovered_with_the_alias_map_or_none() -> None:
    gw = _build({"upstreams": [_up(options={"lists": ["HuggingFaceTB/SmolLM2-135M", "x"]})]})
    smol, x = gw.state.router.models
    assert smol.tmap is not None and smol.tmap.id == "huggingfacetb/smollm2"
    assert smol.ids_source is IdsSource.RETOKENIZED
    assert x.tmap is None and x.ids_source is IdsSource.NONE  # text only, nothing to tokenize
    assert [m.name for m in FakeAdapter.built[-1].config.models] == [smol.name, "x"]


def test_discovered_duplicates_across_upstreams_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="model 'x' is served twice"):
        _build({"upstreams": [_up(options={"lists": ["x"]}),
                              _up(name="v", options={"lists": ["x"]})]})


def test_secrets_never_appear_in_errors_or_reprs(tmp_path) -> None:
    f = tmp_path / "t.toml"
    texts = []
    for bad in ("api_key_env = \"VLLM_KEY\"\nbase_url = \"nope\"\n",
                "api_key_env = \"VLLM_KEY\"\nprobe = 3\n"):
        f.write_text("[[upstreams]]\nname = \"u\"\nkind = \"openai\"\n" + bad)
        with pytest.raises(ConfigError) as info:
            load_config_file(f, env=ENV)
        texts += [str(info.value), repr(info.value)]
    f.write_text(GOOD)
    cfg = load_config_file(f, env=ENV)
    texts += [repr(cfg), repr(cfg.upstreams)]
    with pytest.raises(ConfigError) as info:
        _build({"upstreams": [_up(api_key_env="VLLM_KEY",
                                  options={"state": "down", "detail": "401"})]}, env=ENV)
    texts.append(str(info.value))
    for kind, cls in ADAPTERS.items():  # every registered remote adapter keeps its key hidden
        if kind == "embedded":
            continue
        up = UpstreamConfig(name="u", kind=kind, base_url="http://127.0.0.1:9/v1",
                            api_key_env="VLLM_KEY")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("VLLM_KEY", SECRET)
            try:
                adapter = cls.from_config(up)
            except ConfigError as exc:  # a kind may need options; its error must not leak
                texts.append(str(exc))
                continue
            texts += [repr(adapter), str(vars(adapter).get("config", ""))]
            asyncio.run(adapter.aclose())
    assert texts and not [t for t in texts if SECRET in t]


# -- capacity, time and retries: flag > [server] > default ------------------------------------


def _serve_args(*argv: str):
    import argparse

    from tokenwire.cli import serve as serve_cmd

    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_capacity_and_time_settings_come_from_flags_over_the_file() -> None:
    from tokenwire.cli.serve import settings_from_args
    from tokenwire.gateway.settings import ServerSettings

    default = settings_from_args(_serve_args(), env={})
    assert (default.max_concurrent, default.queue_size, default.idle_timeout_s,
            default.retries) == (4, 32, 600.0, True)
    server = {"max_concurrent": 8, "queue_size": 64, "idle_timeout_s": 120, "retries": False}
    from_file = settings_from_args(_serve_args(), server, env={})
    assert (from_file.max_concurrent, from_file.queue_size, from_file.idle_timeout_s,
            from_file.retries) == (8, 64, 120, False)
    flags = settings_from_args(_serve_args("--max-concurrent", "2", "--queue-size", "0",
                                           "--idle-timeout", "30"), server, env={})
    assert (flags.max_concurrent, flags.queue_size, flags.idle_timeout_s) == (2, 0, 30.0)
    assert settings_from_args(_serve_args("--no-retries"), env={}).retries is False
    with pytest.raises(ConfigError, match="max_concurrent"):
        ServerSettings(max_concurrent=0)
    with pytest.raises(ConfigError, match="idle_timeout_s"):
        ServerSettings(idle_timeout_s=0)


#: Every [server] time and a value it was taken with: infinity and 1e308 turned the limit off
#: without a word (asyncio.timeout(inf) never fires: a silent upstream held its request, and
#: a SIGTERM's drain, for ever), NaN made the coalescing window and the drain never close.
HOSTILE_TIMES = [
    (key, value, bound)
    for key, bound in (("idle_timeout_s", "a positive"), ("request_cap_s", "a positive"),
                       ("head_timeout_s", "a positive"),
                       ("body_timeout_s", "a positive"), ("ws_idle_timeout_s", "a positive"),
                       ("ws_session_cap_s", "a positive"), ("drain_grace_s", "a"))
    for value in (float("inf"), 1e308, float("nan"), -1)
]


@pytest.mark.parametrize(("key", "value", "bound"), HOSTILE_TIMES,
                         ids=[f"{k}={v}" for k, v, _ in HOSTILE_TIMES])
def test_server_times_are_finite_and_at_most_a_day(key, value, bound) -> None:
    from tokenwire.cli.serve import settings_from_args

    expected = (f"{key} must be {bound} number of seconds "
                + ("up to 86400" if bound == "a positive" else "from 0 up to 86400")
                + f", got {value!r}")
    with pytest.raises(ConfigError) as info:
        settings_from_args(_serve_args(), {key: value}, env={})
    assert str(info.value) == expected
    assert settings_from_args(_serve_args(), {key: 86_400}, env={})  # a day is allowed


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1"])
def test_time_flags_are_checked_as_the_files_values_are(value) -> None:
    from tokenwire.cli.serve import settings_from_args

    for flag, key in (("--idle-timeout", "idle_timeout_s"), ("--body-timeout", "body_timeout_s"),
                      ("--head-timeout", "head_timeout_s"), ("--drain-grace", "drain_grace_s")):
        with pytest.raises(ConfigError, match=f"^{key} must be a"):
            settings_from_args(_serve_args(flag, value), env={})
    # The coalescing window: 0 flushes every frame (documented); NaN or infinity never
    # closed it, so a stream's frames waited for the 64 KiB cap or the end.
    with pytest.raises(ConfigError, match=r"^the coalescing window \(coalesce_ms / 1000\) "
                                          "must be a number of seconds from 0"):
        settings_from_args(_serve_args("--coalesce-ms", value), env={})
    assert settings_from_args(_serve_args("--coalesce-ms", "0"), env={}).window_s == 0
    assert settings_from_args(_serve_args("--drain-grace", "0"), env={}).drain_grace_s == 0


@pytest.mark.parametrize("port", [70000, 65536, -1])
def test_a_port_past_65535_or_below_0_is_refused(port) -> None:
    """70000 was bound as 70000 % 65536 = 4464 (getaddrinfo wraps it) under a banner that
    named 70000; 0 stays the system's choice of a free port."""
    from tokenwire.cli.serve import settings_from_args

    message = f"port must be a port number from 0 to 65535, got {port}"
    with pytest.raises(ConfigError, match=f"^{message}$"):
        settings_from_args(_serve_args(), {"port": port}, env={})
    with pytest.raises(ConfigError, match=f"^{message}$"):
        settings_from_args(_serve_args("--port", str(port)), env={})
    assert settings_from_args(_serve_args("--port", "0"), env={}).port == 0


@pytest.mark.parametrize(("flag", "value", "message"), [
    # The flags reached llama.cpp unchecked, past the ranges [upstreams.options] has:
    # --n-ctx with extra digits allocated the KV cache of that window at start, and -5
    # failed as "could not be loaded by llama.cpp ... is it a GGUF model?".
    ("--n-ctx", "2000000", "--n-ctx must be an integer from 1 to 1048576, not 2000000"),
    ("--n-ctx", "-5", "--n-ctx must be an integer from 1 to 1048576, not -5"),
    ("--threads", "0", "--threads must be an integer from 1 to 512, not 0"),
    ("--threads", "100000", "--threads must be an integer from 1 to 512, not 100000"),
])
def test_the_embedded_engines_flags_have_its_options_ranges(flag, value, message) -> None:
    from tokenwire.cli.serve import settings_from_args

    with pytest.raises(ConfigError) as info:
        settings_from_args(_serve_args(flag, value), env={})
    assert str(info.value) == message


@pytest.mark.parametrize("value", [0, -1])
def test_a_max_body_bytes_below_1_is_refused_at_start_up(value) -> None:
    """It started, and answered every request with a 413 'request body is 57 bytes; the
    limit is -1'."""
    from tokenwire.cli.serve import settings_from_args

    with pytest.raises(ConfigError) as info:
        settings_from_args(_serve_args(), {"max_body_bytes": value}, env={})
    assert str(info.value) == f"max_body_bytes must be at least 1, got {value}"


@pytest.mark.parametrize("value", [1e-6, 0.005, 0, float("nan"), float("inf")])
def test_a_heartbeat_is_at_least_a_hundredth_of_a_second(value) -> None:
    """heartbeat_s = 1e-6 sent a keep-alive on every turn of the loop while an upstream
    was silent: 1.2 MB of ': keep-alive' to one client in 3 s, the process at full CPU."""
    from tokenwire.cli.serve import settings_from_args

    with pytest.raises(ConfigError) as info:
        settings_from_args(_serve_args(), {"heartbeat_s": value}, env={})
    assert str(info.value) == ("heartbeat_s must be a number of seconds from 0.01 up to "
                               f"86400, got {value!r}")
    assert settings_from_args(_serve_args(), {"heartbeat_s": 0.01}, env={}).heartbeat_s == 0.01
