"""ode_transformer models: causality, parameter counts, gradients, encoder masks, bad input."""

from __future__ import annotations

import pytest
import torch

from ode_transformer import (
    BLOCKS,
    PRESETS,
    STACKS,
    MacaronLayer,
    ODETransformerConfig,
    ODETransformerEncoder,
    ODETransformerLM,
    RKBlock,
    RKLayer,
    Tableau,
    config_from_preset,
)
from tests.support.paths import ROOT

D, HEADS, FF, VOCAB = 16, 2, 32, 23


TINY = {
    "vocab_size": VOCAB,
    "d_model": D,
    "n_heads": HEADS,
    "d_ff": FF,
    "n_layers": 3,
    "max_positions": 24,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "relu_dropout": 0.0,
}


def tiny_config(**overrides: object) -> ODETransformerConfig:
    return ODETransformerConfig(**{**TINY, **overrides})


ARCHITECTURES = (
    [{"block": block} for block in BLOCKS]
    + [{"stack": stack, "block": "rk2"} for stack in STACKS if stack != "macaron"]
    + [{"stack": "macaron"}, {"sublayer": "attention", "block": "rk4"}]
    + [{"sublayer": "ffn", "block": "rk2_gate"}, {"tableau": ([[0, 0], [2 / 3, 0]], [0.25, 0.75])}]
)


def arch_id(arch: dict) -> str:
    return "-".join(f"{key}={value}" for key, value in arch.items() if key != "tableau") or "custom"


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[arch_id(a) for a in ARCHITECTURES])
def test_causality(arch: dict) -> None:
    torch.manual_seed(0)
    model = ODETransformerLM(tiny_config(**arch)).eval()
    tokens = torch.randint(0, VOCAB, (2, 12))
    t = 6
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + torch.randint(0, VOCAB - 1, (2, 5))) % VOCAB
    logits, aux = model(tokens)
    logits_changed, _ = model(changed)
    assert logits.shape == (2, 12, VOCAB) and isinstance(aux, dict)
    torch.testing.assert_close(logits[:, : t + 1], logits_changed[:, : t + 1], rtol=0, atol=1e-6)
    assert (logits[:, t + 1 :] - logits_changed[:, t + 1 :]).abs().max() > 1e-4


def test_residual_layer_is_a_standard_prenorm_layer() -> None:
    """``F`` = attention, FFN or both with the residual block all give the textbook pre-norm
    layer ``h = y + SAN(LN1 y)``, ``out = h + FFN(LN2 h)``; RK2 uses ``F = layer(y) - y``."""
    torch.manual_seed(3)
    y = torch.randn(2, 7, D, dtype=torch.float64)

    def standard(attention: torch.nn.Module, ffn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        h = x + attention.attention(attention.norm(x))
        return h + ffn.ffn(ffn.norm(h))

    for sublayer in ("both", "attention", "ffn"):
        layer = RKLayer("residual", sublayer, D, HEADS, FF).double()
        if sublayer == "both":
            attention, ffn = layer.blocks[0].f.attention, layer.blocks[0].f.ffn
        else:
            attention, ffn = layer.blocks[0].f, layer.blocks[1].f
        torch.testing.assert_close(layer(y), standard(attention, ffn, y))
    rk2 = RKLayer("rk2", "both", D, HEADS, FF).double()
    attention, ffn = rk2.blocks[0].f.attention, rk2.blocks[0].f.ffn
    F1 = standard(attention, ffn, y) - y
    F2 = standard(attention, ffn, y + F1) - (y + F1)
    torch.testing.assert_close(rk2(y), y + 0.5 * F1 + 0.5 * F2)


def layer_params(layer: torch.nn.Module) -> int:
    return sum(p.numel() for p in layer.parameters())


def test_parameter_counts() -> None:
    kwargs = {"d_model": D, "n_heads": HEADS, "d_ff": FF}
    standard = D * 3 * D + 3 * D + D * D + D + D * FF + FF + FF * D + D + 2 * (2 * D)
    for sublayer in ("both", "attention", "ffn"):
        residual = layer_params(RKLayer("residual", sublayer, **kwargs))
        assert residual == standard
        for block in ("rk2", "rk2_gamma1", "rk3", "rk4"):
            assert layer_params(RKLayer(block, sublayer, **kwargs)) == residual
        assert layer_params(RKLayer("rk2_learnable", sublayer, **kwargs)) == residual + 2
        assert layer_params(RKLayer("rk2_gate", sublayer, **kwargs)) == residual + 2 * D + 1
    custom = ([[0, 0, 0], [0.5, 0, 0], [0, 0.5, 0]], [0.2, 0.3, 0.5])
    assert layer_params(RKLayer(custom, "both", **kwargs)) == standard

    # Macaron: two FFNs at half width have exactly the weight matrices of one full FFN; the
    # only extras are the second FFN's pre-norm LayerNorm (2d) and its output bias (d).
    macaron = MacaronLayer(**kwargs)
    standard_layer = RKLayer("residual", "both", **kwargs)

    def matrix_params(layer: torch.nn.Module) -> int:
        return sum(p.numel() for p in layer.parameters() if p.dim() == 2)

    assert matrix_params(macaron) == matrix_params(standard_layer)
    assert layer_params(macaron) == standard + 3 * D

    # Stacks: multistep adds n - 1 scalars k, DLCL n (n + 1) / 2 weights W.
    plain = sum(p.numel() for p in ODETransformerLM(tiny_config()).parameters())
    for stack, extra in (("leapfrog", 0), ("polynet", 0), ("multistep", 2), ("dlcl", 6)):
        model = ODETransformerLM(tiny_config(stack=stack))
        assert sum(p.numel() for p in model.parameters()) == plain + extra


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[arch_id(a) for a in ARCHITECTURES])
def test_every_parameter_gets_a_gradient(arch: dict) -> None:
    torch.manual_seed(1)
    model = ODETransformerLM(tiny_config(n_layers=2, **arch))
    tokens = torch.randint(0, VOCAB, (2, 8))
    logits, _ = model(tokens)
    torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
    ).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name}: zero gradient"


