"""Finding and loading a model: ``tiny``, a Hugging Face repo id, or a local folder.

A *source* is resolved to a set of files with the names Kyutai's and
NVIDIA's repositories use (``config.json``, ``model.safetensors``, the Mimi
and tokenizer files named in the config, ``voices.tgz`` or ``voices/``).
The config builds the modules on the ``meta`` device, then the weights are
loaded strictly (:func:`~pplex_trio.model._checkpoint.load_state_dict_strict`)
straight onto the target device.  The LM runs in bfloat16 on CUDA and
float32 elsewhere; Mimi always runs in float32.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal, overload

import torch
from safetensors.torch import load_file

from .._cache import cache_dir
from .._sources import DEFAULT_REPO, LICENCES, is_repo_id
from ._checkpoint import expand_depformer_steps, load_state_dict_strict, read_safetensors, safetensors_metadata
from ._config import CONFIGS, LM_FILE, MIMI_FILE, TOKENIZER_FILE, VOICES_ARCHIVE, MimiConfig, ModelConfig
from ._kyutai_config import config_from_kyutai_dict, lm_config_from_kwargs, mimi_config_from_dict
from ._lm import LMModel
from ._mimi import Mimi
from ._quant import (
    QUANTIZED_FILE_KEY,
    Precision,
    WeightFormat,
    fused_int8,
    is_quantized_weight,
    quantize_lm_,
    quantize_rows,
    scale_name,
)
from ._text import TextTokenizer
from ._voices import VoiceLibrary, extract_voices, voice_from_recording

logger = logging.getLogger(__name__)


class ModelAccessError(ValueError):
    """The ``--model`` value cannot be served: its files could not be found or downloaded.

    (Unknown folder or repo, gated repo without access, no connection...)  A
    ``ValueError`` because it is, in the end, a bad value for ``--model``.
    """


@dataclasses.dataclass(frozen=True)
class CheckpointFiles:
    """Local paths of one model's files (and its raw ``config.json``)."""

    name: str
    raw_config: dict[str, Any]
    lm: Path
    mimi: Path
    tokenizer: Path
    mimi_config: dict[str, Any] | None = None
    voices_dir: Path | None = None
    voices_archive: Path | None = None
    card: Path | None = None  # the model card (README.md), whose front matter names the licence

    def licence(self) -> str:
        """The model's licence, as the table of known checkpoints or its card's front matter says it."""
        if self.name in LICENCES:
            return LICENCES[self.name]
        card = _card_metadata(self.card)
        named = [str(card[key]) for key in ("license", "license_name", "license_link") if card.get(key)]
        return ", ".join(named) if named else "not stated here: read the model's card before you serve it"


def _card_metadata(card: Path | None) -> dict[str, Any]:
    if card is None:
        return {}
    from huggingface_hub.repocard import metadata_load

    try:
        return metadata_load(card) or {}
    except Exception:  # (a card's front matter that is not YAML) the licence is then not stated
        return {}


@dataclasses.dataclass
class LoadedModel:
    """Everything an engine needs: config, modules, tokenizer, voice library."""

    config: ModelConfig
    lm: LMModel
    mimi: Mimi
    tokenizer: TextTokenizer
    voices: VoiceLibrary
    device: torch.device

    @property
    def name(self) -> str:
        """The model config's name (``personaplex-7b-v1``, ``tiny``, ...)."""
        return self.config.name


@overload
def _hub_download(repo: str, filename: str, optional: Literal[False] = False) -> Path: ...


@overload
def _hub_download(repo: str, filename: str, optional: bool) -> Path | None: ...


