"""One tiny model of every family the library has, for the tests that run the same check on
each: :data:`FAMILIES` maps a name to a function that builds the model, of vocabulary :data:`V`."""

from __future__ import annotations

import torch

from experiments.reference import BigramLM, WordLMTransformer
from neuralode_lm.models import GPT2LM, LSTMLM, ODEGPT2, ODELSTM, AugmentedODEGPT2
from neuralode_lm.transformer import NODETransformerLM
from ode_transformer import ODETransformerConfig, ODETransformerLM

V = 23
GPT2_TINY = {"n_embd": 16, "n_layer": 1, "n_head": 2, "n_positions": 32}
NODE_TINY = {
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
    "n_layers": 1,
    "max_positions": 32,
    "dropout": 0.0,
}
ODE_LSTM_TINY = {"embed_dim": 12, "hidden_dim": 12, "field_hidden": 8, "dropout": 0.0}
RK4_HALF = {"method": "rk4", "step_size": 0.5}
DOPRI5 = {"method": "dopri5", "rtol": 1e-3, "atol": 1e-4}


def tiny_ode_transformer(**options) -> ODETransformerLM:
    """A 2-layer ODE Transformer of vocabulary :data:`V`, d 16, no dropout."""
    config = ODETransformerConfig(
        vocab_size=V,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=2,
        max_positions=32,
        dropout=0.0,
        attention_dropout=0.0,
        relu_dropout=0.0,
        **options,
    )
    return ODETransformerLM(config)


FAMILIES = {
    "ode_transformer-rk4": lambda: tiny_ode_transformer(block="rk4"),
    "ode_transformer-rk2-untied": lambda: tiny_ode_transformer(block="rk2", tie_embeddings=False),
    "ode_transformer-macaron": lambda: tiny_ode_transformer(stack="macaron"),
    "node-transformer-grid": lambda: NODETransformerLM(
        V, **NODE_TINY, solver={"method": "rk4"}, steps=2
    ),
    "node-transformer-adaptive": lambda: NODETransformerLM(V, **NODE_TINY, solver=DOPRI5),
    "lstm": lambda: LSTMLM(V, embed_dim=12, hidden_dim=12, dropout=0.0),
    "ode-lstm": lambda: ODELSTM(V, **ODE_LSTM_TINY, solver=RK4_HALF),
    "ode-lstm-dopri5": lambda: ODELSTM(V, **ODE_LSTM_TINY, solver=DOPRI5),
    "gpt2": lambda: GPT2LM(V, config=GPT2_TINY),
    "ode-gpt2": lambda: ODEGPT2(V, config=GPT2_TINY, layer=1, field_hidden=8, solver=RK4_HALF),
    "aug-ode-gpt2": lambda: AugmentedODEGPT2(
        V,
        config=GPT2_TINY,
        layer=1,
        field_hidden=8,
        augment_dim=4,
        solver=RK4_HALF,
    ),
    "reference-transformer": lambda: WordLMTransformer(
        V,
        d_model=16,
        n_heads=2,
        d_ff=16,
        n_layers=1,
        dropout=0.0,
        layer_dropout=0.0,
        max_positions=32,
    ),
    "bigram": lambda: _bigram(),
}


def _bigram() -> BigramLM:
    model = BigramLM(V)  # a random table: no tied log-probabilities for beam search to order
    torch.nn.init.normal_(model.table.weight)
    return model
