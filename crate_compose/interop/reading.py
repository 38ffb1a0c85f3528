"""Reading other code's checkpoints safely: tensors only, never code.

* a safetensors file is read directly (it holds tensors and strings, nothing else);
* a PyTorch file (``torch.save``: a zip archive or the older format) is read only through
  ``torch.load(weights_only=True)``, PyTorch's restricted unpickler, which rebuilds tensors, numbers,
  strings and containers and refuses any other global. ``argparse.Namespace`` is allowed besides:
  the training scripts the papers' code derives from (DeiT, MAE) save their command line in it, and it
  is a plain attribute holder. A file that needs anything else is refused with the name of what it
  asked for; nothing in it runs.

Checkpoints nest their weights in various ways: ``{"model": ...}`` (MAE, DeiT, nanoGPT),
``{"state_dict": ...}`` (CRATE's ImageNet script), ``{"net": ...}``; keys carry ``module.`` (saved
from ``DistributedDataParallel``) or ``_orig_mod.`` (saved from ``torch.compile``). :func:`read_checkpoint`
finds the dictionary of tensors and strips such prefixes, and says what it did. DeiT-style checkpoints
hold a second set of weights, ``model_ema`` (an average of the weights over training): ``key`` picks it.

Training scripts also record what they built beside the weights: nanoGPT's ``model_args``, CRATE's
``arch``, DeiT's and MAE's ``args`` (their command line), a hub's ``config.json`` beside a safetensors
file. :attr:`Checkpoint.recorded` keeps these as plain values (nothing else is read from them), so the
sizes of the network come from what the checkpoint says rather than from a guess.
"""

from __future__ import annotations

import argparse
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import WorkbenchError
from ..files import read_json, sha256_of

# where training scripts keep the weights, in the order they are looked for
NESTING = ("state_dict", "model", "model_state_dict", "net", "module", "params")
# prefixes that wrappers add to every key
PREFIXES = ("module.", "_orig_mod.")
SAFETENSORS_SUFFIXES = (".safetensors",)
# what training scripts record beside the weights: nanoGPT, CRATE's main.py, DeiT/MAE, transformers' config
RECORDED = ("model_args", "arch", "args", "config")
HUB_CONFIG = "config.json"  # a hub's model folder: model.safetensors beside its config.json
MAX_HUB_CONFIG = 16 << 20  # bytes of a config.json (the hubs' are a few kB)


class InteropError(WorkbenchError):
    """Another code's checkpoint that cannot be read or does not fit the spec; the message names the file.
    (A training checkpoint of this package's own that is damaged is a ``crate_compose.training.run_folder.checkpoint.CheckpointError``.)"""


@dataclass
class Checkpoint:
    """The tensors of a checkpoint file, keyed as the saving code named them, and how they were found."""

    path: Path
    tensors: dict[str, torch.Tensor]
    sha256: str
    notes: list[str] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)  # RECORDED entries found, as plain values
    key: str | None = None  # the key the weights were read from (None: the file's top level)


def read_checkpoint(path: str | Path, key: str | None = None) -> Checkpoint:
    """The tensors of ``path`` (safetensors or a PyTorch file), unwrapped and with wrapper prefixes removed,
    and what the file records about the model (:data:`RECORDED`). ``key``: the entry of the checkpoint
    to read the weights from (``model_ema``); by default the first of :data:`NESTING` that holds them."""
    path = Path(path)
    if not path.is_file():
        raise InteropError(f"{path}: no such checkpoint file" if not path.exists() else f"{path} is not a file")
    notes: list[str] = []
    safetensors = _is_safetensors(path)
    loaded = _read_safetensors(path) if safetensors else _read_pytorch(path)
    recorded = _hub_config(path, notes) if safetensors else _recorded(loaded) if isinstance(loaded, dict) else {}
    if key is not None:
        loaded = _entry(loaded, key, path, notes)
    elif isinstance(loaded, dict) and "model_ema" in loaded and not _is_state_dict(loaded):
        notes.append(
            "the checkpoint also holds 'model_ema' (an average of the weights over training); "
            "--key model_ema reads it instead"
        )
    tensors = _unwrap(loaded, path, notes)
    tensors = _strip_prefixes(tensors, notes)
    if not tensors:
        raise InteropError(f"{path} holds no tensors")
    return Checkpoint(path, tensors, sha256_of(path), notes, recorded, key)


