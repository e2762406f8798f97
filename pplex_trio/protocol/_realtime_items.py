"""The Realtime conversation's items: what a client adds, and the model's own audio items.

OpenAI's protocol keeps a conversation as a list of items that a client may
add to (a context message, a tool result), truncate (the caller interrupted:
it played the model's audio only so far), delete or read back.  PersonaPlex
hears audio and nothing else, and its persona is fixed once its system prompt
has run, so items change nothing the model does.  They are still kept and
answered as OpenAI answers them, because the voice-agent frameworks send them
as a matter of course (Pipecat a context message first and a truncate at
every barge-in) and stop at an error (``docs/PROTOCOL.md``).

Bounded: the last :data:`MAX_ITEMS` items are kept; older ones are forgotten.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import EventError

MAX_ITEMS = 256
ITEM_TYPES = ("message", "function_call", "function_call_output")
ROLES = ("user", "assistant", "system")
MAX_ID_CHARS = 64


class ConversationItems:
    """One connection's items, oldest first; ``new_id`` names the items the client leaves unnamed."""

    def __init__(self, new_id: Callable[[str], str]):
        self._new_id = new_id
        self._items: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    @property
    def last_id(self) -> str | None:
        """The id of the newest item, or None when there is none (a new item's ``previous_item_id``)."""
        return next(reversed(self._items), None)

    def record(self, item: dict[str, Any]) -> None:
        """Keep an item the server made (the model's audio item, the caller's committed audio)."""
        self._items[item["id"]] = item
        self._items.move_to_end(item["id"])
        while len(self._items) > MAX_ITEMS:
            self._items.popitem(last=False)

    def create(self, event: Mapping[str, Any], event_id: str | None) -> tuple[str | None, dict[str, Any]]:
        """``conversation.item.create``: the item as kept (with its id and status) and the id before it."""
        item = event.get("item")
        if not isinstance(item, Mapping):
            raise EventError("item must be an object", param="item", event_id=event_id)
        if item.get("type") not in ITEM_TYPES:
            raise EventError(f"item.type must be one of {', '.join(ITEM_TYPES)}", param="item.type", event_id=event_id)
        if item.get("type") == "message" and item.get("role") not in ROLES:
            raise EventError(
                f"a message item's role must be one of {', '.join(ROLES)}", param="item.role", event_id=event_id
            )
        item_id = item.get("id")
        if item_id is None:
            item_id = self._new_id("item")
        elif not isinstance(item_id, str) or not 0 < len(item_id) <= MAX_ID_CHARS:
            raise EventError(
                f"item.id must be a string of 1 to {MAX_ID_CHARS} characters", param="item.id", event_id=event_id
            )
        elif item_id in self._items:
            raise EventError(
                f"an item with id {item_id!r} already exists",
                param="item.id",
                code="item_already_exists",
                event_id=event_id,
            )
        previous = event.get("previous_item_id")
        if not isinstance(previous, str):
            previous = self.last_id
        kept = {**item, "id": item_id, "object": "realtime.item", "status": "completed"}
        self.record(kept)
        return previous, kept

    def truncate(self, event: Mapping[str, Any], event_id: str | None) -> tuple[str, int, int]:
        """``conversation.item.truncate``: checked, and recorded as nothing more (the model hears on)."""
        item_id = self._existing(event, event_id)
        return item_id, _count(event, "content_index", 0, event_id), _count(event, "audio_end_ms", None, event_id)

    def delete(self, event: Mapping[str, Any], event_id: str | None) -> str:
        """``conversation.item.delete``: forget the item; returns its id. ``EventError`` (``item_not_found``) for an
        unknown id.
        """
        item_id = self._existing(event, event_id)
        del self._items[item_id]
        return item_id

    def retrieve(self, event: Mapping[str, Any], event_id: str | None) -> dict[str, Any]:
        """``conversation.item.retrieve``: the item as kept. ``EventError`` (``item_not_found``) for an unknown id."""
        return self._items[self._existing(event, event_id)]

    def _existing(self, event: Mapping[str, Any], event_id: str | None) -> str:
        item_id = event.get("item_id")
        if not isinstance(item_id, str):
            raise EventError("item_id must be a string", param="item_id", event_id=event_id)
        if item_id not in self._items:
            raise EventError(
                f"no item with id {item_id[:MAX_ID_CHARS]!r} in this conversation",
                param="item_id",
                code="item_not_found",
                event_id=event_id,
            )
        return item_id


def _count(event: Mapping[str, Any], name: str, default: int | None, event_id: str | None) -> int:
    value = event.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise EventError(f"{name} must be a whole number of 0 or more", param=name, event_id=event_id)
    return value
