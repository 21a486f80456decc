"""Model building blocks and their CPU (torch) reference ops.

Each op that a device backend may replace (paged attention, the gated delta rule, the causal
conv, sampling) is a plain `torch_*` function with the layout of its FlashInfer /
flash-linear-attention counterpart.
"""
