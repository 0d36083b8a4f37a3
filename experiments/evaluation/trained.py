"""``load_run(run_dir)``: a trained run as a Python object, with no corpus on disk.

A finished run directory holds everything needed to use its model: ``model/``
(``config.json`` + ``model.safetensors``, written by the model's ``save_pretrained``),
``tokenizer`` (the vocabulary file, or a BPE directory) and ``config.yaml``::

    import experiments

    run = experiments.load_run("runs/my-run")
    run.perplexity(["the cat sat on the mat"])  # per-word perplexity of new text
    run.generate("the cat", max_new_tokens=20)  # prompt + continuation, as text
    run.evaluate("test")  # what `odelm eval RUN --json` prints

``generate`` and ``evaluate`` take the options of ``odelm generate`` and ``odelm eval``
under the same names, with the same defaults (``--top-k`` is ``top_k=``, ``--seed 1`` is
``seed=1``), so a call and its command give the same output.

``run.model`` and ``run.tokenizer`` are the trained model (eval mode) and its tokenizer;
``run.data()`` loads the run's own corpus, encoded with that tokenizer, for evaluation,
refusing a split whose tokens differ from those the run recorded (``data_sha256``).

Loading checks the run before using it: the files odelm recorded must be unchanged
(``experiments.training.runfolder``), the model must be one of the library's architectures with
intact, finite weights (``odelm.pretrained``), and the tokenizer must be readable and
match the model's vocabulary. Each failure is one [`OdelmError`][odelm.errors.OdelmError].
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.data.checksums import run_record
from experiments.data.tokenization import (
    EncodedSplit,
    LMData,
    Tokenizer,
    VocabularyMismatchError,
    check_tokenizer,
    encode_corpus,
    load_tokenizer,
)
from experiments.evaluation.devices import resolve_device
from experiments.training.config import RunConfig, load_run_config
from experiments.training.datamodule import config_corpus
from experiments.training.runfolder import COMPARISON_MARKER, split_checksums, verify_run_files
from experiments.training.runs import CONFIG_FILE, MODEL_DIR
from odelm.contract import model_device
from odelm.errors import OdelmError
from odelm.pretrained import load_pretrained, read_config

TOKENIZER_FILE = "tokenizer"
UNK = "<unk>"  # the out-of-vocabulary word of PTB-style corpora


class RunNotFoundError(OdelmError, FileNotFoundError):
    """A directory is not a finished run (no saved model, tokenizer or config)."""


class CorruptTokenizerError(OdelmError, ValueError):
    """A run's tokenizer file cannot be read."""


class DataChangedError(OdelmError, ValueError):
    """A split of the run's corpus differs from the one the run was trained and tested on."""


def detokenize(tokenizer: Tokenizer, ids: list[int]) -> str:
    """Text of ``ids``; each ``<eos>`` (a line end in the corpus) becomes a line break."""
    lines: list[str] = []
    line: list[int] = []
    for token in [*ids, None]:
        if token is None or token == tokenizer.eos_id:
            if tokenizer.kind == "bpe":
                lines.append(tokenizer.bpe.decode(line))  # type: ignore[attr-defined]
            else:
                lines.append(" ".join(tokenizer.id_to_token(i) for i in line))
            line = []
        else:
            line.append(token)
    return "\n".join(text.strip() for text in lines)


