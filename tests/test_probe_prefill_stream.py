"""benchmarks/probe_prefill_stream.py: staggered prefill-stream runs grouped by the steps they
took; exit 1 when two runs of the same steps gave different tokens."""

from __future__ import annotations

from benchmarks import probe_prefill_stream as probe


def test_the_same_steps_on_a_cpu_give_the_same_tokens(capsys):
    """Tiny on the CPU (one stream: the prefill lane is the engine's own): two runs, the same
    steps, the same tokens, exit 0; `--serial` runs too."""
    assert probe.main(["--size", "tiny", "--device", "cpu", "--runs", "2", "--tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "run 2 against run 1: the same tokens" in out
    assert "1 step sequences over 2 runs; 0 same-steps pairs" in out
    argv = ["--size", "tiny", "--device", "cpu", "--runs", "1", "--tokens", "4", "--serial"]
    assert probe.main(argv) == 0
    assert "no two of 1 runs took the same steps" in capsys.readouterr().out


def test_runs_of_the_same_steps_that_part_exit_1_naming_where(monkeypatch, capsys):
    runs = iter([
        ((1, 2), {0: [5, 6, 7], 1: [1, 2, 3]}),
        ((1, 3), {0: [5, 6, 7], 1: [1, 2, 3]}),  # other steps: not compared
        ((1, 2), {0: [5, 6, 8], 1: [1, 2, 3]}),
    ])  # fmt: skip
    monkeypatch.setattr(probe, "run_once", lambda *args: next(runs))
    assert probe.main(["--runs", "3"]) == 1
    out = capsys.readouterr().out
    assert "run 3 against run 1: different tokens: request 0 from token 2" in out
    assert "2 step sequences over 3 runs; 1 same-steps pairs with different tokens" in out