def _entry(loaded: Any, key: str, path: Path, notes: list[str]) -> Any:
    """``loaded[key]``, or a refusal naming the entries there are."""
    if not isinstance(loaded, dict) or key not in loaded or _is_state_dict(loaded):
        there = [k for k, v in loaded.items() if isinstance(v, dict)] if isinstance(loaded, dict) else []
        raise InteropError(
            f"{path} has no entry {key!r} holding weights"
            + (f" (its entries that could: {', '.join(map(repr, there))})" if there else "")
        )
    notes.append(f"weights read from {key!r}, as asked")
    return loaded[key]


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data (numbers, strings, lists, dicts); ``argparse.Namespace`` as its dict; anything
    else (tensors, optimizer states) left out as None."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if depth >= 4:
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items() if not isinstance(v, torch.Tensor)}
    return None


def _recorded(loaded: dict) -> dict[str, Any]:
    return {key: _plain(loaded[key]) for key in RECORDED if key in loaded}


def _hub_config(path: Path, notes: list[str]) -> dict[str, Any]:
    """``{"config": ...}`` from the ``config.json`` beside a safetensors file (timm's and transformers' hubs
    keep a model so); JSON, so nothing in it runs. Read by :func:`crate_compose.files.read_json`: one that is
    there but is no regular file (a folder, a FIFO, a link to nothing), is larger than :data:`MAX_HUB_CONFIG`,
    is not UTF-8 JSON or nests deeper than the decoder could follow is refused, naming it."""
    config = path.with_name(HUB_CONFIG)
    if not os.path.lexists(config):
        return {}
    data = read_json(config, limit=MAX_HUB_CONFIG, what="the hub's config", error=InteropError)
    if not isinstance(data, dict):
        raise InteropError(f"{config}: expected a JSON object, found a {type(data).__name__}")
    notes.append(f"the model's arguments read from {config}")
    return {"config": _plain(data)}


def _is_safetensors(path: Path) -> bool:
    if path.suffix in SAFETENSORS_SUFFIXES:
        return True
    with open(path, "rb") as file:  # an 8-byte little-endian header length, then a JSON header
        head = file.read(9)
    return len(head) == 9 and head[8:9] == b"{"


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as error:  # safetensors' own error types; nothing in the file is ever executed
        raise InteropError(f"{path} is not a readable safetensors file ({type(error).__name__}: {error})") from None


def _read_pytorch(path: Path) -> Any:
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # refused or read alike
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        wanted = _what_it_asked_for(str(error))
        raise InteropError(
            f"{path} refused: it holds Python objects beyond tensors{wanted}, and reading them could run code. "
            "crate-compose reads PyTorch files only with torch.load(weights_only=True). If you trust the file, "
            "load it in Python yourself and save its state dict with safetensors.torch.save_file"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as error:
        raise InteropError(
            f"{path} is neither a safetensors nor a PyTorch checkpoint that can be read "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'truncated?'})"
        ) from None


def _what_it_asked_for(message: str) -> str:
    for line in message.splitlines():
        if "Unsupported global" in line or "GLOBAL" in line:
            return f" ({line.strip().rstrip('.')})"
    return ""


def _is_state_dict(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    )


def _unwrap(loaded: Any, path: Path, notes: list[str]) -> dict[str, torch.Tensor]:
    """The dictionary of tensors inside ``loaded``: itself, or under one of :data:`NESTING` (nested once more at most)."""
    trail: list[str] = []
    for _ in range(3):
        if _is_state_dict(loaded):
            if trail:
                notes.append(f"weights read from {'/'.join(repr(k) for k in trail)} of the checkpoint")
            return loaded
        if not isinstance(loaded, dict):
            break
        key = next((k for k in NESTING if k in loaded and isinstance(loaded[k], dict)), None)
        if key is None:
            break
        trail.append(key)
        loaded = loaded[key]
    kind = type(loaded).__name__
    keys = ", ".join(repr(k) for k in list(loaded)[:8]) if isinstance(loaded, dict) else ""
    raise InteropError(
        f"{path} holds no dictionary of tensors where one is expected (found a {kind}{': ' + keys if keys else ''}); "
        f"looked under {', '.join(repr(k) for k in NESTING)}"
    )


def _strip_prefixes(tensors: dict[str, torch.Tensor], notes: list[str]) -> dict[str, torch.Tensor]:
    for _ in range(len(PREFIXES)):
        prefix = next((p for p in PREFIXES if all(k.startswith(p) for k in tensors)), None)
        if prefix is None:
            break
        tensors = {k[len(prefix) :]: v for k, v in tensors.items()}
        notes.append(f"the prefix {prefix!r} was removed from every key")
    return tensors
