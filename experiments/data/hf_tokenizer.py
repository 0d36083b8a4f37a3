"""A run's tokenizer as a ``transformers`` ``PreTrainedTokenizerFast`` (both kinds, word-level
and byte-level BPE, are ``tokenizers`` objects underneath).

A finished run holds ``tokenizer.json`` and ``tokenizer_config.json`` at its root (written by
[`save_hf_tokenizer`][experiments.data.hf_tokenizer.save_hf_tokenizer] when the run is saved),
so ``AutoTokenizer.from_pretrained(RUN)`` loads it. A run written before those files existed
loads with [`hf_tokenizer`][experiments.data.hf_tokenizer.hf_tokenizer] (built in memory from
``RUN/tokenizer``; nothing is written into the run).

The Hugging Face tokenizer reads raw text as the library reads a corpus line: words separated by
whitespace (a BPE word is encoded with its leading space, as ``BPETokenizer.encode_line`` does),
special tokens (``<eos>``, ``<unk>``) kept whole. The run's ``<eos>`` is also its BOS and its
padding token: ``tokenizer("the cat")["input_ids"]`` is ``<eos>`` (the end of the line before,
which the library puts before every prompt, as ``odelm generate`` does) followed by the line's
tokens, so ``pipeline("text-generation")`` continues a prompt token for token as ``odelm
generate`` does (``add_special_tokens=False`` leaves the ``<eos>`` out). A word outside a
word-level vocabulary becomes ``<unk>`` where the vocabulary has one, and is refused otherwise
(the tokenizer raises, as ``run.encode`` does). Every word decodes with its leading space
(``decode`` of ``the cat`` is ``" the cat"``, as GPT-2's ``Ġthe`` decodes), so the text of new
tokens alone joins onto its prompt, as ``pipeline("text-generation")`` joins them.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from experiments.data.checksums import verify_recorded_files
from experiments.data.tokenization import (
    SubwordTokenizer,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
)
from odelm import files
from odelm.errors import OdelmError

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""What [`save_hf_tokenizer`][experiments.data.hf_tokenizer.save_hf_tokenizer] writes into a run."""
UNK = "<unk>"
MISSING_UNK = "<not-in-vocabulary>"
"""The unknown token a word-level vocabulary without ``<unk>`` names but does not hold, so
that the tokenizer refuses a word outside the vocabulary instead of mapping it."""
SPACE = "\u2581"  # "▁", the word-start mark of a word-level vocabulary


class HFTokenizerError(OdelmError, ValueError):
    """A run's Hugging Face tokenizer cannot be read, or is not the one its model was
    trained with."""


