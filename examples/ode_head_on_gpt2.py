"""An ODE head on a GPT-2 loaded from a local Hugging Face folder (``save_pretrained``):
GPT-2's last hidden layer is decoded by a neural ODE, as in the report's ODE-GPT2.

    python examples/ode_head_on_gpt2.py --gpt2-dir ./gpt2 --max-steps 500

The folder holds ``config.json`` and the weights, and its tokenizer (``tokenizer.json``,
or ``vocab.json`` + ``merges.txt``), which tokenizes the corpus. Nothing is downloaded.
"""

from __future__ import annotations

import lightning as L
from _common import data_module, parser, train_and_test
from transformers import GPT2Model

from neuralode_lm import ODEGPT2


def main() -> None:
    options = parser(__doc__.splitlines()[0])
    options.add_argument("--gpt2-dir", required=True, help="a local GPT-2 folder")
    options.add_argument("--freeze", action="store_true", help="train the ODE head only")
    options.add_argument("--step-size", type=float, default=0.25, help="rk4 step (time 0..1)")
    args = options.parse_args()
    L.seed_everything(args.seed)
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
