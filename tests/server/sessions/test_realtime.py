"""`/v1/realtime` in the server's own terms: queue, shutdown, cuts, answered events (the virtual network and clock)."""

from __future__ import annotations

import base64
import json
import logging

import numpy as np
import pytest
import trio

from _helpers.ws import read_until_closed

SILENCE = base64.b64encode(bytes(1920 * 2)).decode()


def append(audio: str = SILENCE) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": audio})


async def next_event(ws, kind: str | None = None, timeout: float = 10.0) -> dict:
    with trio.fail_after(timeout):
        while True:
            event = json.loads(await ws.get_message())
            if kind is None or event["type"] == kind:
                return event


async def live(ws) -> dict:
    """Start the conversation and wait for the first response (the conversation is live)."""
    await next_event(ws, "session.created")
    await ws.send_message(append())
    return await next_event(ws, "response.created")


async def queue_position(ws) -> int:
    """Ask for a conversation on a full server: where it waits."""
    await next_event(ws, "session.created")
    await ws.send_message(append())
    return (await next_event(ws, "pplex.queued"))["position"]


async def test_queued_then_live_and_a_full_queue(virtual_server, autojump_clock, nursery):
    handle = await virtual_server(slots=1, queue_size=1)
    url = handle.ws_url + "/v1/realtime"
    async with handle.open_websocket(url) as first, handle.open_websocket(url) as second:
        await live(first)
        assert await queue_position(second) == 1
        async with handle.open_websocket(url) as third:
            await next_event(third, "session.created")
            await third.send_message(append())
            closed = await read_until_closed(third)
            assert closed.code == 1013
            errors = [json.loads(m)["error"] for m in closed.messages if json.loads(m)["type"] == "error"]
            assert errors and errors[-1]["type"] == "server_error" and "queue" in errors[-1]["message"]
        await first.aclose()
        await next_event(second, "response.created")  # the slot came free: live


async def test_shutdown_is_an_error_event_then_1001(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        await live(ws)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handle.shutdown)
            closed = await read_until_closed(ws)
    assert closed.code == 1001
    assert any(
        json.loads(m)["type"] == "error" and "shutting down" in json.loads(m)["error"]["message"]
        for m in closed.messages
    )


async def test_cancel_and_create_cut_the_response_and_the_next_begins(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        first = (await live(ws))["response"]["id"]
        await ws.send_message(json.dumps({"type": "response.cancel"}))
        done = await next_event(ws, "response.done")
        assert done["response"]["id"] == first and done["response"]["status"] == "cancelled"
        second = (await next_event(ws, "response.created"))["response"]["id"]
        await ws.send_message(json.dumps({"type": "response.create"}))
        done = await next_event(ws, "response.done")
        assert done["response"]["id"] == second and done["response"]["status"] == "completed"
        third = await next_event(ws, "response.created")
        delta = await next_event(ws, "response.output_audio.delta")
        assert delta["response_id"] == third["response"]["id"] != second != first


async def test_commit_clear_and_output_clear_are_answered(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        await live(ws)
        for sent, answer in (
            ("input_audio_buffer.commit", "input_audio_buffer.committed"),
            ("input_audio_buffer.commit", "input_audio_buffer.committed"),
            ("input_audio_buffer.clear", "input_audio_buffer.cleared"),
            ("output_audio_buffer.clear", "output_audio_buffer.cleared"),
        ):
            await ws.send_message(json.dumps({"type": sent}))
            event = await next_event(ws, answer)
            if answer == "input_audio_buffer.committed":
                assert event["item_id"]
        await next_event(ws, "response.output_audio.delta")  # and the audio goes on


async def test_the_caller_speaking_cuts_the_response(virtual_server, autojump_clock):
    handle = await virtual_server()
    loud = base64.b64encode((0.2 * np.sin(np.arange(1920) / 5) * 32767).astype("<i2").tobytes()).decode()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        first = (await live(ws))["response"]["id"]
        for _ in range(4):
            await ws.send_message(append(loud))
        started = await next_event(ws, "input_audio_buffer.speech_started")
        done = await next_event(ws, "response.done")
        assert done["response"]["id"] == first and done["response"]["status"] == "completed"
        nxt = await next_event(ws, "response.created")
        assert nxt["response"]["id"] != first and started["item_id"]


async def test_binary_frames_close_with_1003(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        await next_event(ws, "session.created")
        await ws.send_message(b"\x00\x01")
        closed = await read_until_closed(ws)
    assert closed.code == 1003


async def test_an_idle_opening_times_out(virtual_server, autojump_clock):
    handle = await virtual_server(open_timeout=0.3)
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        await next_event(ws, "session.created")
        closed = await read_until_closed(ws)
    assert closed.code == 1008
    assert "input_audio_buffer.append" in json.loads(closed.messages[-1])["error"]["message"]


@pytest.mark.parametrize("subprotocols, accepted", [(["realtime"], "realtime"), ([], None)])
async def test_the_realtime_subprotocol_is_accepted(virtual_server, autojump_clock, subprotocols, accepted):
    handle = await virtual_server()
    async with handle.open_websocket("/v1/realtime", subprotocols=subprotocols) as ws:
        assert ws.subprotocol == accepted
        await next_event(ws, "session.created")


async def test_a_browser_carries_the_token_in_a_subprotocol(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token="browser-key-123456")
    offered = ["realtime", "openai-insecure-api-key.browser-key-123456", "openai-beta.realtime-v1"]
    async with handle.open_websocket("/v1/realtime", subprotocols=offered) as ws:
        assert ws.subprotocol == "realtime"
        created = await next_event(ws, "session.created")
        assert "modalities" in created["session"]  # the beta marker chose the beta dialect


async def test_pipecat_opening_context_message_then_response_create(virtual_server, autojump_clock, caplog):
    """Pipecat's template: a context message first, then response.create: answered, and the conversation starts."""
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        await next_event(ws, "session.created")
        await ws.send_message(
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "event_id": "ctx",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Say hello."}],
                    },
                }
            )
        )
        added = await next_event(ws)
        assert added["type"] == "conversation.item.added" and added["item"]["content"][0]["text"] == "Say hello."
        assert (await next_event(ws))["type"] == "conversation.item.done"
        await ws.send_message(json.dumps({"type": "response.create", "response": {"metadata": {"id": "greet"}}}))
        created = await next_event(ws, "response.created")
        assert created["response"]["metadata"] == {"id": "greet"}  # the first response carries it
        assert (await next_event(ws, "response.output_audio.delta"))["response_id"] == created["response"]["id"]
    notices = [r.getMessage() for r in caplog.records if "conversation.item.create" in r.getMessage()]
    assert len(notices) == 1 and notices[0].startswith("session ") and r"without effect" in notices[0]