def _backend(tokenizer: Tokenizer) -> tuple[Any, dict[str, str]]:
    """The ``tokenizers.Tokenizer`` and the special tokens of a library tokenizer."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as Backend

    if isinstance(tokenizer, WordTokenizer):
        # every word is stored as "▁word" and decodes as " word" (as a byte-level BPE token
        # carries its space), so text decoded from new tokens alone joins onto its prompt
        unk = UNK if UNK in tokenizer.index else None
        vocab = {
            token if token in (UNK, tokenizer.tokens[tokenizer.eos_id]) else SPACE + token: i
            for token, i in tokenizer.index.items()
        }
        backend = Backend(models.WordLevel(vocab, unk_token=unk or MISSING_UNK))
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.Metaspace(SPACE, prepend_scheme="always", split=False),
            ]
        )
        backend.decoder = decoders.Metaspace(SPACE, prepend_scheme="never", split=False)
        specials = {"eos_token": tokenizer.tokens[tokenizer.eos_id]}
    elif isinstance(tokenizer, SubwordTokenizer):
        bpe = tokenizer.bpe
        backend = Backend.from_str(bpe._tok.to_str())
        # every word gets its leading space, as encode_line gives it (" word", GPT-2's Ġword)
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.WhitespaceSplit(),
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
            ]
        )
        specials = {"eos_token": bpe.eos_token}
        unk = bpe.unk_token
    else:
        raise TypeError(f"no Hugging Face form for a {type(tokenizer).__name__}")
    if unk is not None:
        specials["unk_token"] = unk
    backend.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False, lstrip=True, rstrip=True)
            for token in specials.values()
        ]
    )
    eos = specials["eos_token"]  # also the BOS every prompt starts with, and the padding
    backend.post_processor = processors.TemplateProcessing(
        single=f"{eos} $A", pair=f"{eos} $A {eos} $B", special_tokens=[(eos, tokenizer.eos_id)]
    )
    return backend, {**specials, "bos_token": eos, "pad_token": eos}


def to_hf_tokenizer(tokenizer: Tokenizer, model_max_length: int | None = None) -> Any:
    """``tokenizer`` (a run's word or BPE tokenizer) as a ``PreTrainedTokenizerFast`` with the
    run's special tokens (``eos_token``, also ``bos_token`` and ``pad_token``; ``unk_token`` when
    the vocabulary has one)."""
    from transformers import PreTrainedTokenizerFast

    backend, specials = _backend(tokenizer)
    options: dict[str, Any] = dict(specials)
    if model_max_length is not None:
        options["model_max_length"] = model_max_length
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, clean_up_tokenization_spaces=False, **options
    )
    return hf


def hf_tokenizer(run_dir: str | os.PathLike[str]) -> Any:
    """The ``PreTrainedTokenizerFast`` of a run: ``AutoTokenizer.from_pretrained(RUN)`` when the
    run has its Hugging Face files, else built in memory from ``RUN/tokenizer`` (a run written
    by an earlier version; the folder is left as it is). The tokenizer files the run recorded
    must be unchanged, and the vocabulary must be the model's size."""
    from transformers import AutoTokenizer

    run = Path(run_dir)
    verify_recorded_files(run, ["tokenizer", *HF_TOKENIZER_FILES])
    if all((run / name).is_file() for name in HF_TOKENIZER_FILES):
        try:
            hf = AutoTokenizer.from_pretrained(str(run))
        except Exception as error:  # noqa: BLE001 (tokenizers raises a bare Exception)
            raise HFTokenizerError(
                f"{run / HF_TOKENIZER_FILES[0]} is not a tokenizer transformers can read "
                f"({type(error).__name__}: {(str(error).splitlines() or ['no detail'])[0][:200]}"
                "); restore the run's own tokenizer files"
            ) from None
    else:
        hf = to_hf_tokenizer(load_tokenizer(run / "tokenizer"), _max_positions(run))
    vocab = _model_config(run).get("vocab_size")
    if isinstance(vocab, int) and len(hf) != vocab:
        raise HFTokenizerError(
            f"the tokenizer of {run} has {len(hf)} tokens but its model's vocabulary has "
            f"{vocab}; it belongs to another run: restore the run's own tokenizer files"
        )
    return hf


def _model_config(run: Path) -> dict[str, Any]:
    """The ``config`` of the run's saved model ({} where it cannot be read)."""
    try:
        config = json.loads((run / "model" / "config.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def _max_positions(run: Path) -> int | None:
    value = _model_config(run).get("max_positions")
    return value if isinstance(value, int) else None


def save_hf_tokenizer(
    tokenizer: Tokenizer,
    directory: str | os.PathLike[str],
    model_max_length: int | None = None,
    root: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (what ``AutoTokenizer`` reads) into
    ``directory``, inside the folder odelm owns ``root`` (default ``directory``: see
    ``odelm.files``); returns the names written. Nothing else in the folder is touched."""
    directory = files.make_dir(directory, root=directory if root is None else root)
    hf = to_hf_tokenizer(tokenizer, model_max_length)
    with tempfile.TemporaryDirectory(dir=directory) as staging:
        hf.save_pretrained(staging)
        config_path = Path(staging) / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        files.write_text(config_path, json.dumps(config, indent=2) + "\n")
        for name in HF_TOKENIZER_FILES:
            files.move_file(Path(staging) / name, directory / name)
    return list(HF_TOKENIZER_FILES)
