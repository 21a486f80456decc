"""What `bench run` says on a CPU before and during its run: the processes' cores, and how
long a deciding run would take here (docs/STATISTICS.md, "Noise on a CPU")."""

from __future__ import annotations

from harness.analysis.block_model import MAX_BLOCKS
from harness.analysis.deciding import DecidingEstimate
from harness.analysis.verdict import Rule

OUT_OF_REACH_BLOCKS = 12  # past this a run is an hour or more on 2 cores: find the noise


def _cores(cores: list[int]) -> str:
    return ("core " if len(cores) == 1 else "cores ") + ",".join(map(str, cores))


def layout_text(layout: dict[str, list[int]]) -> str:
    """`cpu layout: worker on core 1, API server on core 0, load generator on core 0`, from the
    layout as the manifest records it (`CpuLayout.manifest`)."""
    return (
        f"cpu layout: worker on {_cores(layout['worker'])}, API server on"
        f" {_cores(layout['api'])}, load generator on {_cores(layout['client'])}"
    )


def estimate_text(estimate: DecidingEstimate, rule: Rule) -> str:
    """One line: the first block's servers' spread and the run that would decide here."""
    noise = (
        f"this machine, first block: {estimate.servers} servers' output tok/s spread"
        f" {estimate.spread:.1%} (max/min - 1, a server's sd {estimate.sd:.1%}; rough: one"
        " block)"
    )
    if estimate.blocks is None:
        return f"{noise}; too few servers to say how many blocks would decide"
    minutes = estimate.seconds / 60
    if estimate.blocks > OUT_OF_REACH_BLOCKS:
        about = "at least" if estimate.blocks >= MAX_BLOCKS else "about"  # the search's cap
        return (
            f"{noise}; deciding within +-{rule.margin:.0%} would take {about} {estimate.blocks}"
            f" blocks (~{minutes:.0f} min): out of reach; find the noise first"
            " (docs/STATISTICS.md, Noise on a CPU)"
        )
    return (
        f"{noise}; a run that decides within +-{rule.margin:.0%} takes about"
        f" {estimate.blocks} blocks here (~{minutes:.1f} min at {estimate.block_s:.0f} s a block)"
    )
