"""An ODE head on a GPT-2 loaded from a local Hugging Face folder (``save_pretrained``):
GPT-2's last hidden layer is decoded by a neural ODE, as in the report's ODE-GPT2.

    python examples/ode_head_on_gpt2.py --max-steps 500
    python examples/ode_head_on_gpt2.py --gpt2-dir ./gpt2 --max-steps 500

With ``--gpt2-dir`` the folder holds ``config.json`` and the weights, and its tokenizer
(``tokenizer.json``, or ``vocab.json`` + ``merges.txt``), which tokenizes the corpus.
Without it the script builds a tiny untrained GPT-2 (one layer, a byte-level BPE
tokenizer of a few merges) in a temporary folder and starts from that, so it runs with
no manual step. Nothing is downloaded.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import lightning as L
from _common import data_module, parser, train_and_test
from tokenizers import pre_tokenizers
from transformers import GPT2Config, GPT2Model

from neuralode_lm import ODEGPT2

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")]
"""The tiny tokenizer's merges: the 256 byte symbols, then these pairs."""


def tiny_gpt2_folder(path: Path) -> int:
    """Save a one-layer GPT-2 and a byte-level BPE tokenizer (``vocab.json`` +
    ``merges.txt``) Hugging Face style in ``path``; return the vocabulary size."""
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["".join(m) for m in MERGES]
    tokens.append("<|endoftext|>")
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=len(tokens))
    config.bos_token_id = config.eos_token_id = len(tokens) - 1
    GPT2Model(config).save_pretrained(path)
    return len(tokens)


def main() -> None:
    options = parser(__doc__.splitlines()[0])
    options.add_argument(
        "--gpt2-dir", default=None, help="a local GPT-2 folder (default: build a tiny one)"
    )
    options.add_argument("--freeze", action="store_true", help="train the ODE head only")
    options.add_argument("--step-size", type=float, default=0.25, help="rk4 step (time 0..1)")
    args = options.parse_args()
    L.seed_everything(args.seed)
    with tempfile.TemporaryDirectory(prefix="tiny-gpt2-") as scratch:
        if args.gpt2_dir is None:
            args.gpt2_dir = str(Path(scratch) / "gpt2")
            tiny_gpt2_folder(Path(args.gpt2_dir))
            print(f"no --gpt2-dir: built a tiny untrained GPT-2 in {args.gpt2_dir}")
        gpt2 = GPT2Model.from_pretrained(args.gpt2_dir, local_files_only=True)
        # An evaluation window reads one token more than it scores: it fits GPT-2's positions.
        window = min(128, gpt2.config.n_positions - 1)
        data = data_module(args, tokenizer="bpe", tokenizer_dir=args.gpt2_dir, eval_window=window)
        # The corpus tokenizer adds an <unk> token when GPT-2's vocabulary lacks one.
        gpt2.resize_token_embeddings(data.vocab_size)
        solver = {"method": "rk4", "step_size": args.step_size}
        model = ODEGPT2(
            data.vocab_size, config=gpt2.config.to_dict(), freeze=args.freeze, solver=solver
        )
        model.encoder.model.load_state_dict(gpt2.state_dict())
        train_and_test(model, data, args)


if __name__ == "__main__":
    main()
