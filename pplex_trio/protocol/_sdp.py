"""A WebRTC call's SDP offer, checked before any WebRTC stack sees it (issue 49 §6): what the call needs from it
(the audio m-line carrying Opus 48000/2, whether the ``oai-events`` data channel can be opened), or the 400 a
bad one is told: not SDP, too large, no audio m-line, audio without Opus.

Sans-IO and dependency-free: a small reader of the SDP grammar (RFC 8866: ``<type>=<value>`` lines, a session
section, then one section per ``m=`` line), enough to check an offer; the WebRTC stack parses it whole later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ._errors import EventError

__all__ = ["MAX_OFFER_BYTES", "AudioOffer", "CallOffer", "check_offer"]

# An offer from a browser is a few kilobytes (Chromium's with audio, video and a data channel: about 6 KiB).
MAX_OFFER_BYTES = 64 * 1024

_DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_DATA_CHANNEL = "webrtc-datachannel"


@dataclass(frozen=True)
class AudioOffer:
    """The offer's audio m-line: its ``mid``, the payload type it gives Opus 48000/2 and that payload's ``fmtp``
    parameters (``useinbandfec``, ``stereo``...), and its direction, the caller's view."""

    mid: str | None
    payload_type: int
    fmtp: Mapping[str, str] = field(default_factory=dict)
    direction: str = "sendrecv"

    @property
    def inband_fec(self) -> bool:
        """Whether the caller offers Opus in-band FEC (``useinbandfec=1``), which lets a lost packet be rebuilt
        from the next one."""
        return self.fmtp.get("useinbandfec") == "1"


@dataclass(frozen=True)
class CallOffer:
    """What a call needs from an acceptable offer: its audio, and whether (and on which ``mid``) it offers an
    SCTP data channel for the events."""

    audio: AudioOffer
    data_channel: bool
    data_mid: str | None = None


@dataclass
class _Section:
    media: str
    port: int
    proto: str
    formats: list[str]
    attributes: list[tuple[str, str]] = field(default_factory=list)

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.attributes if key == name]

    def flag(self, name: str) -> bool:
        return any(key == name for key, _ in self.attributes)


def _refuse(message: str, code: str = "invalid_value") -> EventError:
    return EventError(message, param="sdp", code=code)


def check_offer(body: bytes | str, *, max_bytes: int = MAX_OFFER_BYTES) -> CallOffer:
    """What the call needs from ``body``, an SDP offer; raises :class:`EventError` (``param`` "sdp", a 400) for
    one that is not SDP, is larger than ``max_bytes``, has no audio m-line, or no Opus 48000/2 on it."""
    raw = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else body
    if len(raw) > max_bytes:
        raise _refuse(f"the SDP offer is larger than {max_bytes} bytes", code="string_above_max_length")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse("the SDP offer is not UTF-8 text") from None
    session, sections = _parse(text)
    audio_sections = [section for section in sections if section.media == "audio" and _offered(section)]
    if not audio_sections:
        raise _refuse("the SDP offer has no audio m-line: a call needs the caller's audio")
    _check_transport(session, audio_sections[0])
    audio = _audio(audio_sections[0])
    data = next((section for section in sections if _is_data_channel(section) and _offered(section)), None)
    return CallOffer(
        audio=audio,
        data_channel=data is not None,
        data_mid=_first(data.values("mid")) if data is not None else None,
    )


def _parse(text: str) -> tuple[_Section, list[_Section]]:
    """The session section (as a pseudo-section) and each media section, or the "not SDP" refusal."""
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line]
    if not lines or lines[0] != "v=0":
        raise _refuse("the body is not an SDP offer (it must begin with v=0)")
    session = _Section("session", 0, "", [])
    sections: list[_Section] = []
    current = session
    for line in lines[1:]:
        if len(line) < 2 or line[1] != "=" or not line[0].isalpha() or not line.isprintable():
            raise _refuse("the body is not an SDP offer (every line must be <type>=<value>)")
        kind, value = line[0], line[2:]
        if kind == "m":
            current = _media_line(value)
            sections.append(current)
        elif kind == "a":
            name, _, attribute = value.partition(":")
            current.attributes.append((name, attribute))
    return session, sections


def _media_line(value: str) -> _Section:
    parts = value.split()
    if len(parts) < 4:
        raise _refuse(f"the SDP offer has a malformed m-line: m={value}")
    media, port, proto, *formats = parts
    port_number = port.split("/")[0]
    if not port_number.isdigit():
        raise _refuse(f"the SDP offer has a malformed m-line: m={value}")
    return _Section(media, int(port_number), proto, formats)


def _offered(section: _Section) -> bool:
    # Port 0 turns a section down, but a bundled section (RFC 8843) rides on another's port.
    return section.port != 0 or section.flag("bundle-only")


def _is_data_channel(section: _Section) -> bool:
    if section.media != "application":
        return False
    if "SCTP" in section.proto and _DATA_CHANNEL in section.formats:
        return True  # the current form (RFC 8841): m=application 9 UDP/DTLS/SCTP webrtc-datachannel
    # the older form: m=application 9 DTLS/SCTP 5000 with a=sctpmap:5000 webrtc-datachannel 1024
    return any(_DATA_CHANNEL in value.split() for value in section.values("sctpmap"))


def _check_transport(session: _Section, audio: _Section) -> None:
    """A WebRTC offer must say how to reach and secure it: ICE credentials and a DTLS fingerprint, on the media
    section or the session."""
    for name in ("ice-ufrag", "ice-pwd", "fingerprint"):
        if not audio.values(name) and not session.values(name):
            raise _refuse(f"the SDP offer's audio has no a={name}: it is not a WebRTC offer")
    if "RTP" not in audio.proto:
        raise _refuse(f"the SDP offer's audio is not carried over RTP ({audio.proto})")


def _audio(section: _Section) -> AudioOffer:
    opus: int | None = None
    for value in section.values("rtpmap"):
        payload, _, encoding = value.partition(" ")
        name, _, rest = encoding.strip().partition("/")
        if name.lower() == "opus" and rest == "48000/2" and payload.isdigit() and payload in section.formats:
            opus = int(payload)
            break
    if opus is None:
        offered = sorted({v.partition(" ")[2].strip() for v in section.values("rtpmap")} - {""}) or section.formats
        raise _refuse(
            f"the SDP offer's audio has no Opus 48000/2, the one codec this server takes (offered: "
            f"{', '.join(offered)})"
        )
    fmtp: dict[str, str] = {}
    for value in section.values("fmtp"):
        payload, _, parameters = value.partition(" ")
        if payload == str(opus):
            for pair in parameters.split(";"):
                key, _, setting = pair.strip().partition("=")
                if key:
                    fmtp[key] = setting
    direction = next((name for name in _DIRECTIONS if section.flag(name)), "sendrecv")
    if direction == "inactive":
        raise _refuse("the SDP offer's audio is inactive: a call needs the caller's audio")
    return AudioOffer(mid=_first(section.values("mid")), payload_type=opus, fmtp=fmtp, direction=direction)


def _first(values: list[str]) -> str | None:
    return values[0] if values else None
