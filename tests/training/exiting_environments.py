"""Environments that end the thread they run in with an exception outside `Exception`, named by import path by the
asynchronous producer's fault tests (`tests.training.test_async_faults`)."""

from __future__ import annotations

import asyncio


class ExitsOnReset:
    """`reset` calls `sys.exit` (an environment that gives up): SystemExit, which ends a thread without a word."""

    def reset(self, **row) -> None:
        raise SystemExit(3)

    def look(self) -> str:
        return "nothing here"


class CancelledReward:
    """An async `get_reward` whose task is cancelled: `asyncio.CancelledError`, a BaseException since Python 3.8."""

    def reset(self, **row) -> None:
        return None

    def look(self) -> str:
        return "nothing here"

    async def get_reward(self) -> float:
        raise asyncio.CancelledError
