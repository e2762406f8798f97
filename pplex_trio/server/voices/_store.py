"""The voices a server keeps: made from clips uploaded over HTTP, one ``NAME.pt`` each in one folder.

The folder (``--voice-store``; by default one per model under the cache, as
a voice prompt only means something to the model that made it) survives
restarts.  A voice is written to a hidden file beside its place, flushed and
renamed into place, so a crash mid-write leaves no half-written voice (and
the hidden leftovers are swept when the store opens).  The store also holds
the limits of what may be kept, and the names being made right now, so two
uploads of one name cannot both win.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..._cache import cache_dir

logger = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9_-]{1,48}")
SUFFIX = ".pt"
_TEMP_PREFIX = ".upload-"


@dataclasses.dataclass(frozen=True)
class VoiceLimits:
    """What one upload and the whole store may hold, and how often an address may add."""

    max_bytes: int = 10 * 1024 * 1024  # one clip, as uploaded
    max_seconds: float = 30.0  # one clip (the reference's voices are 4 s)
    min_seconds: float = 1.0
    max_voices: int = 100
    max_store_bytes: int = 1 << 30  # the voice prompts kept (a 30 s voice of the 7B model: ~3 MB)
    per_minute: int = 10  # uploads from one address (whatever their outcome)
    at_once: int = 4  # uploads being received, read or made at one time, in all
    body_seconds: float = 30.0  # to receive one body: a client that sends slower is cut off


class StoreRefusal(Exception):
    """A voice the store cannot take; ``status`` is the HTTP answer (400, 404, 409, 507)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def default_folder(model_name: str) -> Path:
    """The store of a model when ``--voice-store`` is not given: under the cache, named after the model."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-.") or "model"
    return cache_dir() / "voice-store" / slug


class VoiceStore:
    """The added voices of one folder (created on the first add), within ``limits``."""

    def __init__(self, folder: Path, limits: VoiceLimits | None = None):
        self.folder = Path(folder)
        self.limits = limits or VoiceLimits()
        self._making: set[str] = set()
        for leftover in self.folder.glob(f"{_TEMP_PREFIX}*") if self.folder.is_dir() else ():
            logger.warning("removing %s, a voice that was being written when the server stopped", leftover.name)
            leftover.unlink(missing_ok=True)

    def names(self) -> list[str]:
        """The added voices, ``NAME.pt``, sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(
            p.name for p in self.folder.iterdir() if p.suffix == SUFFIX and NAME.fullmatch(p.stem) and p.is_file()
        )

    def usage(self) -> tuple[int, int]:
        """(voices kept, their bytes)."""
        names = self.names()
        return len(names), sum(self._size(name) for name in names)

    def check_name(self, name: str, model_voices: Sequence[str]) -> str:
        """``name`` (with or without ``.pt``) as the file name of a new voice; refused (400 for a bad
        name, 409 for one in use) before anything is read."""
        stem = name.removesuffix(SUFFIX)
        if not NAME.fullmatch(stem):
            raise StoreRefusal(400, f"a voice name is 1 to 48 letters, digits, '-' or '_' (got {name[:60]!r})")
        file_name = stem + SUFFIX
        if file_name in model_voices:
            raise StoreRefusal(409, f"{file_name} is one of the model's own voices: choose another name")
        if file_name in self._making or (self.folder / file_name).exists():
            raise StoreRefusal(
                409,
                f"there is already a voice {file_name}: choose another name, or delete it "
                "first (DELETE /api/voices/" + stem + ")",
            )
        return file_name

    def check_room(self) -> None:
        """507 when the store already holds as many voices, or bytes, as it may (those being made count)."""
        count, size = self.usage()
        if count + len(self._making) >= self.limits.max_voices:
            raise StoreRefusal(507, f"the voice store is full ({self.limits.max_voices} voices): delete one first")
        self._check_bytes(size)

    def _check_bytes(self, size: int) -> None:
        if size > self.limits.max_store_bytes:
            raise StoreRefusal(
                507,
                f"the voice store is full ({self.limits.max_store_bytes / 2**20:.0f} MiB of voices): delete one first",
            )

    @contextlib.contextmanager
    def making(self, file_name: str) -> Iterator[None]:
        """Hold ``file_name`` while its voice is made: another upload of that name gets 409."""
        self._making.add(file_name)
        try:
            yield
        finally:
            self._making.discard(file_name)

    def add(self, file_name: str, data: bytes) -> None:
        """Keep ``data`` as ``file_name``, atomically (507 when it does not fit)."""
        self._check_bytes(self.usage()[1] + len(data))
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.folder / file_name)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        _sync_folder(self.folder)

    def remove(self, name: str) -> str:
        """Delete an added voice (``NAME`` or ``NAME.pt``); returns its file name (404 when there is none)."""
        stem = name.removesuffix(SUFFIX)
        file_name = stem + SUFFIX
        if not NAME.fullmatch(stem) or not (self.folder / file_name).is_file():
            raise StoreRefusal(404, f"no added voice {name[:60]!r} (see GET /api/voices)")
        (self.folder / file_name).unlink()
        return file_name

    def _size(self, name: str) -> int:
        try:
            return (self.folder / name).stat().st_size
        except FileNotFoundError:  # deleted meanwhile
            return 0


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX: fsync the folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
