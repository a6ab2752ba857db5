"""Scheduler: slots in arrival order, foreground before background, chunked prefill plans."""

from __future__ import annotations

from generation.engine.scheduler import Scheduler
from generation.engine.sequence import Sequence
from generation.handle import LoopHandle
from generation.params import SamplingParams
from generation.stats import GenerationStats


def _seq(request_id: int, prompt_len: int, background: bool = False) -> Sequence:
    return Sequence(
        request_id=request_id,
        prompt=list(range(1, prompt_len + 1)),
        params=SamplingParams(max_new_tokens=8),
        handle=LoopHandle(),
        budget=8,
        generator=None,
        stats=GenerationStats(method="draft_model", num_speculative_tokens=4),
        background=background,
    )


def _scheduler(**kwargs: object) -> Scheduler:
    return Scheduler(4, 512, lambda src, dst: None, **kwargs)  # type: ignore[arg-type]


def test_foreground_requests_are_admitted_before_background_ones() -> None:
    scheduler = Scheduler(2, 512, lambda src, dst: None)
    b1, f1, b2, f2 = _seq(0, 5, True), _seq(1, 5), _seq(2, 5, True), _seq(3, 5)
    for seq in (b1, f1, b2, f2):
        scheduler.add(seq)
    assert scheduler.admit() == [f1, f2]  # two slots: both foreground, in arrival order
    scheduler.release(f1)
    scheduler.release(f2)
    assert scheduler.admit() == [b1, b2]


def test_background_prompts_are_prefilled_in_short_chunks() -> None:
    scheduler = _scheduler(background_chunk=128)
    background, foreground = _seq(0, 300, True), _seq(1, 300)
    scheduler.add(background)
    scheduler.admit()
    assert [(s.request_id, n) for s, n in scheduler.prefill_plan()] == [(0, 128)]
    scheduler.add(foreground)
    scheduler.admit()
    # Without pausing, both share the step's budget; the background one only a short chunk.
    assert [(s.request_id, n) for s, n in scheduler.prefill_plan()] == [(0, 128), (1, 300)]


def test_paused_background_rows_take_no_prefill_or_decode_while_foreground_runs() -> None:
    scheduler = _scheduler(pause_background=True, background_chunk=128)
    background, foreground = _seq(0, 300, True), _seq(1, 50)
    scheduler.add(background)
    scheduler.admit()
    background.prefilled = 128
    scheduler.add(foreground)
    scheduler.admit()
    assert [(s.request_id, n) for s, n in scheduler.prefill_plan()] == [(1, 50)]
    foreground.prefilled = 50
    assert scheduler.decoding() == [foreground]
    foreground.finished = True  # it leaves: the background request goes on where it stopped
    assert [(s.request_id, n) for s, n in scheduler.prefill_plan()] == [(0, 128)]


def test_a_background_row_paused_too_long_takes_part_in_the_next_step() -> None:
    scheduler = _scheduler(pause_background=True, max_background_pause=5.0)
    background, foreground = _seq(0, 10, True), _seq(1, 10)
    for seq in (background, foreground):
        scheduler.add(seq)
    scheduler.admit()
    background.prefilled = foreground.prefilled = 10
    assert scheduler.decoding() == [foreground]  # paused: it stepped (joined) just now
    background.last_step -= 6.0  # six seconds without a step: due
    assert scheduler.decoding() == [foreground, background]


def test_release_keeps_requests_whose_prompt_is_in_on_the_lowest_slots() -> None:
    moves: list[tuple[int, int]] = []
    scheduler = Scheduler(4, 512, lambda src, dst: moves.append((src, dst)))
    a, b, c, d = (_seq(i, 10) for i in range(4))
    for seq in (a, b, c, d):
        scheduler.add(seq)
    scheduler.admit()
    a.prefilled = b.prefilled = c.prefilled = 10  # d (slot 3) is still being prefilled
    d.prefilled = 4
    scheduler.release(a)
    # c (prompt in) takes slot 0, d takes c's slot 2: the decoding rows stay slots 0 .. 1.
    assert moves == [(2, 0), (3, 2)]
    assert scheduler.running == [c, b, d] and [s.slot for s in scheduler.running] == [0, 1, 2]
    assert [s.slot for s in scheduler.decoding()] == [0, 1]
    assert a.slot == -1
    moves.clear()
    d.prefilled = 10
    scheduler.release(c)  # the last one has its prompt in: one move, as before
    assert moves == [(2, 0)] and scheduler.running == [d, b]
    moves.clear()
    e = _seq(4, 10)
    scheduler.add(e)
    scheduler.admit()  # e (slot 2) prefilling, and no request above slot 2 to take it
    scheduler.release(e)
    assert moves == [] and scheduler.running == [d, b]
