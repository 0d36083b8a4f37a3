"""Hugging Face ``transformers`` models: every causal LM of the library is a ``PreTrainedModel``.

The library's model classes inherit [`HuggingFaceLM`][odelm.hf.model.HuggingFaceLM] (a
``transformers.PreTrainedModel`` with ``GenerationMixin``), so one object serves both worlds:

* the library contract, unchanged: ``logits, aux = model(tokens)`` (a positional call, or with the
  library's own keywords ``cache=``/``state=``/``attention_mask=`` a bool mask) returns an
  [`LMOutput`][odelm.hf.config.LMOutput], a named tuple ``(logits, aux)`` that also has ``.logits``;
* the Hugging Face contract: a call with ``input_ids=`` or another keyword the library never
  takes (``labels``, ``use_cache``, ``return_dict``, ``past_key_values``, ...: what
  ``transformers``, ``Trainer``, PEFT and ``pipeline`` pass) returns a
  [`CausalLMOutput`][odelm.hf.config.CausalLMOutput] (``CausalLMOutputWithPast`` plus ``nfe`` and
  ``aux``) with the loss under Hugging Face's label shift (``labels`` equal to ``input_ids``; -100
  is ignored), the training regulariser ``aux["reg"]`` added as the library's training loss adds
  it.

Each class's ``forward`` is wrapped once, when the class is defined, by a dispatcher that picks
the contract from the call; there is no second copy of any model. ``model.generate(ids,
max_new_tokens=...)`` is Hugging Face's ``GenerationMixin.generate`` (``do_sample``, ``top_k``,
``top_p``, ``temperature``, ``num_beams``, ``attention_mask``, ...), which reuses the model's own
per-stage key/value cache through [`OdelmCache`][odelm.hf.config.OdelmCache]; a call in the library's
spelling (``generate(ids, 5)``, ``strategy=``, ``eos_id=``, ``generator=``) is the library's
[`odelm.decoding.generate`][odelm.decoding.generate].

``model.config`` is a ``transformers`` config ([`OdelmConfig`][odelm.hf.config.OdelmConfig], one
subclass with a registered ``model_type`` per model class) that wraps the library's frozen
config: ``model.config.library_config`` is that dataclass, and its fields read through
(``model.config.n_layers``). ``config.json`` gains ``model_type``; importing this module (every
model package does) registers the types with ``AutoConfig`` and ``AutoModelForCausalLM``, so
``AutoModelForCausalLM.from_pretrained(RUN / "model")`` loads a run with no
``trust_remote_code``. Loading goes through [`odelm.pretrained`][odelm.pretrained]: weights-only
safetensors, the library's whitelist of classes, the recorded SHA-256.
"""

from odelm.hf.auto import register_all
from odelm.hf.config import (
    CausalLMOutput,
    HuggingFaceError,
    LMOutput,
    OdelmCache,
    OdelmConfig,
    config_class_for,
)
from odelm.hf.model import HuggingFaceLM
from odelm.hub import MODEL_TYPES

__all__ = [
    "MODEL_TYPES",
    "CausalLMOutput",
    "HuggingFaceError",
    "HuggingFaceLM",
    "LMOutput",
    "OdelmCache",
    "OdelmConfig",
    "config_class_for",
    "register_all",
]

register_all()
