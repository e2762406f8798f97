"""`--model tiny` end to end: both protocols, two slots, each with its own persona and voice.

The tiny model has random weights, so its audio is noise; what is checked is
that the server drives the real engine exactly: a greedy raw conversation's
output equals a direct run of the engine with the same persona, voice and
input frames, whatever the other slot is doing.  The real server on the
virtual network and clock: the engine's calls run inline, so however long a
step takes on this machine, the clients' frames and the ticks keep their
time.
"""

import numpy as np
import pytest
import sphn
import trio

from _helpers.tiny_runs import FRAMES, GREEDY, direct_run, raw_conversation
from _helpers.ws import FRAME, moshi_talk, moshi_url
from pplex_trio.engine import Conversation, Sampling

PIRATE = "You are a pirate captain. Speak with salt and swagger."
HOST = "You work for SwiftPlex Appliances and your name is Farhod. Labor cost is $60 per hour."


@pytest.fixture(scope="module")
def speech_frames(speech_wav):
    pcm, _ = sphn.read(str(speech_wav))
    pcm = pcm[0, 24000 : 24000 + FRAMES * FRAME]
    return pcm.reshape(FRAMES, FRAME)


async def test_two_slots_two_protocols_each_with_its_persona_and_voice(
    virtual_server, autojump_clock, engine, speech_frames
):
    handle = await virtual_server(engine, slots=2)
    assert set((await handle.get_json("/api/voices"))["voices"]) >= {"NATF1.pt", "NATM0.pt"}
    moshi_audio, raw_result = [], {}

    async def moshi_conversation():
        url = moshi_url(handle.ws_url, text_prompt=PIRATE, voice_prompt="NATF1.pt", text_seed=1, audio_seed=2)
        moshi_audio.extend(await moshi_talk(url, speech_frames, FRAMES, opener=handle.open_websocket))

    async def raw_talk():
        raw_result["pcm"], raw_result["text"] = await raw_conversation(
            handle, speech_frames, persona=HOST, voice="NATM0.pt", **GREEDY
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(moshi_conversation)
        nursery.start_soon(raw_talk)
    # Moshi: decodable, non-silent audio for every frame.
    audio = np.concatenate(moshi_audio)
    assert audio.size >= FRAMES * FRAME and np.abs(audio).max() > 1e-3
    # Raw: exactly what the engine computes for this persona, voice and input,
    # although the other slot ran another conversation meanwhile.
    conversation = Conversation(persona=HOST, voice="NATM0.pt", sampling=Sampling(**GREEDY))
    served = raw_result["pcm"]
    matches = []
    for lead in range(3):  # ticks that ran before the first input frame carried silence
        expected = direct_run(engine, conversation, speech_frames, lead)
        n = min(len(expected), len(served))
        matches.append(np.array_equal(served[:n], expected[:n]))
    assert any(matches), "served audio differs from a direct engine run"
    lead = matches.index(True)
    # And it depends on the voice: another voice gives other audio.
    other = direct_run(
        engine, Conversation(persona=HOST, voice="NATF1.pt", sampling=Sampling(**GREEDY)), speech_frames, lead
    )
    assert not np.array_equal(other[: len(served)], served[: len(other)])
    # And on the persona.
    pirate = direct_run(
        engine, Conversation(persona=PIRATE, voice="NATM0.pt", sampling=Sampling(**GREEDY)), speech_frames, lead
    )
    assert not np.array_equal(pirate[: len(served)], served[: len(pirate)])


async def test_a_seed_makes_a_sampled_conversation_reproducible(virtual_server, autojump_clock, engine, speech_frames):
    """NVIDIA's ``seed`` (what LiveKit's PersonaPlex plugin sends): sampled output, the same for the same seed
    and input, whatever the batch; another seed gives other output."""
    handle = await virtual_server(engine, slots=2)
    served = {}

    async def talk(name, seed):
        served[name] = (await raw_conversation(handle, speech_frames, persona=HOST, voice="NATM0.pt", seed=seed))[0]

    async with trio.open_nursery() as nursery:  # side by side, each in its own slot
        nursery.start_soon(talk, "first", 42)
        nursery.start_soon(talk, "second", 42)
    seeded = Conversation(persona=HOST, voice="NATM0.pt", sampling=Sampling(text_seed=42, audio_seed=42))
    for name in ("first", "second"):
        got = served[name]
        runs = [direct_run(engine, seeded, speech_frames, lead) for lead in range(3)]
        assert any(np.array_equal(got, run[: len(got)]) for run in runs), f"{name}: not the seeded engine's output"
    other = Conversation(persona=HOST, voice="NATM0.pt", sampling=Sampling(text_seed=43, audio_seed=43))
    assert not any(
        np.array_equal(served["first"], direct_run(engine, other, speech_frames, lead)[: len(served["first"])])
        for lead in range(3)
    )