def test_block_modules_and_aux() -> None:
    model = ODETransformerLM(tiny_config(block="rk4", stack="polynet"))
    assert model.is_causal and model.vocab_size == VOCAB and model.max_positions == 24
    assert len(model.block_modules()) == 3
    assert model(torch.zeros(1, 3, dtype=torch.long))[1]["nfe"] == 3 * 4 * 2
    tied = sum(p.numel() for p in ODETransformerLM(tiny_config()).parameters())
    untied_model = ODETransformerLM(tiny_config(tie_embeddings=False))
    assert untied_model.head.weight is not untied_model.token_embedding.weight
    assert sum(p.numel() for p in untied_model.parameters()) == tied + VOCAB * D


@pytest.mark.parametrize(
    ("overrides", "per_layer"),
    [
        ({}, 1),  # residual: one evaluation of F = attention + FFN per layer
        ({"block": "rk2"}, 2),
        ({"block": "rk4"}, 4),
        ({"block": "rk3", "stack": "dlcl"}, 3),
        ({"stack": "macaron"}, 1),  # FFN/2, attention, FFN/2: one sweep, one evaluation
        ({"block": "rk4", "sublayer": "attention"}, 4),  # RK stages of the integrated sub-layer
        ({"block": "rk2", "sublayer": "ffn"}, 2),
        ({"stack": "polynet"}, 2),  # F_t applied twice
    ],
)
def test_nfe_counts_evaluations_of_the_layer_function(overrides: dict, per_layer: int) -> None:
    model = ODETransformerLM(tiny_config(**overrides))
    assert model(torch.zeros(1, 3, dtype=torch.long))[1]["nfe"] == 3 * per_layer


def test_encoder_is_bidirectional_and_ignores_padding() -> None:
    torch.manual_seed(2)
    encoder = ODETransformerEncoder(tiny_config(block="rk2", max_positions=16)).eval()
    assert encoder.is_causal is False
    tokens = torch.randint(1, VOCAB, (2, 9))
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 5:] = True
    hidden = encoder(tokens, ~padding)
    assert hidden.shape == (2, 9, D)
    alone = encoder(tokens[1:, :5])
    torch.testing.assert_close(hidden[1, :5], alone[0], rtol=0, atol=1e-5)
    other_pad = tokens.clone()
    other_pad[1, 5:] = 0
    torch.testing.assert_close(
        encoder(other_pad, ~padding)[1, :5], hidden[1, :5], rtol=0, atol=1e-6
    )
    future = tokens.clone()
    future[0, 8] = (future[0, 8] + 1) % VOCAB
    assert (encoder(future, ~padding)[0, 0] - hidden[0, 0]).abs().max() > 1e-4  # sees the future


def test_presets() -> None:
    assert set(PRESETS) >= {"ptb-lm-1layer", "ptb-lm-2layer", "base", "small"}
    ptb = config_from_preset("ptb-lm-2layer", block="rk4")
    assert (ptb.d_model, ptb.d_ff, ptb.n_heads, ptb.n_layers, ptb.block) == (512, 2048, 8, 2, "rk4")
    assert ptb.dropout == ptb.attention_dropout == ptb.relu_dropout == 0.1
    assert config_from_preset("ptb-lm-1layer").n_layers == 1
    base = config_from_preset("base")
    assert (base.d_model, base.d_ff, base.n_heads, base.n_layers) == (512, 2048, 8, 6)
    small = config_from_preset("small", vocab_size=50)
    logits, _ = ODETransformerLM(small)(torch.randint(0, 50, (1, 5)))
    assert logits.shape == (1, 5, 50)
    with pytest.raises(ValueError, match="ptb-lm-1layer"):
        config_from_preset("tiny")
    with pytest.raises(ValueError, match="d_model"):
        config_from_preset("small", width=3)


