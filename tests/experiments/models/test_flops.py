"""FLOPs per token against closed forms: a linear model, Transformer stacks (attention
included), RK4, LSTMs, the reference Transformer, GPT-2; and the sample they are taken on."""

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from experiments.comparison.config_flops import grid_flops
from experiments.models.build import build_model
from experiments.models.flops import counting_flops, forward_flops_per_token, is_adaptive
from experiments.training.config import parse_config
from experiments.training.metrics import EvalSettings, evaluation_batches, perplexity
from experiments.training.train import prepare_data


class LinearLM(nn.Module):
    is_causal = True

    def __init__(self, vocab: int = 10, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor):
        return self.out(self.embed(tokens)), {}


def test_flops_per_token_equals_closed_form():
    tokens = torch.randint(0, 10, (3, 5))
    # one [8 -> 10] matmul per position (2 * 8 * 10 FLOPs), 15 positions, 12 predicted
    assert forward_flops_per_token(LinearLM(), [tokens]) == 2 * 8 * 10 * 15 / 12


def test_flops_per_token_counts_only_real_predicted_tokens():
    tokens = torch.randint(0, 10, (2, 4))
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    # 8 positions are run; predicted real tokens: 3 in row 0, 1 in row 1
    assert forward_flops_per_token(LinearLM(), [(tokens, mask)]) == 2 * 8 * 10 * 8 / 4


class LSTMLM(nn.Module):
    is_causal = True

    def __init__(self, vocab: int = 10, width: int = 8, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor):
        return self.out(self.lstm(self.embed(tokens))[0]), {}


def test_flops_per_token_adds_the_fused_lstm_in_closed_form():
    tokens = torch.randint(0, 10, (3, 5))
    # per position: layer 1 2*4*6*(8+6), layer 2 2*4*6*(6+6), output 2*6*10; 15 run, 12 predicted
    per_position = 2 * 4 * 6 * (8 + 6) + 2 * 4 * 6 * (6 + 6) + 2 * 6 * 10
    assert forward_flops_per_token(LSTMLM(), [tokens]) == per_position * 15 / 12


# Closed forms, from the mathematics: an [m, k] @ [k, n] product costs 2 m k n FLOPs;
# embeddings (lookups), biases, norms and softmax cost 0. For T positions of width d:
def attention_layer(T: int, d: int, heads: int) -> int:
    """QKV and output projections, QK^T scores (full T x T, causal or not) and scores x V.

    Per head the scores are [T, d/h] @ [d/h, T] and the output [T, T] @ [T, d/h]; summed over
    the h heads each is 2 T T d, independent of the head count."""
    return 2 * T * d * 3 * d + 2 * T * d * d + 2 * T * T * d + 2 * T * T * d


def ffn(T: int, d: int, d_ff: int) -> int:
    return 2 * T * d * d_ff + 2 * T * d_ff * d


T, D, HEADS, FFN, VOCAB = 16, 64, 2, 128, 100


def per_token(total_over_positions: int, positions: int = T) -> float:
    """One window of ``positions`` tokens predicts ``positions - 1`` of them."""
    return total_over_positions / (positions - 1)


def ode_transformer(block: str, n_layers: int) -> nn.Module:
    spec = {
        "family": "ode_transformer",
        "preset": "small",
        "d_model": D,
        "d_ff": FFN,
        "n_heads": HEADS,
    }
    return build_model({**spec, "n_layers": n_layers, "block": block}, VOCAB)


def one_window(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(seed))


def test_residual_transformer_stack_counts_attention_within_two_percent():
    layer = attention_layer(T, D, HEADS) + ffn(T, D, FFN)  # one evaluation of F
    closed = per_token(2 * layer + 2 * T * D * VOCAB)  # 2 residual layers, then the head
    counted = forward_flops_per_token(ode_transformer("residual", 2), [one_window()])
    assert counted == pytest.approx(closed, rel=0.02)
    # the attention products alone are 4 T^2 d per layer: leaving them out misses > 2%
    assert closed - per_token(2 * 4 * T * T * D) < 0.98 * counted


def test_rk4_block_counts_four_evaluations_of_f_per_layer():
    layer = attention_layer(T, D, HEADS) + ffn(T, D, FFN)
    closed = per_token(2 * 4 * layer + 2 * T * D * VOCAB)
    counted = forward_flops_per_token(ode_transformer("rk4", 2), [one_window()])
    assert counted == pytest.approx(closed, rel=0.02)


def test_neuralode_lm_lstm_counts_its_fused_recurrence():
    model = build_model(
        {
            "family": "neuralode_lm",
            "name": "lstm",
            "embed_dim": 32,
            "hidden_dim": 48,
            "n_layers": 2,
        },
        VOCAB,
    )
    # per token and layer: 4 gates x [input + hidden] -> hidden, then the output layer
    lstm = 2 * 4 * 48 * (32 + 48) + 2 * 4 * 48 * (48 + 48)
    closed = per_token(T * (lstm + 2 * 48 * VOCAB))
    assert forward_flops_per_token(model, [one_window()]) == pytest.approx(closed, rel=0.02)


