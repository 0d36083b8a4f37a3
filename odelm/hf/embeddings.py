"""Embeddings of a library model as ``transformers`` sees them: ``get_input_embeddings``,
``set_input_embeddings``, tied weights, ``resize_token_embeddings`` (see [`odelm.hf`][odelm.hf])."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn


class EmbeddingsMixin:
    """Subclasses set ``input_embeddings_name`` / ``output_embeddings_name`` (dotted attribute
    paths, None where the model has no such layer); tied weights are found from the modules."""

    input_embeddings_name: ClassVar[str | None] = "token_embedding"
    output_embeddings_name: ClassVar[str | None] = "head"
    resizable: ClassVar[bool] = True
    if TYPE_CHECKING:  # not at run time: transformers reads a ``config`` annotation
        config: Any

    def _module_at(self, path: str | None) -> Any:
        if path is None:
            return None
        target: Any = self
        for part in path.split("."):
            target = getattr(target, part)
        return target

    def _set_module_at(self, path: str, value: nn.Module) -> None:
        owner, _, name = path.rpartition(".")
        setattr(self._module_at(owner) if owner else self, name, value)

    def get_input_embeddings(self) -> nn.Module:
        return self._module_at(self.input_embeddings_name)

    def set_input_embeddings(self, value: nn.Module) -> None:
        if self.input_embeddings_name is None:
            raise NotImplementedError(f"{type(self).__name__} has no input embedding")
        self._set_module_at(self.input_embeddings_name, value)

    def get_output_embeddings(self) -> nn.Module | None:
        return self._module_at(self.output_embeddings_name)

    def set_output_embeddings(self, value: nn.Module) -> None:
        if self.output_embeddings_name is None:
            raise NotImplementedError(f"{type(self).__name__} has no separate output layer")
        self._set_module_at(self.output_embeddings_name, value)

    @property
    def _tied_weights_keys(self) -> dict[str, str]:  # type: ignore[override]
        """``{output weight: input embedding weight}`` when the two are one tensor."""
        inputs, outputs = self.input_embeddings_name, self.output_embeddings_name
        if inputs is None or outputs is None:
            return {}
        embedding, output = self.get_input_embeddings(), self.get_output_embeddings()
        if output is not None and output.weight is embedding.weight:
            return {f"{outputs}.weight": f"{inputs}.weight"}
        return {}

    @_tied_weights_keys.setter
    def _tied_weights_keys(self, value: Any) -> None:  # HF assigns class defaults
        pass

    def tie_weights(self, *args: Any, **kwargs: Any) -> None:
        """The library ties weights when it builds a model; nothing is left to tie."""

    def _init_weights(self, module: nn.Module) -> None:
        """Models initialise themselves when built (``transformers`` never re-initialises)."""

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = False,
    ) -> nn.Module:
        """Grow or shrink the vocabulary: embedding rows (and output rows, tied or not) are
        kept, new ones drawn N(0, 0.02) (``mean_resizing``: the old rows' mean); the model's
        ``vocab_size`` and configs follow."""
        embedding = self.get_input_embeddings()
        if new_num_tokens is None:
            return embedding
        if pad_to_multiple_of:
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        if not (self.resizable and isinstance(embedding, nn.Embedding)):
            raise NotImplementedError(f"{type(self).__name__} cannot resize its vocabulary")
        old = embedding.weight.shape[0]
        output = self.get_output_embeddings()
        tied = output is not None and output.weight is embedding.weight
        new_embedding = nn.Embedding(new_num_tokens, embedding.weight.shape[1]).to(
            embedding.weight.device, embedding.weight.dtype
        )
        _copy_rows(new_embedding.weight, embedding.weight, old, mean_resizing)
        self.set_input_embeddings(new_embedding)
        if output is not None:
            if tied:
                output.weight = new_embedding.weight
                if output.bias is not None:
                    output.bias = _resized_bias(output.bias, new_num_tokens)
            else:
                layer = nn.Linear(
                    output.in_features, new_num_tokens, bias=output.bias is not None
                ).to(output.weight.device, output.weight.dtype)
                _copy_rows(layer.weight, output.weight, old, mean_resizing)
                if output.bias is not None:
                    layer.bias = _resized_bias(output.bias, new_num_tokens)
                self.set_output_embeddings(layer)
            resized = self.get_output_embeddings()
            if isinstance(resized, nn.Linear):
                resized.out_features = new_num_tokens
        self._resized_vocabulary(new_num_tokens)
        return new_embedding

    def _resized_vocabulary(self, size: int) -> None:
        """Record the new vocabulary size on the model and its configs."""
        self.__dict__["vocab_size"] = size
        library = self.config.__dict__.get("library_config")
        if library is not None and hasattr(library, "vocab_size"):
            self.config = dataclasses.replace(library, vocab_size=size)
        self.config.vocab_size = size


def _copy_rows(new: torch.Tensor, old: torch.Tensor, rows: int, mean: bool) -> None:
    with torch.no_grad():
        keep = min(rows, new.shape[0])
        new[:keep] = old[:keep]
        if new.shape[0] > keep:
            if mean:
                new[keep:] = old.mean(0, keepdim=True)
            else:
                new[keep:].normal_(0.0, 0.02)


def _resized_bias(bias: torch.Tensor, size: int) -> nn.Parameter:
    new = bias.new_zeros(size)
    keep = min(size, bias.shape[0])
    with torch.no_grad():
        new[:keep] = bias[:keep]
    return nn.Parameter(new)
