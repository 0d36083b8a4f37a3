"""Forward FLOPs per predicted token: the counter lives in ``experiments.models.flops``
(below ``training``, whose throughput meter counts with it too); this path, which the
published tables cite, names the same objects."""

from experiments.models.flops import (
    ATTENTION_FORMULAS,
    counting_flops,
    forward_flops_per_token,
    is_adaptive,
    recurrent_flops,
    recurrent_layer_flops,
)

__all__ = [
    "ATTENTION_FORMULAS",
    "counting_flops",
    "forward_flops_per_token",
    "is_adaptive",
    "recurrent_flops",
    "recurrent_layer_flops",
]
