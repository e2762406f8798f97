"""The call records a server keeps (``--record DIR``): one folder, a record per call, kept within retention and
quota.

A record is the files ``<id>.wav``, ``<id>.vtt`` and ``<id>.json`` (see
``_recorder.py``), its id the call's start in UTC, its session and a random
part (``20261205T220102Z-s17-3fa9c2``); every route checks an id against
:data:`RECORD_ID` before it names a file, and the store never touches a file
whose name is not a record's.  A record is *in progress* from the call's
admission until its files are closed: listed with ``"in_progress": true``,
and never deleted (not by retention, quota or request).

The store deletes, when it opens and after each call, the records older than
``--record-retention`` (by their files' last change) and then, oldest first,
those beyond ``--record-quota`` (the calls in progress count, but are kept).
All disk work runs on worker threads of the store's limiter
(:data:`WRITERS` at a time), shared by every recorder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import trio

from ..._conversation import Conversation
from ..._metrics import Metrics
from ._recorder import CallEnding, Recorder, utc_stamp

logger = logging.getLogger(__name__)

RECORD_ID = re.compile(r"\d{8}T\d{6}Z-s\d{1,12}-[0-9a-f]{6}")
WRITERS = 2  # worker threads the records may hold at once (a hung disk holds them, never the engine's)
DAY = 86_400.0


class RecordFolderError(ValueError):
    """``--record DIR`` cannot be used; the message says why and what to do."""


def prepare_record_folder(folder: Path) -> Path:
    """Create ``folder`` if needed and check that this user may write there (at start, before a model loads)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecordFolderError(
            f"--record {folder}: cannot create the folder ({exc.strerror or exc}); give a folder this user may create"
        ) from None
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise RecordFolderError(
            f"--record {folder}: not a folder this user may write in; give another one, or change its owner or mode"
        )
    return folder


class Deletion(enum.Enum):
    """What came of a request to delete a record (``DELETE /api/recordings/<id>``: 204, 404, 409)."""

    DELETED = "deleted"
    UNKNOWN = "unknown"
    IN_PROGRESS = "in_progress"


@dataclasses.dataclass
class _OnDisk:
    files: list[str] = dataclasses.field(default_factory=list)
    size: int = 0
    changed: float = 0.0  # the newest mtime of its files