def test_bad_input_errors() -> None:
    with pytest.raises(ValueError, match="rk4"):
        tiny_config(block="rk5")
    with pytest.raises(ValueError, match="leapfrog"):
        tiny_config(stack="ladder")
    with pytest.raises(ValueError, match="attention"):
        tiny_config(sublayer="conv")
    with pytest.raises(ValueError, match="divisible"):
        tiny_config(d_model=18, n_heads=4)
    with pytest.raises(ValueError, match="strictly lower-triangular"):
        Tableau(A=[[0.5, 0], [1, 0]], b=[0.5, 0.5])
    with pytest.raises(ValueError, match="strictly lower-triangular"):
        tiny_config(tableau=([[0, 1], [1, 0]], [0.5, 0.5]))
    with pytest.raises(ValueError, match="shapes do not match"):
        Tableau(A=[[0, 0], [1, 0]], b=[1 / 3, 1 / 3, 1 / 3])
    with pytest.raises(ValueError, match="shapes do not match"):
        Tableau(A=[[0, 0], [1]], b=[0.5, 0.5])
    with pytest.raises(ValueError, match="not both"):
        tiny_config(block="rk4", tableau=([[0]], [1]))
    with pytest.raises(ValueError, match="two stages"):
        RKBlock(torch.nn.Identity(), "rk3", "gate", D)
    with pytest.raises(ValueError, match="macaron"):
        tiny_config(stack="macaron", block="rk2")
    model = ODETransformerLM(tiny_config(max_positions=8))
    with pytest.raises(ValueError, match="max_positions=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 23\)"):
        model(torch.full((1, 4), VOCAB))
    with pytest.raises(ValueError, match="batch, time"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer ids"):
        model(torch.zeros(1, 4))


def test_ode_transformer_modules_import_without_a_circle() -> None:
    """Relative imports inside ode_transformer (type-only ones included) form a DAG."""
    import ast

    package = ROOT / "ode_transformer"
    edges = {
        path.stem: {
            (node.module or "").split(".")[0]
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }
        | {
            alias.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module
            for alias in node.names
        }
        for path in package.glob("*.py")
        if path.stem != "__init__"
    }
    assert edges["stacks"] and "config" not in edges["stacks"]
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in edges.get(module, ()):
            visit(target, (*path, module))
        done.add(module)

    for module in edges:
        visit(module, ())


def test_user_errors_are_odelm_errors() -> None:
    """The command line prints OdelmError as one line; these are all things a user fixes."""
    from odelm.decoding import generate
    from odelm.errors import OdelmError

    model = ODETransformerLM(tiny_config(max_positions=8))
    for make in (
        lambda: tiny_config(block="rk5"),
        lambda: Tableau(A=[[0.5, 0], [1, 0]], b=[0.5, 0.5]),
        lambda: RKBlock(torch.nn.Identity(), "rk3", "gate", D),
        lambda: config_from_preset("tiny"),
        lambda: model(torch.zeros(1, 9, dtype=torch.long)),
        lambda: ODETransformerLM.from_pretrained("/nonexistent-odelm-run"),
        lambda: generate(model, torch.zeros(1, 2, dtype=torch.long), 2, strategy="nucleus"),
    ):
        with pytest.raises(OdelmError):
            make()


def test_sinusoidal_positions_and_embedding_scale() -> None:
    """The sinusoidal table is Vaswani et al.'s formula, it adds no parameters, the embedding
    scale multiplies token vectors by sqrt(d_model), and both keep the model causal and its
    cached decoding equal to a full forward."""
    torch.manual_seed(0)
    learned = ODETransformerLM(tiny_config(n_layers=1))
    model = ODETransformerLM(tiny_config(n_layers=1, positions="sinusoidal", scale_embeddings=True))
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(learned) - count(model) == TINY["max_positions"] * D
    table = model.position_table
    pos, i = 7, 3  # odd column 2i+1 = 7 holds cos(pos / 10000^(2i/d))
    assert table[pos, 2 * i].item() == pytest.approx(
        torch.sin(torch.tensor(pos / 1e4 ** (2 * i / D))).item(), abs=1e-6
    )
    assert table[pos, 2 * i + 1].item() == pytest.approx(
        torch.cos(torch.tensor(pos / 1e4 ** (2 * i / D))).item(), abs=1e-6
    )
    tokens = torch.randint(0, VOCAB, (2, 12))
    model.eval()
    expected = model.token_embedding(tokens) * D**0.5 + table[:12]
    assert torch.allclose(model.states(tokens), model.norm(model.stack(expected)), atol=1e-6)
    full, _ = model(tokens)
    cache = model.init_cache()
    pieces = [model(tokens[:, :5], cache)[0], model(tokens[:, 5:], cache)[0]]
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)
    changed = tokens.clone()
    changed[:, 8] = (changed[:, 8] + 1) % VOCAB
    assert torch.allclose(model(changed)[0][:, :8], full[:, :8], atol=1e-6)
    with pytest.raises(Exception, match="unknown positions"):
        tiny_config(positions="rotary")
