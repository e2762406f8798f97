"""How the LM is stored: ``--quantize`` and ``--kv-cache`` (no torch here: the server's settings name them).

What each format is and how it is computed: :mod:`pplex_trio.model._quant`.
"""

from __future__ import annotations

import dataclasses
import enum


class WeightFormat(enum.StrEnum):
    """``--quantize``: the LM's projection weights as loaded, or in int8."""

    NONE = "none"
    INT8 = "int8"


class KVFormat(enum.StrEnum):
    """``--kv-cache``: the LM's KV ring in the LM's dtype, or in fp8 with scales."""

    MODEL = "model"
    FP8 = "fp8"


@dataclasses.dataclass(frozen=True)
class Precision:
    """How the LM is stored: its projection weights and its KV ring."""

    weights: WeightFormat = WeightFormat.NONE
    kv_cache: KVFormat = KVFormat.MODEL

    def describe(self) -> str:
        """For logs and reports: ``weights int8, KV cache fp8``, or ``full precision``."""
        parts = [
            f"weights {self.weights}" if self.weights is not WeightFormat.NONE else "",
            f"KV cache {self.kv_cache}" if self.kv_cache is not KVFormat.MODEL else "",
        ]
        return ", ".join(p for p in parts if p) or "full precision"