class RecordStore:
    """The folder of records: recorders for new calls, the list, deletion, retention and quota."""

    def __init__(self, folder: Path, *, retention_days: float, quota: int, metrics: Metrics):
        self.folder = prepare_record_folder(folder)
        self.retention_days = retention_days  # 0: for ever
        self.quota = quota  # bytes; 0: none
        self.limiter = trio.CapacityLimiter(WRITERS)
        self._metrics = metrics
        self._recording: dict[str, Recorder] = {}  # the records in progress
        self._summaries: dict[str, tuple[float, dict[str, Any]]] = {}  # finished ones: (changed, JSON less text)
        self._prune_wanted = trio.Event()
        self._nursery: trio.Nursery | None = None  # run's: the records finish_later finishes

    # -- recorders -------------------------------------------------------------

    def recorder(self, session_id: int, protocol: str, conversation: Conversation) -> Recorder:
        """A record for a new call, in progress until its recorder has finished."""
        now = datetime.datetime.now(datetime.UTC)
        record_id = f"{now:%Y%m%dT%H%M%SZ}-s{session_id}-{secrets.token_hex(3)}"
        recorder = Recorder(
            record_id,
            self.folder,
            protocol=protocol,
            conversation=conversation,
            limiter=self.limiter,
            metrics=self._metrics,
            on_done=self._finished,
        )
        self._recording[record_id] = recorder
        return recorder

    def in_progress(self, record_id: str) -> bool:
        """Whether its recorder has not finished yet (its files are not to be served, deleted or pruned)."""
        return record_id in self._recording

    def _finished(self, recorder: Recorder) -> None:
        self._recording.pop(recorder.id, None)
        self._prune_wanted.set()

    # -- retention and quota ---------------------------------------------------

    def finish_later(self, recorder: Recorder, ending: CallEnding) -> None:
        """Finish ``recorder``'s record in the store's own task: a call that ended with no session to finish it
        (its connection dropped and nobody resumed it within the window)."""
        assert self._nursery is not None, "the store runs (run) before any call ends"
        self._nursery.start_soon(recorder.finish, ending)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply retention and quota now, then after each call; finish the records left to it (``finish_later``)."""
        await self.prune()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await self._prune_wanted.wait()
                self._prune_wanted = trio.Event()
                await self.prune()

    async def prune(self) -> None:
        """Delete, on a thread, the finished records past retention, then the oldest beyond the quota (counted,
        logged); a folder it cannot read is logged, not raised."""
        if not self.retention_days and not self.quota:
            return
        try:
            deleted = await self._in_thread(self._prune)
        except OSError as exc:
            logger.warning(
                "call records in %s: cannot apply retention and quota (%s)", self.folder, exc.strerror or exc
            )
            return
        for reason in ("retention", "quota"):
            ids = [record_id for record_id, why in deleted if why == reason]
            if ids:
                self._metrics.records_deleted.labels(reason).inc(len(ids))
                logger.info("call records: %d deleted (%s): %s", len(ids), reason, ", ".join(ids))

    def _prune(self) -> list[tuple[str, str]]:
        """(On a thread.) Delete what is past retention, then the oldest beyond the quota; what was deleted, why."""
        records = self._scan()
        deleted: list[tuple[str, str]] = []
        finished = sorted(
            (r.changed, record_id) for record_id, r in records.items() if record_id not in self._recording
        )
        if self.retention_days:
            limit = time.time() - self.retention_days * DAY
            for changed, record_id in finished:
                if changed < limit:
                    self._remove(records.pop(record_id))
                    deleted.append((record_id, "retention"))
        if self.quota:
            total = sum(r.size for r in records.values())
            for _, record_id in finished:
                if total <= self.quota:
                    break
                if record_id in records and record_id not in self._recording:
                    total -= records[record_id].size
                    self._remove(records.pop(record_id))
                    deleted.append((record_id, "quota"))
        return deleted

    # -- what the routes ask ---------------------------------------------------

    async def listing(self) -> list[dict[str, Any]]:
        """Every record, newest first: the finished ones' JSON less its text, and those in progress."""
        finished = await self._in_thread(self._list_finished)
        current = [recorder.describe() for recorder in self._recording.values()]
        listed = [summary for summary in finished if summary["id"] not in self._recording] + current
        return sorted(listed, key=_age, reverse=True)

    async def describe(self, record_id: str) -> dict[str, Any] | None:
        """A record's JSON, text included (None: no such record)."""
        if not RECORD_ID.fullmatch(record_id):
            return None
        if (recorder := self._recording.get(record_id)) is not None:
            return recorder.describe()
        data: dict[str, Any] | None = await self._in_thread(self._read_json, record_id)
        if data is not None:
            data.setdefault("in_progress", False)
        return data

    def file(self, record_id: str, suffix: str) -> Path | None:
        """A finished record's ``.wav`` or ``.vtt`` (None: no such record, or none yet)."""
        if not RECORD_ID.fullmatch(record_id) or record_id in self._recording:
            return None
        path = self.folder / f"{record_id}{suffix}"
        return path if path.is_file() else None

    async def delete(self, record_id: str) -> Deletion:
        """Delete a finished record's files on request; one in progress is left alone (``IN_PROGRESS``)."""
        if not RECORD_ID.fullmatch(record_id):
            return Deletion.UNKNOWN
        if record_id in self._recording:
            return Deletion.IN_PROGRESS
        found = await self._in_thread(self._delete, record_id)
        if not found:
            return Deletion.UNKNOWN
        self._metrics.records_deleted.labels("request").inc()
        logger.info("call record %s deleted on request", record_id)
        return Deletion.DELETED

    # -- on the threads -------------------------------------------------------

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter, abandon_on_cancel=True)

    def _scan(self) -> dict[str, _OnDisk]:
        """The records' files in the folder, by record (anything else there is left alone)."""
        records: dict[str, _OnDisk] = {}
        with os.scandir(self.folder) as entries:
            for entry in entries:
                record_id = entry.name.split(".", 1)[0]
                if not RECORD_ID.fullmatch(record_id) or not entry.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat(follow_symlinks=False)
                    record = records.setdefault(record_id, _OnDisk())
                    record.files.append(entry.path)
                    record.size += stat.st_size
                    record.changed = max(record.changed, stat.st_mtime)
        return records

    def _remove(self, record: _OnDisk) -> None:
        for path in record.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _delete(self, record_id: str) -> bool:
        record = self._scan().get(record_id)
        if record is None:
            return False
        self._remove(record)
        return True

    def _read_json(self, record_id: str) -> dict[str, Any] | None:
        path = self.folder / f"{record_id}.json"
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return _unfinished(record_id) if (self.folder / f"{record_id}.wav").is_file() else None
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _list_finished(self) -> list[dict[str, Any]]:
        records = self._scan()
        summaries: dict[str, tuple[float, dict[str, Any]]] = {}
        for record_id, record in records.items():
            if record_id in self._recording:
                continue
            cached = self._summaries.get(record_id)
            if cached is not None and cached[0] == record.changed:
                summaries[record_id] = cached
                continue
            data = self._read_json(record_id)
            if data is None:
                continue
            data.pop("text", None)
            data.setdefault("in_progress", False)
            summaries[record_id] = (record.changed, data)
        self._summaries = summaries
        return [summary for _, summary in summaries.values()]


def _age(summary: dict[str, Any]) -> tuple[str, int, str]:
    """Sorts records by their start (within a second: by their sessions' order)."""
    record_id = str(summary["id"])
    return str(summary.get("started") or ""), int(record_id.split("-")[1][1:]), record_id


def _unfinished(record_id: str) -> dict[str, Any]:
    """A record whose call was cut off by the server's own end (no JSON was written)."""
    started = datetime.datetime.strptime(record_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    return {
        "id": record_id,
        "started": utc_stamp(started),
        "complete": False,
        "in_progress": False,
        "error": "the server stopped during the call: only its audio is kept",
    }