@dataclass
class TrainedRun:
    """A trained model with its tokenizer and run config: score and continue new text."""

    model: nn.Module
    tokenizer: Tokenizer
    config: RunConfig
    run_dir: Path

    def encode(self, text: str) -> list[int]:
        """Token ids of whitespace-separated words; out-of-vocabulary words become ``<unk>``
        when the word vocabulary has it."""
        words = text.split()
        index = getattr(self.tokenizer, "index", None)
        if index is None:
            return self.tokenizer.encode_words(words)
        unknown = [word for word in words if word not in index]
        if unknown and UNK not in index:
            raise VocabularyMismatchError(
                f"{unknown[0]!r} is not in this run's closed vocabulary of "
                f"{self.tokenizer.vocab_size} words, which has no {UNK}; use its words only"
            )
        return self.tokenizer.encode_words([UNK if word in unknown else word for word in words])

    def decode(self, ids: list[int]) -> str:
        """Text of token ids; each ``<eos>`` (a line end in the corpus) becomes a newline."""
        return detokenize(self.tokenizer, ids)

    def perplexity(
        self,
        texts: list[str] | None = None,
        *,
        split: str | None = None,
        per: str = "word",
        allow_noncausal: bool = False,
        data_dir: str | None = None,
        allow_changed_data: bool = False,
        batch_invariant: bool = True,
    ) -> float:
        """Perplexity of ``texts`` (each one a line ending with ``<eos>``), scored as the
        run's evaluation scores its test split: per word, ``exp(total NLL / (words +
        lines))``; ``per="token"``, ``exp(total NLL / tokens)`` (the same for a word vocabulary).

        ``split`` instead scores that split of the run's own corpus, as ``odelm eval RUN
        --split SPLIT`` does (``data_dir``, ``allow_changed_data`` and ``batch_invariant`` as
        there)."""
        if per not in ("word", "token"):
            raise ValueError(f"per must be 'word' or 'token', got {per!r}")
        if split is not None:
            if texts is not None:
                raise ValueError("give texts or split, not both")
            result = self.evaluate(
                split,
                bleu_sentences=0,  # perplexity only: no BLEU
                allow_noncausal=allow_noncausal,
                data_dir=data_dir,
                allow_changed_data=allow_changed_data,
                batch_invariant=batch_invariant,
            )
            return float(result["ppl_per_word" if per == "word" else "ppl"])
        return self._text_perplexity(texts, per, allow_noncausal, batch_invariant)

    def _text_perplexity(
        self, texts: Any, per: str, allow_noncausal: bool, batch_invariant: bool
    ) -> float:
        """Perplexity of new lines of text (see
        [`perplexity`][experiments.evaluation.trained.TrainedRun.perplexity])."""
        from experiments.training.metrics import EvalSettings, NonCausalModelError, perplexity

        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty list of strings (or give split=)")
        if not getattr(self.model, "is_causal", False) and not allow_noncausal:
            raise NonCausalModelError(
                f"{type(self.model).__name__}.is_causal is False, so its perplexity is not a "
                "language-model perplexity; pass allow_noncausal=True to compute it anyway"
            )
        sentences = [self.encode(text) + [self.tokenizer.eos_id] for text in texts]
        ids = torch.tensor([i for sentence in sentences for i in sentence], dtype=torch.long)
        words = sum(len(text.split()) + 1 for text in texts)
        split = EncodedSplit(ids, sentences, words)
        data = LMData("text", "given texts", self.tokenizer, {"text": split})
        settings = EvalSettings.from_config(self.config)
        result = perplexity(self.model, data, "text", settings, batch_invariant=batch_invariant)
        return float(result["ppl_per_word" if per == "word" else "ppl"])

    def evaluate(
        self,
        split: str = "test",
        *,
        bleu_sentences: int | None = None,
        continuation_sentences: int | None = None,
        prompt_len: int | None = None,
        decode: str | None = None,
        allow_noncausal: bool = False,
        data_dir: str | None = None,
        allow_changed_data: bool = False,
        data: LMData | None = None,
        batch_invariant: bool = True,
    ) -> dict[str, Any]:
        """What ``odelm eval RUN`` reports (its ``--json`` object), with the same options:
        perplexity, BLEU and NFE of ``split`` of the run's corpus. The per-token perplexity
        the tables use (``ppl``) comes first, the per-word one (``ppl_per_word``) next.

        BLEU settings left None keep the run's ``eval`` config; ``data`` is the corpus
        already loaded by [`data`][experiments.evaluation.trained.TrainedRun.data] (default: loaded
        here, from ``data_dir`` if given). ``batch_invariant`` (the default): an adaptive
        solve steps each sequence on its own, so its score does not depend on its batch
        ([`odelm.invariance`][odelm.invariance]); the run's recorded test perplexity was
        scored with one shared solve per batch (``batch_invariant=False`` reproduces it)."""
        from experiments.training.metrics import EvalSettings, evaluate

        settings = EvalSettings.from_config(self.config).with_overrides(
            bleu_sentences=bleu_sentences,
            continuation_sentences=continuation_sentences,
            prompt_len=prompt_len,
            decode=decode,
        )
        if data is None:
            overrides = {"data_dir": data_dir} if data_dir else {}
            data = self.data(allow_changed_data=allow_changed_data, **overrides)
        result = evaluate(
            self.model,
            data,
            split,
            settings=settings,
            allow_noncausal=allow_noncausal,
            batch_invariant=batch_invariant,
        )
        lead: dict[str, Any] = {k: result[k] for k in ("ppl", "ppl_per_word") if k in result}
        return {**lead, **result}

    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 20,
        *,
        strategy: str = "greedy",
        num_beams: int = 4,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int = 0,
        stop_at_eos: bool = False,
        batch_invariant: bool = True,
        **options: Any,
    ) -> str:
        """``prompt`` followed by the model's continuation, as text: what ``odelm generate
        RUN --prompt PROMPT`` prints with the same options (same names, defaults, meaning).

        ``strategy`` is greedy, sample or beam; sampling draws from a ``torch.Generator``
        seeded with ``seed`` (0..2**64-1). Odd values are refused with one
        [`DecodingError`][odelm.decoding.DecodingError] line: a temperature below
        ``MIN_TEMPERATURE``, a ``top_p`` below ``MIN_TOP_P``, more beams than memory holds. ``options`` go to
        [`odelm.decoding.decode_continuation`][odelm.decoding.decode_continuation]: ``generator`` (a
        generator of your own, used instead of ``seed``), ``eos_id``, ``length_penalty``,
        ``use_cache``. ``batch_invariant``: as
        [`odelm.decoding.generate`][odelm.decoding.generate]'s.
        """
        from odelm.decoding import check_seed, decode_continuation

        check_seed(seed)
        device = model_device(self.model)  # the prompt and the generator live beside it
        options.setdefault("generator", torch.Generator(device=device).manual_seed(seed))
        if stop_at_eos:
            options.setdefault("eos_id", self.tokenizer.eos_id)
        ids = [self.tokenizer.eos_id, *self.encode(prompt)]
        new = decode_continuation(
            self.model,
            torch.tensor([ids], device=device),
            max_new_tokens,
            strategy=strategy,
            num_beams=num_beams,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            batch_invariant=batch_invariant,
            **options,
        )
        text = self.decode(new).rstrip("\n")
        return prompt + ("" if text.startswith("\n") else " ") + text

    def data(self, *, allow_changed_data: bool = False, **overrides: Any) -> LMData:
        """The run's corpus encoded with the run's tokenizer (needs the corpus on disk);
        ``overrides`` replace ``data`` settings such as ``data_dir``. A split whose tokens
        differ from the run's record is refused unless ``allow_changed_data``."""
        data = encode_corpus(config_corpus(self.config.data, **overrides), self.tokenizer)
        if not allow_changed_data:
            self.check_data(data)
        return data

    def check_data(self, data: LMData) -> None:
        """Refuse splits whose checksums differ from those the run recorded: in its
        ``result.json`` and in its marker (which stands in for a damaged ``result.json``);
        a damaged ``result.json`` with no record in the marker is refused too."""
        path = self.run_dir / "result.json"
        try:
            result = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            result = None
        result = result if isinstance(result, dict) else None
        given = [run_record(self.run_dir).get("data_sha256"), (result or {}).get("data_sha256")]
        records: list[dict[str, Any]] = [r for r in given if isinstance(r, dict)]
        if result is None and not records:
            raise DataChangedError(
                f"{path} is damaged and the run's marker records no split checksums, so the "
                "splits cannot be checked against those the run was tested on; restore "
                "result.json, or pass --allow-changed-data to score the data anyway"
            )
        actual = split_checksums(data)
        changed = sorted(
            {k for record in records for k, v in record.items() if k in actual and actual[k] != v}
        )
        if changed:
            raise DataChangedError(
                f"the {', '.join(changed)} split of {data.corpus_name} differs from the one "
                f"run {self.run_dir} was trained and tested on (its SHA-256 changed); restore "
                "the data, or pass --allow-changed-data to score the new data anyway"
            )


