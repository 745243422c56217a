"""Stored responses of the Responses API (``store``, ``previous_response_id``), per server.

A stored response keeps the response object (GET /v1/responses/{id}), the items of its input
(GET /v1/responses/{id}/input_items) and the whole conversation it ended, in the chat layer's
form, so a request naming it as ``previous_response_id`` continues from there.  The store is
bounded: at most MAX_RESPONSES responses and about MAX_BYTES of their text; past either, the
oldest are evicted first.  It lives in memory, in the process (the replica) that answered.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["Stored", "ResponseStore", "MAX_RESPONSES", "MAX_BYTES"]

MAX_RESPONSES = 1024
MAX_BYTES = 256 << 20


@dataclass
class Stored:
    response: dict  # the response object, as returned
    input_items: list[dict]  # this request's input items, each with an id
    conversation: list[dict]  # chat-layer messages up to and with this response's reply
    size: int = 0  # bytes the store counts for it


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Stored] = OrderedDict()  # oldest first
        self._bytes = 0
        self.evicted = 0

    def put(self, rid: str, s: Stored) -> None:
        s.size = _size(s.response) + _size(s.input_items) + _size(s.conversation)
        with self._lock:
            old = self._items.pop(rid, None)
            if old is not None:
                self._bytes -= old.size
            self._items[rid] = s
            self._bytes += s.size
            while self._items and (
                len(self._items) > self.max_responses or self._bytes > self.max_bytes
            ):
                _, gone = self._items.popitem(last=False)
                self._bytes -= gone.size
                self.evicted += 1

    def get(self, rid: str) -> Stored | None:
        with self._lock:
            return self._items.get(rid)

    def delete(self, rid: str) -> bool:
        with self._lock:
            s = self._items.pop(rid, None)
            if s is None:
                return False
            self._bytes -= s.size
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _size(x) -> int:
    return len(json.dumps(x, ensure_ascii=False, default=str))