async def test_barge_in_truncate_and_a_matched_reply(virtual_server, autojump_clock, caplog):
    """Pipecat's truncate at a barge-in and LiveKit's generate_reply (matched by metadata) both get their answers."""
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        first = (await live(ws))["response"]
        played = (
            first["output"][0]["id"]
            if first["output"]
            else (await next_event(ws, "response.output_item.added"))["item"]["id"]
        )
        for _ in range(2):  # a framework truncates on every barge-in, the same item maybe twice
            await ws.send_message(
                json.dumps(
                    {"type": "conversation.item.truncate", "item_id": played, "content_index": 0, "audio_end_ms": 240}
                )
            )
            truncated = await next_event(ws, "conversation.item.truncated")
            assert (truncated["item_id"], truncated["audio_end_ms"]) == (played, 240)
        await ws.send_message(
            json.dumps(
                {
                    "type": "response.create",
                    "event_id": "r1",
                    "response": {"metadata": {"client_event_id": "r1"}, "instructions": "ignored"},
                }
            )
        )
        done = await next_event(ws, "response.done")
        assert done["response"]["id"] == first["id"] and done["response"]["metadata"] is None
        created = await next_event(ws, "response.created")
        assert created["response"]["metadata"] == {"client_event_id": "r1"}
        await ws.send_message(json.dumps({"type": "conversation.item.truncate", "item_id": "nope", "audio_end_ms": 0}))
        error = (await next_event(ws, "error"))["error"]
        assert (error["code"], error["param"]) == ("item_not_found", "item_id")
        await next_event(ws, "response.output_audio.delta")  # the session goes on
    refused = [r for r in caplog.records if "refused item_id" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelname == "INFO"


async def test_openai_voice_names_and_an_unknown_voice(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        await next_event(ws, "session.created")
        await ws.send_message(
            json.dumps(
                {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "marin"}}}}
            )
        )
        assert (await next_event(ws, "session.updated"))["session"]["audio"]["output"]["voice"] == "NATF2.pt"
        await ws.send_message(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "instructions": "Be brief.",
                        "audio": {"output": {"voice": "nova2"}},
                    },
                }
            )
        )
        updated = await next_event(ws)
        assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "Be brief."
        assert updated["session"]["audio"]["output"]["voice"] == "NATF2.pt"  # the voice alone was not applied
        error = (await next_event(ws))["error"]
        assert error["param"] == "session.audio.output.voice" and "nova2" in error["message"]


async def test_a_new_persona_runs_the_prompt_again_in_the_same_slot(virtual_server, autojump_clock):
    """A persona change on a full server (LiveKit's update_instructions, or Pipecat's first update arriving after
    its first audio): answered, the prompt runs again in the conversation's own slot, and the audio goes on."""
    handle = await virtual_server(slots=1, prefill_steps=3)
    url = handle.ws_url + "/v1/realtime"
    async with handle.open_websocket(url) as ws, handle.open_websocket(url) as waiting:
        await live(ws)
        assert await queue_position(waiting) == 1
        before = [(await next_event(ws, "response.output_audio_transcript.delta"))["delta"] for _ in range(3)]
        await ws.send_message(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "instructions": "You are a pirate.",
                        "audio": {"output": {"voice": "marin"}},
                    },
                }
            )
        )
        updated = await next_event(ws)  # nothing refused: no error comes first
        assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "You are a pirate."
        for _ in range(4):
            await ws.send_message(append())
        after = []
        while " 0" not in after:  # the echo engine counts its frames anew from a fresh prompt
            after.append((await next_event(ws, "response.output_audio_transcript.delta"))["delta"])
        assert before == [" 0", " 1", " 2"] and len(after) < 12
        sessions = (await handle.get_json("/api/sessions"))["sessions"]
        assert sorted((s["state"], s["slot"]) for s in sessions) == [("live", 0), ("queued", None)]
