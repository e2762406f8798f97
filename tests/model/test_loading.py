"""Loading: strictness, the 8->16 depformer expansion, sources, configs, the real key layout."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest
import torch
from _model_flows import run_lm
from safetensors.torch import load_file, save_file

from pplex_trio.model import (
    CONFIGS,
    CheckpointMismatchError,
    LMModel,
    Mimi,
    ModelAccessError,
    _loading,
    build_lm,
    build_mimi,
    config_from_kyutai_dict,
    config_to_kyutai_dict,
    load_model,
    load_state_dict_strict,
)


def _golden_lm_weights(golden_dir):
    return load_file(str(golden_dir / "model.safetensors"))


def _fresh_lm(golden_model) -> LMModel:
    with torch.device("meta"):
        return LMModel(golden_model.config.lm)


def test_missing_tensor_is_named(golden_dir, golden_model):
    weights = _golden_lm_weights(golden_dir)
    del weights["transformer.layers.1.gating.linear_out.weight"]
    with pytest.raises(
        CheckpointMismatchError, match=r"missing keys \(1\): transformer\.layers\.1\.gating\.linear_out"
    ):
        load_state_dict_strict(_fresh_lm(golden_model), weights)


def test_unexpected_tensor_is_named(golden_dir, golden_model):
    weights = _golden_lm_weights(golden_dir)
    weights["extra_heads.0.weight"] = torch.zeros(6, 64)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected keys \(1\): extra_heads\.0\.weight"):
        load_state_dict_strict(_fresh_lm(golden_model), weights)


def test_wrong_shape_is_named(golden_dir, golden_model):
    weights = _golden_lm_weights(golden_dir)
    weights["text_linear.weight"] = torch.zeros(127, 64)
    with pytest.raises(CheckpointMismatchError, match=r"text_linear\.weight \(127, 64\) \(expected \(128, 64\)\)"):
        load_state_dict_strict(_fresh_lm(golden_model), weights)


def test_mimi_file_must_match_too(golden_dir, golden_model):
    weights = load_file(str(golden_dir / "tokenizer-e351c8d8-checkpoint125.safetensors"))
    del weights["quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum"]  # an unused codebook still counts
    with torch.device("meta"):
        mimi = Mimi(golden_model.config.mimi)
    with pytest.raises(CheckpointMismatchError, match="rvq_rest.vq.layers.14._codebook.embedding_sum"):
        load_state_dict_strict(mimi, weights)


def _copy_checkpoint(golden_dir, dest):
    dest.mkdir()
    for name in ("config.json", "tokenizer-e351c8d8-checkpoint125.safetensors", "tokenizer_spm_32k_3.model"):
        shutil.copy(golden_dir / name, dest / name)
    shutil.copytree(golden_dir / "voices", dest / "voices")


def test_eight_step_checkpoint_is_expanded_to_sixteen(golden_dir, golden, golden_model, tmp_path):
    # A Moshi-layout file with 8 depformer steps, run as PersonaPlex (dep_q 16 in the config).
    full = _golden_lm_weights(golden_dir)
    eight = {}
    for key, value in full.items():
        parts = key.split(".")
        if parts[0] in ("depformer_in", "linears", "depformer_emb") and int(parts[1]) >= (
            8 if parts[0] != "depformer_emb" else 7
        ):
            continue
        if key.startswith("depformer.layers.") and ".gating." in key and int(parts[4]) >= 8:
            continue
        if ".self_attn." in key and key.startswith("depformer."):
            value = value[: value.shape[0] // 2]
        eight[key] = value.clone()
    folder = tmp_path / "eight"
    _copy_checkpoint(golden_dir, folder)
    save_file(eight, str(folder / "model.safetensors"))
    model = load_model(str(folder))
    lm = model.lm
    assert torch.equal(lm.linears[8].weight, full["linears.0.weight"])
    assert torch.equal(lm.depformer_in[15].weight, full["depformer_in.7.weight"])
    assert torch.equal(lm.depformer_emb[14].weight, full["depformer_emb.6.weight"])
    assert torch.equal(
        lm.depformer.layers[1].gating[9].linear_in.weight, full["depformer.layers.1.gating.1.linear_in.weight"]
    )
    attn = lm.depformer.layers[0].self_attn.in_proj_weight
    assert attn.shape == full["depformer.layers.0.self_attn.in_proj_weight"].shape
    assert torch.equal(attn[: attn.shape[0] // 2], attn[attn.shape[0] // 2 :])
    # Steps 0-7 are the original ones, so the agent's tokens are unchanged.
    assert (run_lm(model, golden, depformer_steps=8).tokens[-100:] == golden.output_tokens).all()


def test_folder_missing_a_file_says_which(golden_dir, tmp_path):
    folder = tmp_path / "incomplete"
    _copy_checkpoint(golden_dir, folder)
    with pytest.raises(ModelAccessError, match="model.safetensors"):
        load_model(str(folder))


def test_bad_source_is_explained():
    with pytest.raises(ModelAccessError, match="not 'tiny', not a folder"):
        load_model("no/such/folder/here")


def _hub_error(cls):
    err = cls.__new__(cls)  # these errors want an HTTP response; the message is all we need
    Exception.__init__(err, "simulated")
    return err


def test_gated_repo_says_what_to_do(monkeypatch):
    from huggingface_hub.errors import GatedRepoError

    def gated(repo, filename, **kwargs):
        raise _hub_error(GatedRepoError)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", gated)
    with pytest.raises(
        ModelAccessError, match=r"accept its licence at https://huggingface.co/nvidia/personaplex-7b-v1.*HF_TOKEN"
    ):
        load_model("nvidia/personaplex-7b-v1")


def test_hub_repo_files_are_fetched_by_their_configured_names(monkeypatch, golden_dir):
    fetched = []

    def fake_download(repo, filename, **kwargs):
        fetched.append((repo, filename))
        if filename == "voices.tgz":
            from huggingface_hub.errors import EntryNotFoundError

            raise _hub_error(EntryNotFoundError)
        return str(golden_dir / filename)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    files = _loading.resolve_checkpoint("someone/tiny-golden")
    assert [f for _, f in fetched] == [
        "config.json",
        "model.safetensors",
        "tokenizer-e351c8d8-checkpoint125.safetensors",
        "tokenizer_spm_32k_3.model",
        "voices.tgz",
        "README.md",
    ]
    assert files.voices_archive is None and files.name == "someone/tiny-golden"


RL_CARD = """---
license: cc-by-nc-4.0
language:
- en
library_name: moshi
pipeline_tag: audio-to-audio
---
# A card laid out as Hugging Face's are: YAML front matter, then the text.
"""


def _laid_out_as_the_rl_repo(folder):
    """The tiny checkpoint with the files of ``kyutai/personaplex-rl-seamless``, as PersonaPlex's code fetches
    them: the LM, Mimi and the text tokenizer by their fixed names, the voices as ``voices.tgz``, and a card."""
    import shutil
    import tarfile

    from pplex_trio.model._tiny import ensure_tiny_checkpoint

    tiny = ensure_tiny_checkpoint()
    folder.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer-e351c8d8-checkpoint125.safetensors",
        "tokenizer_spm_32k_3.model",
    ):
        shutil.copy(tiny / name, folder / name)
    with tarfile.open(folder / "voices.tgz", "w:gz") as archive:
        archive.add(tiny / "voices", arcname="voices")
    (folder / "README.md").write_text(RL_CARD)
    return folder


def test_the_rl_checkpoint_loads_by_repo_id_and_says_its_licence(monkeypatch, tmp_path, caplog):
    repo = _laid_out_as_the_rl_repo(tmp_path / "personaplex-rl-seamless")
    fetched = []

    def hub(repo_id, filename, **kwargs):
        fetched.append(filename)
        assert repo_id == "kyutai/personaplex-rl-seamless"
        return str(repo / filename)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", hub)
    monkeypatch.setenv("PPLEX_TRIO_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="pplex_trio.model"):
        model = load_model("kyutai/personaplex-rl-seamless")
    assert model.name == "kyutai/personaplex-rl-seamless" and len(model.voices.names()) >= 2
    assert "voices.tgz" in fetched and "README.md" in fetched
    said = [r for r in caplog.records if "licence" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert said[0].getMessage() == (
        "kyutai/personaplex-rl-seamless: licence CC BY-NC 4.0 with the NVIDIA Open Model "
        "License: NON-COMMERCIAL use only"
    )


def test_a_folder_says_the_licence_its_card_names(tmp_path, caplog):
    folder = _laid_out_as_the_rl_repo(tmp_path / "rl")
    with caplog.at_level(logging.INFO, logger="pplex_trio.model"):
        load_model(str(folder))
    said = [r for r in caplog.records if "licence" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in said] == [(logging.WARNING, "rl: licence cc-by-nc-4.0")]
    (folder / "README.md").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pplex_trio.model"):
        load_model(str(folder))
    said = [r for r in caplog.records if "licence" in r.getMessage()]
    assert [r.getMessage() for r in said] == ["rl: licence not stated here: read the model's card before you serve it"]


def test_empty_config_means_personaplex_7b():
    cfg = config_from_kyutai_dict({}, "nvidia/personaplex-7b-v1")
    assert cfg.lm == CONFIGS["personaplex-7b-v1"].lm and cfg.mimi == CONFIGS["personaplex-7b-v1"].mimi
    lm = cfg.lm
    assert (lm.dim, lm.num_layers, lm.num_heads, lm.dep_q, lm.context, lm.text_card, lm.card) == (
        4096,
        32,
        32,
        16,
        3000,
        32000,
        2048,
    )
    assert lm.temporal.dim_feedforward == 16896 and lm.depformer_hidden(0) == 2816


def test_kyutai_style_config_with_eight_depformer_steps():
    raw = {
        "moshi_name": "model.safetensors",
        "dim": 4096,
        "text_card": 32000,
        "existing_text_padding_id": 3,
        "n_q": 16,
        "dep_q": 8,
        "card": 2048,
        "num_heads": 32,
        "num_layers": 32,
        "hidden_scale": 4.125,
        "causal": True,
        "layer_scale": None,
        "context": 3000,
        "max_period": 10000,
        "gating": "silu",
        "norm": "rms_norm_f32",
        "positional_embedding": "rope",
        "depformer_dim": 1024,
        "depformer_dim_feedforward": 4224,
        "depformer_num_heads": 16,
        "depformer_num_layers": 6,
        "depformer_layer_scale": None,
        "depformer_multi_linear": True,
        "depformer_context": 8,
        "depformer_max_period": 10000,
        "depformer_gating": "silu",
        "depformer_pos_emb": "none",
        "depformer_weights_per_step": True,
        "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
        "lm_gen_config": {"temp": 0.8},
    }
    cfg = config_from_kyutai_dict(raw, "kyutai/moshiko-pytorch-bf16")
    assert cfg.lm.dep_q == 8 and cfg.mimi.num_codebooks == 8 and cfg.mimi.quantizer.n_q == 32


_SMALL_MOSHI = {"dim": 64, "num_heads": 4, "num_layers": 2, "card": 64, "text_card": 128, "n_q": 16, "dep_q": 8}


@pytest.mark.parametrize(
    "raw,reference",
    [
        ({}, "personaplex"),  # PersonaPlex's empty config.json: the official PersonaPlex-7B
        (_SMALL_MOSHI, "kyutai"),  # Kyutai's Moshi: dep_q < n_q, no personaplex object
        (dict(_SMALL_MOSHI, personaplex={"silence_tokens": [1] * 8, "sine_tokens": [2] * 8}), "personaplex"),
        (dict(_SMALL_MOSHI, dep_q=16, personaplex={"silence_tokens": [1] * 8, "sine_tokens": [2] * 8}), "personaplex"),
        (dict(_SMALL_MOSHI, card=2048, dep_q=16), "personaplex"),  # a depformer over the user's codebooks too
        (dict(_SMALL_MOSHI, card=2048, reference="personaplex"), "personaplex"),  # explicit, real codes fit
        (dict(_SMALL_MOSHI, dep_q=16, personaplex={}, reference="kyutai"), "kyutai"),
    ],
)
def test_reference_is_read_from_config_json(raw, reference):
    cfg = config_from_kyutai_dict(raw, "m")
    assert cfg.reference == reference and cfg.prompt.enabled == (reference == "personaplex")
    # One switch: every module's config carries the same value.
    assert (
        cfg.lm.reference
        == cfg.lm.temporal.reference
        == cfg.mimi.reference
        == cfg.mimi.transformer.reference
        == reference
    )


def test_reference_switches_every_part_at_once():
    cfg = dataclasses.replace(CONFIGS["tiny"], reference="kyutai")
    assert (cfg.lm.temporal.reference, cfg.mimi.transformer.reference) == ("kyutai", "kyutai")
    with pytest.raises(ValueError, match="unknown reference 'moshi'"):
        config_from_kyutai_dict(dict(_SMALL_MOSHI, reference="moshi"), "m")


def test_prompt_tokens_that_do_not_fit_the_codebooks_are_refused():
    # PersonaPlex's real silence codes (948, ...) on a 64-entry codebook.
    with pytest.raises(ValueError, match=r"personaplex\.silence_tokens \[948, .*0\.\.63.*config\.json"):
        config_from_kyutai_dict(dict(_SMALL_MOSHI, reference="personaplex"), "m")
    with pytest.raises(ValueError, match=r"personaplex\.sine_tokens"):
        config_from_kyutai_dict(
            dict(_SMALL_MOSHI, personaplex={"silence_tokens": [1] * 8, "sine_tokens": [64] * 8}), "m"
        )
    with pytest.raises(ValueError, match=r"personaplex\.silence_tokens .* must be 8 Mimi codes"):
        config_from_kyutai_dict(
            dict(_SMALL_MOSHI, personaplex={"silence_tokens": [1] * 7, "sine_tokens": [2] * 8}), "m"
        )
    with pytest.raises(ValueError, match=r"zero_text_code 128"):
        config_from_kyutai_dict(
            dict(_SMALL_MOSHI, personaplex={"silence_tokens": [1] * 8, "sine_tokens": [2] * 8, "zero_text_code": 128}),
            "m",
        )


def test_a_checkpoint_with_unfit_prompt_tokens_fails_at_load(golden_dir, tmp_path):
    folder = tmp_path / "unfit"
    _copy_checkpoint(golden_dir, folder)
    shutil.copy(golden_dir / "model.safetensors", folder / "model.safetensors")
    config = json.loads((golden_dir / "config.json").read_text())
    del config["personaplex"]  # falls back to PersonaPlex-7B's codes, which a 64-entry codebook lacks
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="personaplex.silence_tokens"):
        load_model(str(folder))


def test_unsupported_kyutai_feature_is_refused():
    with pytest.raises(ValueError, match="conditioners"):
        config_from_kyutai_dict({"dim": 64, "conditioners": {"x": {}}}, "x")


def test_tiny_config_round_trips_through_json():
    tiny = CONFIGS["tiny"]
    again = config_from_kyutai_dict(json.loads(json.dumps(config_to_kyutai_dict(tiny))), "tiny")
    assert dataclasses.replace(again, lm_gen={}) == tiny


def test_tiny_loads_through_the_folder_loader(tiny_model):
    assert tiny_model.name == "tiny" and tiny_model.lm.dtype == torch.float32
    assert tiny_model.tokenizer.sp.get_piece_size() == tiny_model.config.lm.text_card
    codebook = tiny_model.mimi.quantizer.rvq_first.vq.layers[0]._codebook
    assert codebook.centroids.abs().sum() > 0  # not the all-zero random init


@pytest.mark.oracle
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # moshi imports
def test_full_size_key_layout_matches_kyutai_modules():
    """Our 7B LM and real Mimi have exactly the tensors (names, shapes) of Kyutai's modules."""
    loaders = pytest.importorskip("moshi.models.loaders")
    from pplex_trio.model import convert_kyutai_state_dict

    kw = dict(loaders._lm_kwargs, dep_q=16)
    with torch.device("meta"):
        theirs = convert_kyutai_state_dict(loaders.LMModel(**kw).state_dict())
        ours = build_lm(kw, device="meta").state_dict()
        their_mimi = convert_kyutai_state_dict(loaders.get_mimi(None, device="meta").state_dict())
        our_mimi = build_mimi(None, device="meta").state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert {k: tuple(v.shape) for k, v in our_mimi.items()} == {k: tuple(v.shape) for k, v in their_mimi.items()}
