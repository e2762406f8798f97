"""Loading a Kyutai speech-to-text checkpoint: ``tiny-stt``, a Hugging Face repo id, or a local folder.

The same conventions as the conversation model's loader
(:mod:`~pplex_trio.model._loading`): files named by ``config.json``
(``moshi_name``, ``mimi_name``, ``tokenizer_name``, ``mimi_config_name``),
modules built on the ``meta`` device from the config, weights loaded
strictly onto the target device, the LM in bfloat16 on CUDA and float32
elsewhere, Mimi in float32, and the licence said at load.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from .._sources import is_repo_id
from ._checkpoint import load_state_dict_strict, read_safetensors
from ._loading import (
    CheckpointFiles,
    ModelAccessError,
    _files_in_folder,
    _hub_download,
    _read_config,
    lm_dtype_for,
    resolve_checkpoint,
)
from ._mimi import Mimi
from ._stt_config import STT_REPOS, STTConfig, stt_config_from_dict
from ._text import TextTokenizer
from ._transcriber import SpeechToText

logger = logging.getLogger(__name__)

TINY_STT = "tiny-stt"
"""The source name of the random-weight speech-to-text model
(:func:`~pplex_trio.model._tiny_stt.ensure_tiny_stt_checkpoint`)."""

DEFAULT_STT_REPO = STT_REPOS[0]
"""``kyutai/stt-1b-en_fr``: the small model, 0.5 s behind the caller, with the end-of-turn head."""

# Tensors of Kyutai's LM files that a model without a depformer never reads (a lone ``depformer_in.0``
# exists whenever ``depformer_multi_linear`` is off, whatever ``dep_q``).
_UNUSED = re.compile(r"^(depformer_in|depformer_emb|depformer_text_emb|depformer|linears)\.")


@dataclasses.dataclass
class LoadedTranscriber:
    """A speech-to-text model ready to run: config, weights, its Mimi and its tokenizer.

    For the published models ``mimi`` is the very Mimi PersonaPlex ships
    (the same file): an engine that already runs PersonaPlex's Mimi needs
    only its codes (``encode_frame(..., num_codebooks=config.n_q)``) and can
    drop this one.
    """

    config: STTConfig
    model: SpeechToText
    mimi: Mimi
    tokenizer: TextTokenizer
    device: torch.device

    @property
    def name(self) -> str:
        """The model's name (``kyutai/stt-1b-en_fr``, ``tiny-stt``, a folder's name...)."""
        return self.config.name


def resolve_stt_checkpoint(source: str) -> CheckpointFiles:
    """Local paths of a speech-to-text model's files: ``tiny-stt``, a local folder, or a hub repo id.

    Error handling: as :func:`~pplex_trio.model._loading.resolve_checkpoint`
    (:class:`~pplex_trio.model._loading.ModelAccessError` when files cannot
    be found or downloaded).
    """
    if source == TINY_STT:
        from ._tiny_stt import ensure_tiny_stt_checkpoint

        return _files_in_folder(ensure_tiny_stt_checkpoint(), name=TINY_STT)
    return resolve_checkpoint(source)


def load_stt_config(source: str) -> STTConfig:
    """The :class:`STTConfig` of ``source`` without its weights (``tiny-stt``, a folder, or a hub repo id: only
    its ``config.json`` is fetched).  Errors as :func:`resolve_stt_checkpoint`."""
    if source == TINY_STT:
        from ._tiny_stt import tiny_stt_config

        return tiny_stt_config()
    path = Path(source).expanduser()
    if path.is_dir():
        raw = _read_config(path / "config.json")
        mimi = json.loads((path / raw["mimi_config_name"]).read_text()) if raw.get("mimi_config_name") else None
        return stt_config_from_dict(raw, name=path.name, mimi=mimi)
    if not is_repo_id(source):
        raise ModelAccessError(f"speech-to-text model {source!r}: not {TINY_STT}, not a folder, not a repo id")
    raw = _read_config(_hub_download(source, "config.json"))
    mimi_name = raw.get("mimi_config_name")
    return stt_config_from_dict(
        raw, name=source, mimi=json.loads(_hub_download(source, mimi_name).read_text()) if mimi_name else None
    )


def load_transcriber(
    source: str = DEFAULT_STT_REPO, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> LoadedTranscriber:
    """Load a Kyutai speech-to-text model from ``source`` (``tiny-stt``, a hub repo id or a local folder).

    ``dtype`` overrides the LM's (bfloat16 on CUDA, float32 elsewhere).

    Error handling: :class:`~pplex_trio.model._loading.ModelAccessError` when
    files cannot be found or downloaded, ``ValueError`` when the checkpoint is
    not a speech-to-text model,
    :class:`~pplex_trio.model._checkpoint.CheckpointMismatchError` when the
    weights do not match its config.
    """
    device = torch.device(device)
    files = resolve_stt_checkpoint(source)
    cfg = stt_config_from_dict(files.raw_config, name=files.name, mimi=files.mimi_config)
    lm_dtype = dtype or lm_dtype_for(device)
    logger.info(
        "loading speech-to-text %s (%s, %s; %.1f s behind the caller)",
        files.name,
        str(lm_dtype).removeprefix("torch."),
        device,
        cfg.audio_delay_seconds,
    )
    if source != TINY_STT:
        licence = files.licence()  # (Kyutai's STT repos are in the table of known licences: CC-BY 4.0)
        non_commercial = re.search(r"non-commercial|by-nc", licence, flags=re.IGNORECASE) is not None
        logger.log(logging.WARNING if non_commercial else logging.INFO, "%s: licence %s", files.name, licence)
    with torch.device("meta"):
        model = SpeechToText(cfg)
        mimi = Mimi(cfg.mimi)
    weights = {
        name: tensor.to(device, lm_dtype if tensor.dtype.is_floating_point else tensor.dtype)
        for name, tensor in read_safetensors(files.lm)
        if not _UNUSED.match(name)
    }
    load_state_dict_strict(model, weights, what=f"speech-to-text weights {files.lm.name}", dtype=lm_dtype)
    del weights
    load_state_dict_strict(
        mimi,
        load_file(str(files.mimi), device=str(device)),
        what=f"Mimi weights {files.mimi.name}",
        dtype=torch.float32,
    )
    mimi.refresh()
    model.eval()
    mimi.eval()
    tokenizer = TextTokenizer(
        files.tokenizer, text_card=cfg.text_card, pad_ids=(cfg.end_of_text_padding_id, cfg.existing_text_padding_id)
    )
    return LoadedTranscriber(config=cfg, model=model, mimi=mimi, tokenizer=tokenizer, device=device)
