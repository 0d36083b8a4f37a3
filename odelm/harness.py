"""EleutherAI's lm-evaluation-harness on odelm models: ``python -m odelm.harness ARGS`` is the
``lm_eval`` command line (same arguments) with odelm's model types registered first.

``lm_eval`` itself never imports odelm, so ``transformers`` would not know the ``model_type``
of a run's ``config.json``; this entry point imports [`odelm.hf`][odelm.hf] (which registers
every library model type with ``AutoConfig`` and ``AutoModelForCausalLM``) and then runs
``lm_eval``'s own command line. No ``trust_remote_code`` is involved::

    python -m odelm.harness run --model hf \\
        --model_args pretrained=RUN/model,tokenizer=RUN --tasks TASK --device cpu
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Register odelm's model types, then run ``lm_eval``'s command line on ``argv``."""
    import odelm.hf  # noqa: F401  (registers the model types)

    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise SystemExit(
            "lm-evaluation-harness is not installed: pip install 'odelm[harness]'"
        ) from None
    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
