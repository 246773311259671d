"""Non-streaming requests keep the failure's HTTP status (seed: "Nonstream requests retain
the corresponding HTTP error status"), after the same retry budgets as streams: a request
without a stream has nothing to keep alive, so its status waits for the budget's end."""

from __future__ import annotations

import pytest

from .harness import Outcome, environment, run_in_looptime, send
from .table import ROWS, TEXT, Row

#: Row id -> the HTTP status of a non-streaming Chat and Responses request.
STATUSES: dict[str, int] = {
    "429-retry-after": 200, "429-persistent": 429, "429-quota": 429, "500-once": 200,
    "503-persistent": 503, "refused": 502, "reset-persistent": 502, "no-response": 504,
    "cut-mid-answer": 502, "eof-no-terminal": 502, "overflow-vllm-0.9": 400,
    "overflow-llama.cpp": 400, "content-filter-400": 400,
}
_BY_ID = {row.id: row for row in ROWS}


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("row_id", list(STATUSES))
def test_a_non_streaming_request_keeps_the_status(row_id: str, api: str) -> None:
    row: Row = _BY_ID[row_id]

    async def main() -> Outcome:
        async with environment(list(row.script), refused=row.refused) as env:
            return await send(env, api, stream=False)

    out = run_in_looptime(main)
    assert out.status == STATUSES[row_id], out
    assert out.heartbeats == []
    lo, hi = row.elapsed
    assert lo <= out.elapsed <= hi
    if out.status == 200:
        assert out.text == TEXT if api == "chat" else out.terminal == "completed"
