"""Client settings: the official client's query string and the raw open message."""

import pytest

from pplex_trio.engine import Sampling
from pplex_trio.protocol import CloseCode, ProtocolError, conversation_from_params, parse_query

# Exactly what the official PersonaPlex client sends (docs/PROTOCOL.md), in its order.
OFFICIAL_QUERY = (
    "text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0"
    "&text_seed=123456&audio_seed=654321&repetition_penalty_context=64&repetition_penalty=1.0"
    "&text_prompt=You+enjoy+having+a+good+conversation.&voice_prompt=NATF2.pt"
    "&worker_auth_id=abc&email=a%40b.c"
)


def conv(query, limit=1000):
    return conversation_from_params(parse_query(query), max_prompt_chars=limit)


def test_official_query_is_accepted_and_decoded():
    c = conv(OFFICIAL_QUERY)
    assert c.persona == "You enjoy having a good conversation."
    assert c.voice == "NATF2.pt"
    s = c.sampling
    assert (s.text_temperature, s.text_topk, s.audio_temperature, s.audio_topk) == (0.7, 25, 0.8, 250)
    assert (s.text_seed, s.audio_seed) == (123456, 654321)
    assert (s.repetition_penalty_context, s.repetition_penalty, s.pad_mult) == (64, 1.0, 0.0)


def test_empty_query_gives_client_defaults():
    c = conv("")
    assert c.persona == "" and c.voice is None
    assert c.sampling == Sampling()


def test_unknown_parameters_are_ignored():
    assert conv("image_url=x&image_resolution=224&foo=bar").sampling == Sampling()


def test_bytes_query_and_percent_encoding():
    c = conversation_from_params(parse_query(b"text_prompt=caf%C3%A9%20au+lait"), max_prompt_chars=100)
    assert c.persona == "café au lait"


def test_raw_open_names_and_json_numbers():
    c = conversation_from_params(
        {"persona": "p", "voice": "V.pt", "text_topk": 5, "audio_temperature": 0.5}, max_prompt_chars=10
    )
    assert (c.persona, c.voice, c.sampling.text_topk, c.sampling.audio_temperature) == ("p", "V.pt", 5, 0.5)


@pytest.mark.parametrize(
    "query, name",
    [
        ("text_temperature=hot", "text_temperature"),
        ("text_temperature=nan", "text_temperature"),
        ("text_temperature=inf", "text_temperature"),
        ("text_temperature=-0.1", "text_temperature"),
        ("audio_temperature=1e9", "audio_temperature"),
        ("text_topk=0", "text_topk"),
        ("text_topk=2.5", "text_topk"),
        ("audio_topk=-3", "audio_topk"),
        ("audio_topk=lots", "audio_topk"),
        ("text_seed=1.5", "text_seed"),
        ("audio_seed=99999999999999999999999", "audio_seed"),
        ("seed=forty-two", "seed"),
        ("repetition_penalty=0", "repetition_penalty"),
        ("repetition_penalty_context=-1", "repetition_penalty_context"),
        ("pad_mult=nan", "pad_mult"),
    ],
)
def test_bad_sampling_values_name_the_parameter(query, name):
    with pytest.raises(ProtocolError) as info:
        conv(query)
    assert info.value.code == CloseCode.POLICY
    assert name in info.value.message


@pytest.mark.parametrize("value", [True, [1], {"a": 1}])
def test_json_values_of_the_wrong_type(value):
    with pytest.raises(ProtocolError):
        conversation_from_params({"text_topk": value}, max_prompt_chars=10)


def test_nvidia_seed_seeds_text_and_audio_unless_they_have_their_own():
    # LiveKit's PersonaPlex plugin sends what NVIDIA's server reads: voice_prompt, text_prompt, seed.
    livekit = conv("voice_prompt=NATF2.pt&text_prompt=You%20are%20a%20helpful%20assistant.&seed=42")
    assert (livekit.sampling.text_seed, livekit.sampling.audio_seed) == (42, 42)
    assert livekit.persona == "You are a helpful assistant." and livekit.voice == "NATF2.pt"
    own = conv("seed=42&audio_seed=7").sampling
    assert (own.text_seed, own.audio_seed) == (42, 7)
    assert conv("seed=-1").sampling == Sampling()  # NVIDIA's "no seed"


