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

A ``pretrained=`` or ``tokenizer=`` path that is a file or no folder, and an unknown task, end
in one line ``odelm: error: ...`` (exit 2), not in a traceback of ``transformers`` (which takes
a missing folder for a Hub id) or ``lm_eval``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from odelm.errors import OdelmError
from odelm.hub import HUB_ID

PATH_ARGS = ("pretrained", "tokenizer")
"""The ``--model_args`` keys that name a saved model or tokenizer."""


class HarnessError(OdelmError, ValueError):
    """The harness was given a model path or a task it cannot use."""


def check_model_args(argv: list[str]) -> None:
    """Refuse a ``--model_args`` path (``pretrained=``, ``tokenizer=``) that is a file, or
    neither an existing folder nor a Hub id (``owner/name``), before anything loads."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--model_args=")]
    given += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model_args"]
    for item in ",".join(given).split(","):
        key, _, value = item.partition("=")
        if key.strip() not in PATH_ARGS or not value:
            continue
        path = Path(value)
        if path.is_file():
            raise HarnessError(
                f"{key}={value} is a file; give the folder of a saved model (RUN/model, or RUN "
                "for its tokenizer)"
            )
        if not path.is_dir() and not HUB_ID.fullmatch(value):
            raise HarnessError(
                f"{key}={value}: no such folder (and not a Hub id owner/name); give the folder "
                "of a saved model (RUN/model, or RUN for its tokenizer)"
            )


def _one_line(error: Exception) -> str | None:
    """The line of an error ``lm_eval`` or ``transformers`` raise on a bad task or path
    (None for any other error: a bug, which keeps its traceback)."""
    text = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, ValueError) and text.startswith("Tasks not found"):
        return f"{text}; python -m odelm.harness ls tasks lists the tasks"
    repo = re.match(r"Repo id must be in the form .*: '(.*)'", text)
    if isinstance(error, OSError) and repo:
        return f"{repo[1]} is neither a folder of a saved model nor a Hub id (owner/name)"
    return None


def main(argv: list[str] | None = None) -> None:
    """Register odelm's model types, then run ``lm_eval``'s command line on ``argv``."""
    import odelm.hf  # noqa: F401  (registers the model types)

    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise SystemExit(
            "lm-evaluation-harness is not installed: pip install 'odelm[harness]'"
        ) from None
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        check_model_args(args)
        sys.argv = ["lm_eval", *_without_second_bos(args)]
        cli_evaluate()
    except (ValueError, OSError) as error:
        line = str(error) if isinstance(error, OdelmError) else _one_line(error)
        if line is None:
            raise
        print(f"odelm: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None


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