def load_run(
    run_dir: str | os.PathLike[str],
    map_location: str | torch.device = "cpu",
    *,
    device: str | torch.device | None = None,
) -> TrainedRun:
    """The model, tokenizer and config of a finished run, refusing a mismatched tokenizer.

    The model is put on ``device`` (``map_location`` is its older name; ``device`` wins;
    ``"auto"``: CUDA when a GPU is visible, else the CPU);
    ``generate`` and ``evaluate`` then run there."""
    run_dir = Path(run_dir)
    missing = [
        name for name in (MODEL_DIR, TOKENIZER_FILE, CONFIG_FILE) if not (run_dir / name).exists()
    ]
    runs = sorted(path.name for path in (run_dir / "runs").glob("*") if path.is_dir())
    if missing and (run_dir / COMPARISON_MARKER).exists() and runs:
        raise RunNotFoundError(
            f"{run_dir} is a comparison folder (odelm compare), not a run; pick one of its "
            f"runs ({', '.join(runs)}) as {run_dir / 'runs' / 'NAME'}, e.g. "
            f"{run_dir / 'runs' / runs[0]}"
        )
    if missing:
        raise RunNotFoundError(
            f"{run_dir} is not a finished run (missing {', '.join(missing)}); train it first "
            "(odelm train), or retrain a run written before models were saved in RUN/model"
        )
    verify_run_files(run_dir)
    tokenizer = _read_tokenizer(run_dir / TOKENIZER_FILE)
    saved = read_config(run_dir / MODEL_DIR)
    if "tokenizer" in saved.get("metadata", {}):
        check_tokenizer(saved["metadata"]["tokenizer"], tokenizer)
    vocab = saved["config"].get("vocab_size")
    if isinstance(vocab, int) and vocab != tokenizer.vocab_size:
        raise VocabularyMismatchError(
            f"{run_dir / TOKENIZER_FILE} has {tokenizer.vocab_size} tokens but the model's "
            f"vocabulary has {vocab}; restore the run's own tokenizer"
        )
    where = resolve_device(device or map_location)  # auto: cuda when available
    model = load_pretrained(run_dir / MODEL_DIR).to(where)  # checked on CPU
    return TrainedRun(model, tokenizer, load_run_config(run_dir / CONFIG_FILE), run_dir)


def _read_tokenizer(path: Path) -> Tokenizer:
    """The run's tokenizer, or one line naming the file when it cannot be read."""
    try:
        return load_tokenizer(path)
    except Exception as error:  # the Rust BPE reader raises bare Exception
        if isinstance(error, (OdelmError, FileNotFoundError)):
            raise
        raise CorruptTokenizerError(
            f"{path} is not a tokenizer odelm can read ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no detail'}); restore the run's "
            "own tokenizer"
        ) from None