def test_reference_transformer_counts_its_fused_eval_path():
    model = build_model(
        {"family": "reference", "name": "transformer", "d_model": D, "n_heads": HEADS, "d_ff": FFN},
        VOCAB,
    ).eval()  # eval mode: nn.TransformerEncoderLayer would take its fused fast path
    layer = attention_layer(T, D, HEADS) + ffn(T, D, FFN)  # post-norm, same products
    closed = per_token(2 * layer + 2 * T * D * VOCAB)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    assert forward_flops_per_token(model, [one_window()]) == pytest.approx(closed, rel=0.02)
    assert torch.backends.mha.get_fastpath_enabled() == fastpath  # restored


def test_gpt2_from_a_config_counts_its_attention():
    config = {"n_layer": 2, "n_embd": D, "n_head": HEADS, "n_positions": 32}
    model = build_model({"family": "neuralode_lm", "name": "gpt2", "config": config}, VOCAB)
    layer = attention_layer(T, D, HEADS) + ffn(T, D, 4 * D)  # GPT-2's MLP is 4d wide
    closed = per_token(2 * layer + 2 * T * D * VOCAB)  # the tied LM head is a product too
    assert forward_flops_per_token(model, [one_window()]) == pytest.approx(closed, rel=0.02)


def test_counting_flops_scores_cpu_attention_with_full_scores_under_a_causal_mask():
    q = torch.randn(3, 2, 10, 8)
    for causal in (False, True):
        with counting_flops(nn.Identity()) as flops:
            F.scaled_dot_product_attention(q, q, q, is_causal=causal)
        assert flops() == 2 * (2 * 3 * 2 * 10 * 10 * 8)


class VariableDepthLM(nn.Module):
    """Applies its square layer a batch-dependent number of times and reports it as NFE,
    like an adaptive solver: its cost differs from batch to batch."""

    is_causal = True

    def __init__(self, vocab: int, width: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layer = nn.Linear(width, width, bias=False)
        self.out = nn.Linear(width, vocab, bias=False)

    @staticmethod
    def depth(tokens: torch.Tensor) -> int:
        return 1 + int(tokens.sum()) % 4

    def forward(self, tokens: torch.Tensor):
        x = self.embed(tokens)
        for _ in range(self.depth(tokens)):
            x = self.layer(x)
        return self.out(x), {"nfe": self.depth(tokens)}


def test_perplexity_measures_flops_and_nfe_on_the_same_batches_over_the_whole_split(
    tiny_config,
    tmp_path,
):
    data = prepare_data(parse_config(tiny_config(tmp_path)))
    vocab = data.tokenizer.vocab_size
    batches = evaluation_batches(data, "test", EvalSettings(eval_window=8))
    assert len(batches) > 4  # more batches than the old 4-batch sample
    depths = [VariableDepthLM.depth(ids) for ids, _ in batches]
    flops = sum(
        ids.numel() * (2 * 8 * 8 * k + 2 * 8 * vocab) for (ids, _), k in zip(batches, depths)
    )
    tokens = sum(ids[:, 1:].numel() for ids, _ in batches)
    scored = perplexity(VariableDepthLM(vocab), data, "test", EvalSettings(eval_window=8))
    assert scored["nfe"] == pytest.approx(sum(depths) / len(depths))
    assert scored["flops_per_token"] == pytest.approx(flops / tokens)
    assert scored["flops_batches"] == len(batches) and scored["tokens"] == tokens


def test_is_adaptive_tells_adaptive_solves_from_fixed_depth():
    def model(**spec):
        return build_model({"family": "neuralode_lm", **spec}, VOCAB)

    node = {"name": "node-transformer", "d_model": 16, "d_ff": 32, "n_heads": 2}
    assert is_adaptive(model(**node, solver={"method": "dopri5"}))
    assert is_adaptive(model(name="ode-lstm", embed_dim=16, hidden_dim=16))
    assert not is_adaptive(model(**node, solver={"method": "rk4"}, steps=2))
    assert not is_adaptive(model(name="lstm", embed_dim=16, hidden_dim=16))
    assert not is_adaptive(ode_transformer("rk4", 1))


@pytest.mark.slow
def test_grid_flops_recomputes_fixed_compute_runs_and_leaves_adaptive_ones_out(
    tiny_config, tmp_path
):
    layer = {"family": "ode_transformer", "preset": "small", "d_model": 16, "d_ff": 32}
    layer |= {"n_heads": 2, "n_layers": 1, "block": "residual"}
    node = {"family": "neuralode_lm", "name": "node-transformer", "d_model": 16, "d_ff": 32}
    node |= {"n_heads": 2, "solver": {"method": "dopri5"}}
    shared = {k: v for k, v in tiny_config(tmp_path).items() if k in ("data", "trainer")}
    grid = {"shared": shared, "seeds": [1, 2]}
    grid["runs"] = [{"name": "residual", "model": layer}, {"name": "node", "model": node}]
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(grid))
    rows = grid_flops(grid_file)
    assert [(r["name"], r["seed"], r["adaptive"]) for r in rows] == [
        ("residual", 1, False), ("node", 1, True), ("residual", 2, False), ("node", 2, True)
    ]  # fmt: skip
    assert rows[1]["flops_per_token"] is None and rows[0] == {
        **rows[2],
        "seed": 1,
        "run": "residual-seed1",
    }
    # closed form over the run's own test windows: [B, L] each (stream mode, eval_window 64)
    data = prepare_data(parse_config(tiny_config(tmp_path)))
    batches = evaluation_batches(
        data, "test", EvalSettings(eval_window=shared["data"]["eval_window"])
    )
    d, vocab = 16, data.tokenizer.vocab_size
    flops = sum(
        ids.shape[0] * (attention_layer(ids.shape[1], d, 2) + ffn(ids.shape[1], d, 32))
        + ids.numel() * 2 * d * vocab
        for ids, _ in batches
    )
    tokens = sum(ids[:, 1:].numel() for ids, _ in batches)
    assert rows[0]["flops_batches"] == len(batches)
    assert rows[0]["flops_per_token"] == pytest.approx(flops / tokens, rel=0.02)