def test_blank_values_mean_default():
    assert conv("text_topk=&text_seed=").sampling == Sampling()


def test_persona_over_the_limit():
    conv("text_prompt=" + "a" * 20, limit=20)
    with pytest.raises(ProtocolError) as info:
        conv("text_prompt=" + "a" * 21, limit=20)
    assert info.value.code == CloseCode.POLICY
    assert "20" in info.value.message


@pytest.mark.parametrize(
    "voice", ["../NATF0.pt", "..", ".", "a/b.pt", "a\\b.pt", "/etc/passwd", ".hidden.pt", "x\x00.pt", "v" * 300]
)
def test_voice_must_be_a_bare_name(voice):
    with pytest.raises(ProtocolError) as info:
        conversation_from_params({"voice_prompt": voice}, max_prompt_chars=10)
    assert info.value.code == CloseCode.POLICY
    assert "voice" in info.value.message


def test_repeated_parameter_last_wins():
    assert conv("text_topk=3&text_topk=7").sampling.text_topk == 7


def test_invalid_utf8_query():
    with pytest.raises(ProtocolError):
        parse_query(b"text_prompt=\xff\xfe")
    with pytest.raises(ProtocolError):
        parse_query("text_prompt=%ff%fe")


# -- one check per setting, for every protocol --------------------------------------------------


@pytest.mark.parametrize(
    "persona, voice, words, kind",
    [
        ("x" * 51, None, "has 51 characters; this server's limit is 50", "string_above_max_length"),
        ("a\x00b", None, "must not contain NUL characters", "invalid_value"),
        (7, None, "must be a string", "invalid_value"),
        (None, "../etc/passwd", "is not a voice name", "invalid_value"),
        (None, "NOBODY.pt", "unknown", "invalid_value"),
        (None, 3, "must be a string", "invalid_value"),
    ],
)
def test_a_bad_persona_or_voice_gets_the_same_answer_on_every_protocol(persona, voice, words, kind):
    """The official client's query, the raw open message and a Realtime session.update: one check each."""
    from pplex_trio.protocol._realtime import EventError, SessionConfig, apply_session_update

    voices = ["NATF0.pt", "Mine.pt"]
    answers = []
    for names in (("text_prompt", "voice_prompt"), ("persona", "voice")):  # /api/chat, /v1/audio/duplex
        params = {k: v for k, v in zip(names, (persona, voice)) if v is not None}
        with pytest.raises(ProtocolError) as info:
            conversation_from_params(params, max_prompt_chars=50, voices=voices)
        assert info.value.code == CloseCode.POLICY and info.value.param == names[persona is None]
        answers.append((info.value.message.replace(info.value.param, "PARAM", 1), info.value.kind))
    session = {"instructions": persona} if persona is not None else {"voice": voice}
    try:  # (a bad voice alone is reported beside the rest of the update, applied)
        error = apply_session_update(
            SessionConfig(), session, started=False, max_prompt_chars=50, voices=lambda: voices
        )[1]
    except EventError as exc:
        error = exc
    param = "session.instructions" if persona is not None else "session.voice"
    assert error is not None and error.param == param
    message = error.message.split("; OpenAI's voice names")[0]  # (Realtime adds the names it also takes)
    answers.append((message.replace(param, "PARAM", 1), error.code))
    assert len(set(answers)) == 1 and words in answers[0][0] and answers[0][1] == kind


def test_an_added_voice_is_a_voice_and_a_listed_one_is_taken():
    c = conversation_from_params({"voice_prompt": " Mine.pt "}, max_prompt_chars=50, voices=["Mine.pt"])
    assert c.voice == "Mine.pt"
    assert conversation_from_params({"voice": "Any.pt"}, max_prompt_chars=50).voice == "Any.pt"  # (unchecked)


def test_setting_names_are_every_name_the_validator_reads():
    """What a Moshi resume reports as ignored settings: exactly the names :func:`conversation_from_params` looks at."""
    from pplex_trio.protocol import SETTING_NAMES

    read: set[str] = set()

    class Watched(dict):
        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)

        def __getitem__(self, key):
            read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            read.add(key)
            return super().__contains__(key)

    conversation_from_params(Watched(), max_prompt_chars=100)
    assert read == SETTING_NAMES
