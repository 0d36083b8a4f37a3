"""An ODE Transformer (a Runge-Kutta block per layer) trained by a plain Lightning Trainer.

    python examples/ode_transformer_trainer.py --block rk4 --max-steps 500

The model is an ordinary ``nn.Module`` returning ``(logits, aux)``; ``LMTask`` adds the
loss, optimizer and perplexity logging, ``LMDataModule`` the batches.
"""

from __future__ import annotations

import lightning as L
from _common import data_module, parser, train_and_test

from ode_transformer import BLOCKS, ODETransformerConfig, ODETransformerLM


def main() -> None:
    options = parser(__doc__.splitlines()[0])
    options.add_argument("--block", default="rk4", choices=sorted(BLOCKS))
    options.add_argument("--layers", type=int, default=2)
    options.add_argument("--d-model", type=int, default=64)
    options.add_argument("--heads", type=int, default=4)
    args = options.parse_args()
    L.seed_everything(args.seed)
    data = data_module(args)
    config = ODETransformerConfig(
        vocab_size=data.vocab_size,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        n_layers=args.layers,
        block=args.block,
    )
    train_and_test(ODETransformerLM(config), data, args)


if __name__ == "__main__":
    main()
