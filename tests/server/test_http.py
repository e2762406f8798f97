"""Health, info, voices, metrics and static files (the real server on the virtual network and clock)."""

import pytest


async def test_health_info_voices(virtual_server, autojump_clock):
    handle = await virtual_server(slots=3)
    health = await handle.get_json("/health")
    assert health["status"] == "ok" and health["engine_state"] == "idle"
    assert (health["slots_total"], health["slots_free"], health["queued"]) == (3, 3, 0)
    info = await handle.get_json("/api/info")
    assert info["slots"] == 3 and info["max_prompt_chars"] == 1000
    assert "echo" in info["model"] and info["version"]
    voices = (await handle.get_json("/api/voices"))["voices"]
    assert "NATF0.pt" in voices and "VARM4.pt" in voices


async def test_metrics_are_prometheus_text(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.http() as client:
        response = await client.get(handle.http_url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in (
        "pplex_tick_duration_seconds_bucket",
        "pplex_tick_lateness_seconds_bucket",
        'pplex_slots{state="free"} 2.0',
        "pplex_frames_dropped_total",
        "pplex_sessions_started_total",
        "pplex_sessions_ended_total",
        "pplex_errors_total",
    ):
        assert name in text, name


async def test_static_index_and_path_tricks(virtual_server, autojump_clock, tmp_path):
    (tmp_path / "index.html").write_text("<h1>hello</h1>")
    (tmp_path / "app.js").write_text("console.log(1)")
    secret = tmp_path.parent / "secret.txt"
    secret.write_text("do not serve")
    handle = await virtual_server(static_dir=tmp_path)
    async with handle.http() as client:
        assert (await client.get(handle.http_url + "/")).text == "<h1>hello</h1>"
        assert (await client.get(handle.http_url + "/app.js")).text == "console.log(1)"
        for path in ("/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt", "/nothing.html"):
            response = await client.get(handle.http_url + path)
            assert response.status_code == 404, path
            assert "do not serve" not in response.text


async def test_default_static_serves_the_web_ui(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.http() as client:
        response = await client.get(handle.http_url + "/")
    assert response.status_code == 200
    assert "<html" in response.text.lower()


@pytest.mark.parametrize("path", ["/api/chat", "/v1/audio/duplex"])
async def test_plain_http_on_websocket_routes_is_refused(virtual_server, autojump_clock, path):
    handle = await virtual_server()
    async with handle.http() as client:
        response = await client.get(handle.http_url + path)
    assert response.status_code >= 400
