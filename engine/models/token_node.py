"""A token-generating node: a prefill walk, then a decode loop, and its stop declarations.

The decode loop declares a stop policy (EOS, with the loop's cap as its budget, or AR), so
the runtime decides decode stops itself; the prefill walk keeps the model's `check_stop`,
which may end the partition: a stop token sampled at prefill ends the reply, and
max_tokens counts the prefill's token. A subclass names its node (`graph`) and its policy.
"""

from __future__ import annotations

from engine.runtime.graph import GraphSpec, NodeSubmodule, StopCheck, StopRows
from engine.runtime.stops import StopKind, StopPolicy

DECODE_LOOP = "decode_loop"


def token_graph(node: str) -> GraphSpec:
    return GraphSpec(node=node, walks=("prefill", "decode"), loops={DECODE_LOOP: "decode"})


class TokenNode(NodeSubmodule):
    default_policy = StopKind.EOS

    def __init__(self, eos_token_ids: list[int], policy_kind: StopKind | None = None):
        self.eos_token_ids = tuple(eos_token_ids)
        self.policy_kind = policy_kind or self.default_policy

    def get_stop_policies(self, walk: str) -> dict[str, StopPolicy] | None:
        if walk == "decode":
            return {DECODE_LOOP: StopPolicy(self.policy_kind, token_column="new_token")}
        return None

    def get_loop_caps(self, max_tokens: int) -> dict[str, int]:
        # The prefill samples the first output token; the loop samples the rest.
        return {DECODE_LOOP: max_tokens - 1}

    def check_stop(self, rows: StopRows) -> StopCheck:
        """The model's own per-row check: EOS unless ignore_eos, then max_tokens."""
        count = len(rows.rids)
        check = StopCheck.none(count)
        eos = set(self.eos_token_ids)
        for i in range(count):
            by_token = not rows.ignore_eos[i] and int(rows.tokens[i]) in eos
            stopped = by_token or rows.output_counts[i] >= rows.max_tokens[i]
            check.stopped[i] = stopped
            check.by_token[i] = by_token
            check.end_partition[i] = stopped and rows.walks[i] == "prefill"
        return check
