"""``/official/``: the official client from the local Hugging Face cache, never from the network."""

from __future__ import annotations

import httpx
import pytest

from _helpers.official import REPO_ID, fake_dist_files, fake_hub_cache, make_tgz, server_process
from pplex_trio.server.transport._official import find_official_client, repo_for_model


def test_repo_follows_model_when_it_is_a_repo_id(tmp_path):
    assert repo_for_model("echo") == REPO_ID
    assert repo_for_model("tiny") == REPO_ID
    assert repo_for_model(str(tmp_path)) == REPO_ID  # a checkpoint folder
    assert repo_for_model("someone/personaplex-finetune") == "someone/personaplex-finetune"


def test_extracted_once_from_the_cache(tmp_path):
    hub = fake_hub_cache(tmp_path / "hub", make_tgz(fake_dist_files()))
    folder = find_official_client("echo", hub_cache=hub, cache=tmp_path / "cache")
    assert folder is not None and (folder / "index.html").read_text().startswith("<!doctype html>")
    assert (folder / "assets" / "index-abc123.js").is_file()
    # A second server start finds the extraction and does not redo it.
    marker = folder / "marker"
    marker.write_text("still here")
    assert find_official_client("echo", hub_cache=hub, cache=tmp_path / "cache") == folder
    assert marker.read_text() == "still here"


def test_nothing_cached_means_no_official_client(tmp_path):
    (tmp_path / "hub").mkdir()
    assert find_official_client("echo", hub_cache=tmp_path / "hub", cache=tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    "files",
    [
        {"dist/readme.txt": b"no index"},
        {"../escape.html": b"<h1>outside</h1>", "dist/index.html": b"<h1>x</h1>"},
    ],
    ids=["no-index", "path-traversal"],
)
def test_a_bad_archive_is_refused_not_fatal(tmp_path, files):
    hub = fake_hub_cache(tmp_path / "hub", make_tgz(files))
    assert find_official_client("echo", hub_cache=hub, cache=tmp_path / "cache") is None
    assert not (tmp_path / "escape.html").exists() and not (tmp_path / "cache" / "escape.html").exists()


def test_server_serves_the_official_client_from_a_fake_cache(tmp_path):
    hub = fake_hub_cache(tmp_path / "hub", make_tgz(fake_dist_files()))
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PPLEX_TRIO_CACHE": str(tmp_path / "cache")}
    with server_process("--model", "echo", env=env) as url, httpx.Client(base_url=url) as http:
        info = http.get("/api/info").json()
        assert info["official_client"] == "/official/"
        page = http.get("/official/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script type="module" crossorigin src="/assets/index-abc123.js">' in page.text
        assert 'history.replaceState(history.state, "", "/?official"' in page.text
        # Reloading at /?official gives the official client again; / stays ours.
        assert http.get("/?official").text == page.text
        assert "PersonaPlex" in http.get("/").text and "replaceState" not in http.get("/").text
        # Its bundle asks for /assets/… from the root: served from the official build.
        for path in ("/official/assets/index-abc123.js", "/assets/index-abc123.js"):
            response = http.get(path)
            assert response.status_code == 200 and "official client at" in response.text, path
        assert http.get("/official/../pyproject.toml").status_code == 404
        assert http.get("/assets/missing.js").status_code == 404
    assert (tmp_path / "cache").is_dir()


def test_static_flag_turns_the_official_route_off(tmp_path):
    hub = fake_hub_cache(tmp_path / "hub", make_tgz(fake_dist_files()))
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<h1>mine</h1>")
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PPLEX_TRIO_CACHE": str(tmp_path / "cache")}
    with (
        server_process("--model", "echo", "--static", str(tmp_path / "site"), env=env) as url,
        httpx.Client(base_url=url) as http,
    ):
        assert http.get("/api/info").json()["official_client"] is None
        assert http.get("/official/").status_code == 404
        assert http.get("/").text == "<h1>mine</h1>"
