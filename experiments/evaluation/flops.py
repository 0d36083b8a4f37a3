"""The path published tables (``docs/results``) cite for the FLOPs counter, which lives in
``experiments.models.flops`` (below ``training``, whose metrics and throughput meter count
with it): these names are its objects, nothing more. New tables cite the owner."""

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
