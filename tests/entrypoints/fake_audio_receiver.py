"""The API server's audio receiver without a socket: one asyncio queue per open stream key, which a test fills."""

from __future__ import annotations

import asyncio


class FakeReceiver:
    def __init__(self):
        self.queues: dict[str, asyncio.Queue] = {}

    def open(self, key):
        self.queues[key] = asyncio.Queue()
        return self.queues[key]

    def close(self, key):
        self.queues.pop(key, None)
