"""Model building blocks and their CPU (torch) reference ops.

Ops a device backend may replace (paged attention, the causal conv, the gated delta rule) are
plain `torch_*` functions with the layouts of their FlashInfer / flash-linear-attention
counterparts, so a registry can swap them by name.
"""
