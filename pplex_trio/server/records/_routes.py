"""The call records' routes: ``GET /api/recordings`` (newest first), ``GET /api/recordings/ID`` (its JSON),
``GET /api/recordings/ID/audio`` (the WAV), ``GET /api/recordings/ID/text`` (WebVTT) and ``DELETE
/api/recordings/ID``.

Behind ``--auth-token`` as every route but the probes (the access gate's
business).  An id that is not a record's (``RECORD_ID``) is a 404 before any
file is named; a record in progress is listed, but its files are not served
and it cannot be deleted (409) until the call is over.  With recording off,
every route answers 404 and says how to turn it on.
"""

from __future__ import annotations

from typing import Any

from quart import Response, jsonify, send_file

from ._store import Deletion, RecordStore

OFF = "call records are off: serve with --record DIR to keep them"
IN_PROGRESS = "this call is still being recorded; try again once it is over"


def add_record_routes(app: Any, server: Any) -> None:
    """Add the routes to ``app`` (Quart), for ``server``'s store (``server.records``; None: recording is off)."""

    def store() -> RecordStore | None:
        records: RecordStore | None = server.records
        return records

    @app.get("/api/recordings")
    async def recordings() -> Response | tuple[Response, int]:
        if (records := store()) is None:
            return jsonify(error=OFF), 404
        return jsonify(recordings=await records.listing())

    @app.get("/api/recordings/<record_id>")
    async def recording(record_id: str) -> Response | tuple[Response, int]:
        if (records := store()) is None:
            return jsonify(error=OFF), 404
        description = await records.describe(record_id)
        if description is None:
            return _unknown()
        return jsonify(description)

    async def file(record_id: str, suffix: str, mimetype: str) -> Response | tuple[Response, int]:
        if (records := store()) is None:
            return jsonify(error=OFF), 404
        if records.in_progress(record_id):
            return jsonify(error=IN_PROGRESS), 409
        path = records.file(record_id, suffix)
        if path is None:
            return _unknown()
        response = await send_file(path, mimetype=mimetype)
        response.headers["Cache-Control"] = "no-store"  # a call's words are nobody's cache's
        response.headers.pop("Expires", None)
        return response

    @app.get("/api/recordings/<record_id>/audio")
    async def audio(record_id: str) -> Response | tuple[Response, int]:
        return await file(record_id, ".wav", "audio/wav")

    @app.get("/api/recordings/<record_id>/text")
    async def text(record_id: str) -> Response | tuple[Response, int]:
        return await file(record_id, ".vtt", "text/vtt")

    @app.delete("/api/recordings/<record_id>")
    async def delete(record_id: str) -> Response | tuple[Response, int] | tuple[str, int]:
        if (records := store()) is None:
            return jsonify(error=OFF), 404
        deleted = await records.delete(record_id)
        if deleted is Deletion.IN_PROGRESS:
            return jsonify(error=IN_PROGRESS), 409
        if deleted is Deletion.UNKNOWN:
            return _unknown()
        return "", 204


def _unknown() -> tuple[Response, int]:
    return jsonify(error="no such call record (GET /api/recordings lists them)"), 404
