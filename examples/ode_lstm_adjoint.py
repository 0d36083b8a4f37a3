"""An ODE-LSTM: an LSTM's states decoded by a neural ODE solved adaptively (dopri5), with
gradients from the adjoint method (memory constant in the number of solver steps).

    python examples/ode_lstm_adjoint.py --max-steps 500
"""

from __future__ import annotations

import lightning as L
from _common import data_module, parser, train_and_test

from neuralode_lm import ODELSTM, LSTMConfig, SolverConfig


def main() -> None:
    options = parser(__doc__.splitlines()[0])
    options.add_argument("--hidden", type=int, default=64, help="LSTM and ODE state width")
    options.add_argument("--method", default="dopri5", help="solver method")
    options.add_argument("--rtol", type=float, default=1e-3)
    options.add_argument("--atol", type=float, default=1e-4)
    args = options.parse_args()
    L.seed_everything(args.seed)
    data = data_module(args)
    solver = SolverConfig(method=args.method, rtol=args.rtol, atol=args.atol, adjoint=True)
    lstm = LSTMConfig(embed_dim=args.hidden, hidden_dim=args.hidden)
    model = ODELSTM(data.vocab_size, lstm, field_hidden=args.hidden, solver=solver)
    train_and_test(model, data, args)
    stats = model.solver_stats  # the last solve's statistics (a test batch's)
    print(f"last test batch: {stats.nfe_forward} evaluations of the ODE field ({args.method})")


if __name__ == "__main__":
    main()
