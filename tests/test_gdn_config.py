"""The split Gated DeltaNet kernel's launch configuration (engine/config/gdn_split.py): the
default is the H200 sweep's winner and the legacy launch stays nameable, a bad field fails loudly, text round-trips,
and the sweep holds legal, distinct configs. (That each compiles for sm_90:
tests/test_triton_compile.py; that the options compute the reference's result:
tests/test_triton_interpret.py.)"""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.config.gdn_split import (
    SPLIT_DEFAULT,
    SPLIT_FROM_TOKENS,
    SplitConfig,
    parse_split_config,
)
from engine.kernels.gdn_config import SPLIT_LEGACY, SWEEP_AXES, combine_winners, split_sweep
from engine.kernels.gdn_tables import CHUNK


def test_the_default_is_the_h200_sweep_winner_and_the_legacy_launch_is_kept():
    assert SPLIT_DEFAULT.chunk == SPLIT_LEGACY.chunk == CHUNK == 32  # the captured tables'
    assert (SPLIT_DEFAULT.states_bv, SPLIT_DEFAULT.outputs_bv) == (32, 64)
    assert SPLIT_DEFAULT.launch("states") == {"num_warps": 2, "num_stages": 1}
    assert SPLIT_DEFAULT.fixed_states_rows == 4 and SPLIT_DEFAULT.scores_in_prepare
    assert str(SPLIT_DEFAULT) == "default"
    assert (SPLIT_LEGACY.states_bv, SPLIT_LEGACY.outputs_bv) == (16, 16)
    for kernel in ("prepare", "states", "outputs"):  # Triton's defaults for a launch
        assert SPLIT_LEGACY.launch(kernel) == {"num_warps": 4, "num_stages": 3}
    assert SPLIT_LEGACY.fixed_states_rows is None and not SPLIT_LEGACY.scores_in_prepare
    assert parse_split_config(str(SPLIT_LEGACY)) == SPLIT_LEGACY  # nameable as a bench arm


def test_the_engines_auto_threshold_is_the_kernels():
    """engine.gdn_split_from_tokens's default is SPLIT_FROM_TOKENS, written once
    (engine/config/gdn_split.py), where the kernels' `auto` reads it too."""
    assert EngineConfig().gdn_split_from_tokens == SPLIT_FROM_TOKENS == 256


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"chunk": 48}, "chunk"),
        ({"chunk": 128}, "chunk"),
        ({"states_bv": 12}, "states_bv"),
        ({"outputs_warps": 3}, "outputs_warps"),
        ({"prepare_stages": 0}, "prepare_stages"),
        ({"fixed_chunks": 0}, "fixed_chunks"),
        ({"chunk": 64, "states_warps": 8}, "chunk 64 with states_warps >= 8"),
    ],
)
def test_an_illegal_field_fails_loudly(fields, message):
    with pytest.raises(ValueError, match=message):
        SplitConfig(**fields)


def test_text_round_trips_and_bad_text_says_what_is_wrong():
    for config in split_sweep():
        assert parse_split_config(str(config)) == config
    assert parse_split_config("") == parse_split_config("default") == SPLIT_DEFAULT
    config = parse_split_config("chunk=64, fixed_states_rows=none,scores_in_prepare=false")
    assert config == SplitConfig(chunk=64, fixed_states_rows=None, scores_in_prepare=False)
    with pytest.raises(ValueError, match="unknown split config field 'warps'"):
        parse_split_config("warps=8")
    with pytest.raises(ValueError, match="whole number"):
        parse_split_config("chunk=big")
    with pytest.raises(ValueError, match="true or false"):
        parse_split_config("scores_in_prepare=maybe")


def test_the_sweep_starts_at_the_default_and_tries_every_axis_value_alone():
    configs = split_sweep()
    assert configs[:2] == [SPLIT_DEFAULT, SPLIT_LEGACY] and len(set(configs)) == len(configs)
    for axis, values in SWEEP_AXES.items():
        for value in values:
            assert SplitConfig(**{axis: value}) in configs, (axis, value)
    assert all(config.chunk == 32 for config in split_sweep(chunk=32))


def test_combine_winners_joins_the_changed_fields():
    winners = [SplitConfig(states_warps=8), SplitConfig(fixed_chunks=None), SplitConfig()]
    assert combine_winners(winners) == SplitConfig(states_warps=8, fixed_chunks=None)
    assert combine_winners([]) == SPLIT_DEFAULT
    assert combine_winners([SplitConfig(chunk=64), SplitConfig(outputs_warps=8)]) is None
