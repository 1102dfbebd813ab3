"""Trained weights as kept by runs: a safetensors file (tensors only, nothing to unpickle).

>>> import tempfile, torch
>>> from safetensors.torch import load_file
>>> with tempfile.TemporaryDirectory() as d:
...     path = save_weights({"w": torch.ones(2, 3).t(), "b": torch.zeros(3)}, f"{d}/m.safetensors")
...     sorted(load_file(str(path)).items(), key=lambda kv: kv[0])[1][1].shape
torch.Size([3, 2])
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

WEIGHTS_FILE = "model.safetensors"  # what a run keeps under ``model/``
LEGACY_WEIGHTS_FILE = "state_dict.pt"  # older runs: a torch.save of tensors (read with weights_only)


def save_weights(state: Mapping[str, Any], path: str | Path) -> Path:
    """Write a state dict to ``path`` as safetensors (each tensor a contiguous CPU copy, so tied or
    strided tensors are stored on their own), with the mode of any new file; returns the path."""
    from safetensors.torch import save

    tensors = {}
    for key, value in state.items():
        if not hasattr(value, "detach"):
            raise ValueError(f"state dict entry {key!r} is not a tensor: {type(value).__name__}")
        tensors[key] = value.detach().to("cpu").contiguous().clone()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(save(tensors))  # a plain write: the umask's mode (safetensors' save_file makes 0600)
    return path
