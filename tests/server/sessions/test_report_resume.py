"""A call's report across a resume (``_report.py``): one quality meter, one caller transcript, one record for the
whole conversation, the outage a gap in them; a report nobody resumes ends once, as the drop ended it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import trio

from pplex_trio._conversation import Conversation, Outcome
from pplex_trio._metrics import Metrics
from pplex_trio.engine import OutputFrame
from pplex_trio.server.records._recorder import Recorder
from pplex_trio.server.sessions._report import CallEnd, CallReport
from pplex_trio.server.sessions._transcript import CallerTranscript

FRAME = 1920
LOUD = np.full(FRAME, 0.1, np.float32)  # -20 dB FS: speech to the meter
QUIET = np.zeros(FRAME, np.float32)


def _frame(tick: int, caller: bool, agent: bool, words: str | None = None) -> OutputFrame:
    return OutputFrame(
        pcm=LOUD if agent else QUIET, text=None, tick=tick, heard=LOUD if caller else QUIET, heard_text=words
    )


def _report(tmp_path) -> CallReport:
    report = CallReport(7, Metrics(), CallerTranscript(0.0))
    report.recorder = Recorder(
        "r",
        tmp_path,
        protocol="raw",
        conversation=Conversation(),
        limiter=trio.CapacityLimiter(1),
        metrics=Metrics(),
        on_done=lambda _: None,
    )
    return report


def _end(outcome: Outcome = Outcome.CLIENT_CLOSED) -> CallEnd:
    return CallEnd("session 7 (raw)", outcome, None, None, {"frames_sent": 13})


def test_the_outage_is_a_gap_no_response_is_measured_across_and_the_callers_words_move_past_it(tmp_path):
    report = _report(tmp_path)
    for k in range(13):  # the caller speaks 0-9 (a word at frame 2), then is silent: the connection drops
        report.on_frame(_frame(k, caller=k < 10, agent=False, words=" hello" if k == 2 else None))
    report.park(100.0, _end())
    report.resumed(104.0)  # 4 s later: 50 frames on the record's timeline
    for k in range(20):  # model frames 13-32 (ticks went on meanwhile); a word at 15; the agent speaks from 16
        report.on_frame(_frame(200 + k, caller=False, agent=k >= 3, words=" again" if k == 2 else None))
    report.finish_quality()
    stats = report.quality.statistics()
    assert stats.response_latencies == ()  # the caller ended before the outage, the agent began after it
    assert stats.dead_air_s == pytest.approx(6 * 0.08)  # frames 10-15: the outage is none of it
    ending = report.call_ending(Outcome.COMPLETED, 1000, None, {"frames_sent": 20})
    words = {w["text"]: w["start"] for w in ending.details["caller"]["words"]}
    assert words == {"hello": pytest.approx(2 * 0.08), "again": pytest.approx(15 * 0.08 + 4.0)}
    assert report.frames_sent_before == 13  # (the dropped connection's, for the record's frames_sent)


def test_a_parked_report_nobody_resumes_ends_once_as_the_drop_ended_it(tmp_path, caplog):
    finished = []

    class Store:
        def finish_later(self, recorder, ending):
            finished.append((recorder, ending))

    report = _report(tmp_path)
    report.records = Store()
    for k in range(5):
        report.on_frame(_frame(k, caller=True, agent=False))
    report.park(10.0, _end(Outcome.CLIENT_TIMEOUT))
    with caplog.at_level(logging.INFO):
        report.lapsed()
    ((recorder, ending),) = finished
    assert recorder is report.recorder and ending.outcome is Outcome.CLIENT_TIMEOUT
    assert [r.getMessage().split(" (")[0:2] for r in caplog.records if "ended" in r.getMessage()] == [
        ["session 7", "raw) ended: client_timeout"]
    ]
    with pytest.raises(AssertionError):  # once: it is no longer parked
        report.lapsed()