def _hub_download(repo: str, filename: str, optional: bool = False) -> Path | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(hf_hub_download(repo, filename))
    except GatedRepoError as exc:
        raise ModelAccessError(
            f"{repo} is gated: accept its licence at https://huggingface.co/{repo} with your account, "
            "then set HF_TOKEN to an access token of that account (or run `hf auth login`)"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelAccessError(
            f"model {repo!r} is neither a local folder nor a Hugging Face repository you can read "
            "(if it is private, set HF_TOKEN)"
        ) from exc
    except LocalEntryNotFoundError as exc:  # (a subclass of EntryNotFoundError)
        raise ModelAccessError(
            f"cannot download {filename} from {repo}: no connection and not in the local cache"
        ) from exc
    except EntryNotFoundError:
        if optional:
            return None
        raise ModelAccessError(f"{repo} has no file {filename!r}") from None


def resolve_checkpoint(source: str) -> CheckpointFiles:
    """Local paths of the model files for ``tiny``, a local folder, or a hub repo id."""
    if source == "tiny":
        from ._tiny import ensure_tiny_checkpoint

        folder = ensure_tiny_checkpoint()
        return _files_in_folder(folder, name="tiny")
    path = Path(source).expanduser()
    if path.is_dir():
        return _files_in_folder(path, name=path.name)
    if not is_repo_id(source):
        raise ModelAccessError(f"model {source!r}: not 'tiny', not a folder, not a Hugging Face repo id (owner/name)")
    config_path = _hub_download(source, "config.json", optional=True)
    raw = _read_config(config_path)
    files = _named_files(raw)
    mimi_cfg = None
    if raw.get("mimi_config_name"):
        mimi_cfg = json.loads(_hub_download(source, raw["mimi_config_name"]).read_text())
    return CheckpointFiles(
        name=source,
        raw_config=raw,
        lm=_hub_download(source, files["lm"]),
        mimi=_hub_download(source, files["mimi"]),
        tokenizer=_hub_download(source, files["tokenizer"]),
        mimi_config=mimi_cfg,
        voices_archive=_hub_download(source, VOICES_ARCHIVE, optional=True),
        card=_model_card(source),
    )


def _model_card(repo: str) -> Path | None:
    try:
        return _hub_download(repo, "README.md", optional=True)
    except ModelAccessError:  # (offline, not in the cache) the card only names the licence
        return None


def load_config(source: str) -> ModelConfig:
    """The :class:`ModelConfig` of ``source`` without its weights: a named config (``CONFIGS``), a local
    folder or a hub repo id (only its ``config.json`` is fetched).  Errors as :func:`resolve_checkpoint`."""
    if source in CONFIGS:
        return CONFIGS[source]
    path = Path(source).expanduser()
    if path.is_dir():
        raw = _read_config(path / "config.json")
        mimi = json.loads((path / raw["mimi_config_name"]).read_text()) if raw.get("mimi_config_name") else None
        return config_from_kyutai_dict(raw, name=path.name, mimi=mimi)
    if not is_repo_id(source):
        raise ModelAccessError(
            f"model {source!r}: not a named config ({', '.join(CONFIGS)}), not a folder, not a "
            "Hugging Face repo id (owner/name)"
        )
    raw = _read_config(_hub_download(source, "config.json", optional=True))
    mimi = (
        json.loads(_hub_download(source, raw["mimi_config_name"]).read_text()) if raw.get("mimi_config_name") else None
    )
    return config_from_kyutai_dict(raw, name=source, mimi=mimi)


def lm_dtype_for(device: torch.device) -> torch.dtype:
    """The LM's dtype by default: bfloat16 on CUDA, float32 elsewhere (Mimi is always float32)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _read_config(path: Path | None) -> dict[str, Any]:
    if path is None or not path.is_file():
        return {}
    text = path.read_text().strip()
    return json.loads(text) if text else {}


def _named_files(raw: dict[str, Any]) -> dict[str, str]:
    return {
        "lm": raw.get("moshi_name", LM_FILE),
        "mimi": raw.get("mimi_name", MIMI_FILE),
        "tokenizer": raw.get("tokenizer_name", TOKENIZER_FILE),
    }


def _files_in_folder(folder: Path, name: str) -> CheckpointFiles:
    raw = _read_config(folder / "config.json")
    files = {k: folder / v for k, v in _named_files(raw).items()}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise ModelAccessError(f"model folder {folder} lacks {', '.join(missing)}")
    mimi_cfg = None
    if raw.get("mimi_config_name"):
        mimi_cfg = json.loads((folder / raw["mimi_config_name"]).read_text())
    archive, card = folder / VOICES_ARCHIVE, folder / "README.md"
    return CheckpointFiles(
        name=name,
        raw_config=raw,
        lm=files["lm"],
        mimi=files["mimi"],
        tokenizer=files["tokenizer"],
        mimi_config=mimi_cfg,
        voices_dir=folder / "voices" if (folder / "voices").is_dir() else None,
        voices_archive=archive if archive.is_file() else None,
        card=card if card.is_file() else None,
    )


def build_lm(lm_kwargs: dict[str, Any], device: str | torch.device | None = None) -> LMModel:
    """An :class:`LMModel` with uninitialised weights from Kyutai ``LMModel`` kwargs."""
    with torch.device(device or "cpu"):
        return LMModel(lm_config_from_kwargs(lm_kwargs))


def build_mimi(mimi_config: dict[str, Any] | None = None, device: str | torch.device | None = None) -> Mimi:
    """A :class:`Mimi` with uninitialised weights from a Kyutai Mimi config dict (None: the real Mimi).

    The dict's ``num_codebooks`` (default 8) is how many codebooks are used.
    """
    cfg = mimi_config_from_dict(mimi_config) if mimi_config else MimiConfig()
    with torch.device(device or "cpu"):
        return Mimi(cfg)


def _on_device(
    name: str, tensor: torch.Tensor, device: torch.device, dtype: torch.dtype, weights: WeightFormat
) -> dict[str, torch.Tensor]:
    """One tensor of the LM file on ``device``: in ``dtype`` if it is a float, quantized (with its scales) if it
    is one of the int8 weights and not int8 already; the file's copy is dropped as soon as this returns."""
    if not tensor.dtype.is_floating_point:
        return {name: tensor.to(device)}
    if weights is WeightFormat.INT8 and is_quantized_weight(name):
        weight, scale = quantize_rows(tensor.to(device), dtype)
        return {name: weight, scale_name(name): scale}
    return {name: tensor.to(device, dtype)}


def write_quantized(source: str, folder: Path) -> Path:
    """Write ``source``'s model to ``folder`` with its LM in int8 (``pplex-trio quantize``); returns the LM file.

    The LM is read and quantized one tensor at a time on the CPU; the other
    files (config, Mimi, tokenizer, voices) are copied as they are.
    :func:`load_model` then reads the folder without the full-precision file.
    """
    import shutil

    from safetensors.torch import save_file

    files = resolve_checkpoint(source)
    folder.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in read_safetensors(files.lm):
        dtype = tensor.dtype if tensor.dtype.is_floating_point else torch.float32
        weights.update(_on_device(name, tensor, torch.device("cpu"), dtype, WeightFormat.INT8))
    names = _named_files(files.raw_config)
    save_file(weights, str(folder / names["lm"]), metadata={QUANTIZED_FILE_KEY: str(WeightFormat.INT8)})
    (folder / "config.json").write_text(json.dumps(files.raw_config, indent=1))
    for path, name in (
        (files.mimi, names["mimi"]),
        (files.tokenizer, names["tokenizer"]),
        (files.voices_archive, VOICES_ARCHIVE),
    ):
        if path is not None:
            shutil.copyfile(path, folder / name)
    if files.raw_config.get("mimi_config_name") and files.mimi_config is not None:
        (folder / files.raw_config["mimi_config_name"]).write_text(json.dumps(files.mimi_config))
    if files.voices_dir is not None:
        shutil.copytree(files.voices_dir, folder / "voices", dirs_exist_ok=True)
    logger.info("wrote %s (int8 weights) to %s", files.name, folder)
    return folder / names["lm"]


def load_model(
    source: str = DEFAULT_REPO,
    device: str | torch.device = "cpu",
    voice_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
    precision: Precision = Precision(),
) -> LoadedModel:
    """Load a complete model from ``source`` (``tiny``, a hub repo id or a local folder).

    ``voice_dir`` overrides where voice prompts are looked up (default: the
    checkpoint's ``voices/`` folder or its ``voices.tgz``, extracted once to
    the cache).  ``dtype`` overrides the LM's dtype.  ``precision`` asks for
    int8 weights and an fp8 KV ring (:mod:`~pplex_trio.model._quant`): the
    weights are quantized as they are read, one tensor at a time on the
    device, so neither the host nor the device ever holds the
    full-precision LM.  A file written by ``pplex-trio quantize`` is int8
    already, whatever ``precision`` says.

    Error handling: :class:`ModelAccessError` when files cannot be found or
    downloaded, :class:`~pplex_trio.model._checkpoint.CheckpointMismatchError`
    when the weights do not match the config.
    """
    device = torch.device(device)
    files = resolve_checkpoint(source)
    cfg = config_from_kyutai_dict(files.raw_config, name=files.name, mimi=files.mimi_config)
    lm_dtype = dtype or lm_dtype_for(device)
    if safetensors_metadata(files.lm).get(QUANTIZED_FILE_KEY) == WeightFormat.INT8:
        precision = dataclasses.replace(precision, weights=WeightFormat.INT8)
        logger.info("%s holds int8 weights (written by pplex-trio quantize)", files.lm.name)
    logger.info(
        "loading %s (LM %s, %s; %s)", files.name, str(lm_dtype).removeprefix("torch."), device, precision.describe()
    )
    if source != "tiny":
        licence = files.licence()
        non_commercial = re.search(r"non-commercial|by-nc", licence, flags=re.IGNORECASE) is not None
        logger.log(logging.WARNING if non_commercial else logging.INFO, "%s: licence %s", files.name, licence)

    with torch.device("meta"):
        lm = LMModel(cfg.lm)
        mimi = Mimi(cfg.mimi)
    if precision.weights is WeightFormat.INT8:
        quantize_lm_(lm, lm_dtype)  # on meta: the layout of int8 weights and their scales
    lm_weights: dict[str, torch.Tensor] = {}
    for name, tensor in read_safetensors(files.lm):
        lm_weights.update(_on_device(name, tensor, device, lm_dtype, precision.weights))
    expand_depformer_steps(lm_weights, cfg.lm.dep_q)
    load_state_dict_strict(lm, lm_weights, what=f"LM weights {files.lm.name}", dtype=lm_dtype)
    del lm_weights
    lm.precision = precision
    if precision.weights is WeightFormat.INT8:
        fused_int8(device, lm_dtype)
    load_state_dict_strict(
        mimi,
        load_file(str(files.mimi), device=str(device)),
        what=f"Mimi weights {files.mimi.name}",
        dtype=torch.float32,
    )
    mimi.refresh()
    lm.eval()
    mimi.eval()

    if voice_dir is not None:
        voices = Path(voice_dir)
    elif files.voices_dir is not None:
        voices = files.voices_dir
    elif files.voices_archive is not None:
        voices = extract_voices(files.voices_archive, cache_dir())
    else:
        voices = None
    tokenizer = TextTokenizer(
        files.tokenizer,
        text_card=cfg.lm.text_card,
        pad_ids=(cfg.lm.end_of_text_padding_id, cfg.lm.existing_text_padding_id),
    )

    def make_voice(recording: Path):
        return voice_from_recording(lm, mimi, recording, cfg.prompt.sine_tokens, cfg.prompt.zero_text_code)[0]

    return LoadedModel(
        config=cfg, lm=lm, mimi=mimi, tokenizer=tokenizer, voices=VoiceLibrary(voices, make_voice), device=device
    )
