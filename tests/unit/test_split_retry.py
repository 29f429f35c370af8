"""A lender that does not lend when asked (gone since the views were taken, or refusing for the moment) does
not fail the request: the gateway plans once more over the peers as they answer now
(llmman.gateway.Gateway._split). The stand-in lender and the gateway are test_split_replan's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from tests.unit.test_split_replan import Lender, split_pool

from llmman.errors import LlmmanError


@dataclass
class Flaky(Lender):
    """Refuses its first ``refusals`` worker requests with 503, as a lender that is going away does."""

    refusals: int = 1

    async def create(self, request: web.Request) -> web.Response:
        if self.refusals > 0:
            self.refusals -= 1
            return web.json_response({"error": "shutting down"}, status=503)
        return await super().create(request)


async def test_a_lender_refusing_once_is_asked_again_on_a_fresh_plan(tmp_path: Path) -> None:
    async with split_pool(tmp_path, lender=Flaky()) as (gw, lender, started):
        (await gw.acquire(gw.resolve("tiny"), keep_alive=None, num_ctx=None)).release()
        assert lender.refusals == 0 and set(lender.workers) == {"w0"}
        assert len(started) == 1 and started[0].split is not None


async def test_a_lender_refusing_twice_fails_the_request_with_nothing_lent(tmp_path: Path) -> None:
    async with split_pool(tmp_path, lender=Flaky(refusals=2)) as (gw, lender, started):
        with pytest.raises(LlmmanError) as caught:
            await gw.acquire(gw.resolve("tiny"), keep_alive=None, num_ctx=None)
        assert caught.value.status == 503 and not lender.workers and not started
