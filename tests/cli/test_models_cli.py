"""``tokenwire models`` against a real gateway app on a loopback socket."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import ScriptedUpstream, make_state, start_server
from tokenwire.cli.main import main
from tokenwire.codec.maps import bundled_map_path, load_map_file
from tokenwire.gateway.ir import Finish, FinishKind
from tokenwire.gateway.settings import ServerSettings


@pytest.fixture(scope="module")
def served():
    tmap = load_map_file(bundled_map_path("huggingfacetb/smollm2"))
    up = ScriptedUpstream([(0.0, Finish(reason=FinishKind.EOS))], model_id="smol")
    up.aliases = ("HuggingFaceTB/SmolLM2-135M-Instruct",)  # type: ignore[attr-defined]
    s = start_server(make_state(ServerSettings(), up, tmap, max_model_len=2048))
    yield s, tmap
    s.stop()


def test_models_lists_names_aliases_map_and_context(served, capsys) -> None:
    s, tmap = served
    assert main(["models", "--url", s.url]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("smol  (also: HuggingFaceTB/SmolLM2-135M-Instruct; ")
    assert f"map {tmap.id} {tmap.hash}" in line and "context 2048 tokens" in line
    assert "ids engine" in line


def test_models_json_is_the_servers_document(served, capsys) -> None:
    s, _ = served
    assert main(["models", "--url", s.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in doc["data"]] == ["smol"]


def test_models_reports_an_unreachable_server_in_one_line(capsys) -> None:
    assert main(["models", "--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokenwire: error: GET http://127.0.0.1:9/v1/models failed")