@pytest.mark.parametrize("conditioning, size", [("weights", 4), ("hypernetwork", 3)])
def test_depth_dependent_weights_add_their_weight_forming_per_evaluation(conditioning, size):
    """A node-transformer's fixed grid costs its NFE times one evaluation of F plus the
    head; depth-dependent weights add, per evaluation, the products that form each map's
    ``W(s)`` (shared by all tokens): ``2 (K - 1)`` times the maps' weights and biases, or
    ``2 r`` times their weights plus the hypernetwork's gates."""
    from neuralode_lm.depth_weights import HIDDEN

    def node(**options) -> nn.Module:
        spec = {"family": "neuralode_lm", "name": "node-transformer", "d_model": D}
        spec |= {"d_ff": FFN, "n_heads": HEADS, "solver": {"method": "rk3"}, "steps": 2}
        return build_model({**spec, **options}, VOCAB)

    options = {"time_conditioning": conditioning}
    options["weight_basis" if conditioning == "weights" else "hypernetwork_rank"] = size
    shared = forward_flops_per_token(node(), [one_window()])
    counted = forward_flops_per_token(node(**options), [one_window()])
    nfe = 2 * 3
    layer = attention_layer(T, D, HEADS) + ffn(T, D, FFN)
    assert shared == pytest.approx(per_token(nfe * layer + 2 * T * D * VOCAB), rel=0.02)
    shapes = [(3 * D, D), (D, D), (FFN, D), (D, FFN)]
    if conditioning == "weights":
        forming = 2 * (size - 1) * sum(o * i + o for o, i in shapes)
    else:
        forming = 2 * size * sum(o * i for o, i in shapes) + 2 * HIDDEN * len(shapes) * size
    assert counted - shared == pytest.approx(per_token(nfe * forming), rel=1e-12)


@pytest.mark.slow
def test_config_flops_of_depth_dependent_weights_is_the_closed_form(tiny_config, tmp_path):
    """``config_flops.run_flops`` of a node-transformer with ``weights`` (K = 3, two Euler
    steps) over the run's own test windows: per window batch, each evaluation of F costs
    its attention and FFN for every row, plus forming the four maps' ``W(s)`` once."""
    from experiments.comparison.config_flops import run_flops

    d, d_ff = 16, 32
    node = {"family": "neuralode_lm", "name": "node-transformer", "d_model": d, "d_ff": d_ff}
    node |= {"n_heads": 2, "solver": {"method": "euler"}, "steps": 2}
    node |= {"time_conditioning": "weights", "weight_basis": 3}
    config = parse_config(tiny_config(tmp_path, model=node) | {"model": node})
    data = prepare_data(config)
    scored = run_flops(config, data)
    batches = evaluation_batches(data, "test", EvalSettings(eval_window=config.data.eval_window))
    shapes = [(3 * d, d), (d, d), (d_ff, d), (d, d_ff)]
    forming = 2 * 2 * sum(o * i + o for o, i in shapes)
    flops = sum(
        2 * ids.shape[0] * (attention_layer(ids.shape[1], d, 2) + ffn(ids.shape[1], d, d_ff))
        + 2 * forming
        + ids.numel() * 2 * d * data.tokenizer.vocab_size
        for ids, _ in batches
    )
    tokens = sum(ids[:, 1:].numel() for ids, _ in batches)
    assert scored["adaptive"] is False and scored["flops_batches"] == len(batches)
    assert scored["flops_per_token"] == pytest.approx(flops / tokens, rel=0.02)
