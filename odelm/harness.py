"""EleutherAI's lm-evaluation-harness on odelm models: ``python -m odelm.harness ARGS`` is the
``lm_eval`` command line (same arguments) with odelm's model types registered first.

``lm_eval`` itself never imports odelm, so ``transformers`` would not know the ``model_type``
of a run's ``config.json``; this entry point imports [`odelm.hf`][odelm.hf] (which registers
every library model type with ``AutoConfig`` and ``AutoModelForCausalLM``) and then runs
``lm_eval``'s own command line. A run's tokenizer puts its ``<eos>`` (the BOS) before a text,
which ``lm_eval``'s prefix token already is, so ``add_bos_token=False`` joins ``--model_args``
unless given. No ``trust_remote_code`` is involved::

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
    sys.argv = ["lm_eval", *_without_second_bos(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


def _without_second_bos(argv: list[str]) -> list[str]:
    """``argv`` with ``add_bos_token=False`` in ``--model_args`` unless it names one."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--model_args" and i + 1 < len(argv):
            i, prefix, value = i + 1, "", argv[i + 1]
        elif arg.startswith("--model_args="):
            prefix, value = "--model_args=", arg.removeprefix("--model_args=")
        else:
            continue
        if "add_bos_token" not in value and "=" in value:  # key=value pairs, not JSON
            argv[i] = f"{prefix}{value},add_bos_token=False"
        break
    return argv


if __name__ == "__main__":
    main()
