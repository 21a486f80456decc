"""benchmarks/bench_state_accuracy.py on the CPU (tiny, fp32 model): its runs and measures."""

from __future__ import annotations

import math

import pytest

from benchmarks.bench_state_accuracy import (
    _engine,
    agreement_by_band,
    agreement_by_margin,
    first_difference,
    greedy,
    main,
    measure,
)

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7]]


def test_teacher_forcing_feeds_the_forced_tokens_and_an_identical_run_agrees_everywhere():
    reference = greedy(_engine("tiny", "float32", 3), PROMPTS, 20).tokens
    assert all(len(t) == 20 for t in reference.values())
    again = greedy(_engine("tiny", "float32", 3), PROMPTS, 20, forced=reference)
    assert again.tokens == reference  # the same engine, its own tokens forced: nothing differs
    # Forcing another request's tokens changes what the model sees, so its choices follow
    # that context, not its own free run.
    swapped = {0: reference[1] + reference[1], 1: reference[0], 2: reference[2]}
    moved = greedy(_engine("tiny", "float32", 3), PROMPTS, 20, forced=swapped).tokens
    assert moved[0] != reference[0] and moved[2] == reference[2]


def test_each_margin_is_its_own_requests_top_two_gap_and_recording_keeps_the_choices():
    batched = greedy(_engine("tiny", "float32", 3), PROMPTS, 12, margins=True)
    plain = greedy(_engine("tiny", "float32", 3), PROMPTS, 12)
    assert batched.tokens == plain.tokens and plain.margins is None
    # Each request alone, forced along its batched choices: its margins are its own (a batch
    # of 1 has no row order to get wrong), so margins filed under another request's id
    # would differ by far more than the batch's summation order moves a logit.
    for rid, prompt in enumerate(PROMPTS):
        forced = {0: batched.tokens[rid]}
        alone = greedy(_engine("tiny", "float32", 1), [prompt], 12, forced, margins=True)
        assert alone.margins[0] == pytest.approx(batched.margins[rid], abs=1e-4), rid
    assert all(m >= 0 for row in batched.margins.values() for m in row)


def test_measure_reports_a_16_bit_state_against_fp32_by_position_by_margin_and_the_floor():
    result = measure("tiny", requests=3, prompt=8, tokens=70, state_dtype="float16")
    assert result["free_identical"] in range(4)
    assert set(result["forced_agreement"]) == {"0-64", "64-128"}
    assert all(0.0 <= v <= 1.0 for v in result["forced_agreement"].values())
    # fp32 state with one more request in the batch, forced along the reference: only
    # summation order may differ, so near-ties alone may flip (a misaligned forcing would
    # agree about 1 time in the vocabulary's size).
    assert min(result["floor_agreement"].values()) >= 0.95, result
    by_margin = result["forced_agreement_by_margin"]
    assert list(by_margin) == ["0-0.05", "0.05-0.2", "0.2-1", "1-inf"]
    assert sum(b["positions"] for b in by_margin.values()) == 3 * 70
    assert math.isclose(sum(b["share"] for b in by_margin.values()), 1.0)
    # An fp16 state moves tiny's logits by ~0.02 (tests/test_qwen35_model.py): a choice the
    # reference leads by a whole logit cannot flip.
    assert by_margin["1-inf"]["positions"] > 0 and by_margin["1-inf"]["agreement"] == 1.0


def test_first_difference_and_bands():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    runs, ref = {0: [1] * 70}, {0: [1] * 64 + [2] * 6}
    assert agreement_by_band(runs, ref) == {"0-64": 1.0, "64-128": 0.0}


def test_agreement_by_margin_bands_the_references_positions():
    ref = {0: [1, 2, 3, 4], 1: [5, 6, 7, 8]}
    runs = {0: [1, 0, 3, 4], 1: [0, 6, 7, 8]}
    margins = {0: [0.0, 0.01, 0.5, 3.0], 1: [0.04, 0.1, 1.0, 0.3]}
    assert agreement_by_margin(runs, ref, margins) == {
        "0-0.05": {"share": 3 / 8, "positions": 3, "agreement": 1 / 3},
        "0.05-0.2": {"share": 1 / 8, "positions": 1, "agreement": 1.0},
        "0.2-1": {"share": 2 / 8, "positions": 2, "agreement": 1.0},
        "1-inf": {"share": 2 / 8, "positions": 2, "agreement": 1.0},
    }
    assert agreement_by_margin(runs, ref, {0: [2.0] * 4, 1: [2.0] * 4})["0-0.05"] == {
        "share": 0.0, "positions": 0, "agreement": None,
    }  # fmt: skip


def test_versus_runs_fp32_forced_with_one_setting_changed_and_reports_it_like_the_state():
    result = measure(
        "tiny", requests=3, prompt=8, tokens=40, state_dtype="float16",
        versus=("engine.prefill_hold_steps=2", "engine.dtype=bfloat16"),
    )  # fmt: skip
    held, bf16 = (
        result["versus"]["engine.prefill_hold_steps=2"],
        result["versus"]["engine.dtype=bfloat16"],
    )
    # A setting that moves no arithmetic agrees everywhere: the forcing lines up.
    assert held["forced_agreement"] == {"0-64": 1.0}
    assert all(b["agreement"] in (None, 1.0) for b in held["forced_agreement_by_margin"].values())
    # The model in bf16 rounds every activation: some choice flips, so the setting reached it.
    assert bf16["forced_agreement"]["0-64"] < 1.0
    assert sum(b["positions"] for b in bf16["forced_agreement_by_margin"].values()) == 3 * 40


def test_a_bad_versus_setting_is_one_line_before_any_engine(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--size", "tiny", "--versus", "engine.dense_kernel=cublas"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--versus engine.dense_kernel=cublas" in err and "dense_kernel" in err


def test_set_is_under_every_run_and_a_versus_goes_over_it():
    """`--set engine.dtype=bfloat16` makes every run bf16, the reference too: a versus of
    `engine.dtype=float32` then differs from the reference (were --set not under it, both would
    be the size's fp32 and agree everywhere, as the held-steps setting above does)."""
    result = measure(
        "tiny", requests=3, prompt=8, tokens=40, state_dtype="float16",
        versus=("engine.dtype=float32",), base="engine.dtype=bfloat16",
    )  # fmt: skip
    assert result["settings"] == "engine.dtype=bfloat16"
    assert result["versus"]["engine.dtype=float32"]["forced_agreement"]["0-64"] < 1.0


def test_a_bad_set_is_one_line_before_any_engine(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--size", "tiny", "--set", "engine.device=tpu"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--set engine.device=tpu" in err
