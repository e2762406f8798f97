"""Plain HTTP requests to a test server."""

from __future__ import annotations

import httpx


async def get_json(handle, path: str) -> dict:
    async with httpx.AsyncClient() as client:
        response = await client.get(handle.http_url + path)
        response.raise_for_status()
        return response.json()
