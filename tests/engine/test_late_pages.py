"""LatePages: a tick's misses count as late pages only once the page came after all."""

import dataclasses

from pplex_trio.engine._late_pages import LatePages

TICK = 0.080


@dataclasses.dataclass(eq=False)
class FakeLease:
    last_input_arrival: float


def test_a_miss_whose_page_came_within_a_tick_is_late():
    late = LatePages(TICK)
    jittery, stopped, paused = FakeLease(0.95), FakeLease(0.95), FakeLease(0.95)
    assert late.confirm([jittery, stopped, paused], now=1.0) == 0  # judged at the next tick
    jittery.last_input_arrival = 1.03  # its page, 30 ms after the tick that missed it
    paused.last_input_arrival = 1.20  # back after a pause longer than a tick
    assert late.confirm([], now=1.08) == 1  # and the stopped one never sent again


def test_each_tick_is_judged_once_and_a_restart_forgets():
    late = LatePages(TICK)
    lease = FakeLease(0.95)
    late.confirm([lease], now=1.0)
    lease.last_input_arrival = 1.01
    assert late.confirm([], now=1.08) == 1
    assert late.confirm([], now=1.16) == 0
    late.confirm([lease], now=2.0)
    late.forget()
    lease.last_input_arrival = 2.01
    assert late.confirm([], now=2.08) == 0
