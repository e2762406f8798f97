"""Strict loading of moshi-saved checkpoints, and running a Kyutai (8-step) checkpoint as PersonaPlex.

``tests/model`` covers strict loading on the golden (PersonaPlex) layout;
here the files are Kyutai's dep_q 8 layout as moshi 0.2.13 writes and reads
it, and moshi is the judge: whatever our loader rejects, moshi's strict
loader rejects too, and the 8 -> 16 depformer expansion must leave the
text and agent audio exactly what moshi computes from the 8-step file.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest

pytest.importorskip("moshi")

import _moshi_ref as ref  # noqa: E402
import _ours  # noqa: E402
import _tiny_moshi as tiny  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from pplex_trio.model import CheckpointMismatchError  # noqa: E402

pytestmark = pytest.mark.oracle


def edited_copy(source: pathlib.Path, dest: pathlib.Path, filename: str, edit) -> pathlib.Path:
    """A copy of checkpoint ``source`` whose ``filename`` tensors went through ``edit(dict)``."""
    shutil.copytree(source, dest)
    state = load_file(str(dest / filename))
    edit(state)
    save_file(state, str(dest / filename))
    return dest


EDITS = {
    "missing-lm": (
        tiny.MOSHI_NAME,
        lambda s: s.pop("depformer.layers.1.gating.5.linear_in.weight"),
        "depformer.layers.1.gating.5.linear_in.weight",
    ),
    "extra-lm": (
        tiny.MOSHI_NAME,
        lambda s: s.update({"depformer_in.8.weight": s["depformer_in.0.weight"].clone()}),
        "depformer_in.8.weight",
    ),
    "wrong-shape-lm": (tiny.MOSHI_NAME, lambda s: s.update({"emb.3.weight": s["emb.3.weight"][:-1]}), "emb.3.weight"),
    "missing-mimi": (
        tiny.MIMI_NAME,
        lambda s: s.pop("quantizer.rvq_rest.vq.layers.4._codebook.embedding_sum"),
        "quantizer.rvq_rest.vq.layers.4._codebook.embedding_sum",
    ),
    "extra-mimi": (
        tiny.MIMI_NAME,
        lambda s: s.update({"decoder.model.99.conv.conv.weight": torch.zeros(1)}),
        "decoder.model.99.conv.conv.weight",
    ),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_a_wrong_tensor_fails_naming_it(case: str, tiny_checkpoints, tmp_path: pathlib.Path) -> None:
    filename, edit, key = EDITS[case]
    broken = edited_copy(tiny_checkpoints["kyutai-dep8"], tmp_path / case, filename, edit)
    with pytest.raises(CheckpointMismatchError, match=key.replace(".", r"\.")):
        _ours.load(broken)
    # moshi's own strict loader refuses the same file (so the edit really breaks the layout).
    with pytest.raises(RuntimeError):
        tiny.load_moshi_lm(broken) if filename == tiny.MOSHI_NAME else tiny.load_moshi_mimi(broken)


def test_moshi_saved_kyutai_layout_loads(tiny_checkpoints) -> None:
    """The unedited Kyutai checkpoint loads with every tensor equal to moshi's after moshi's own load."""
    directory = tiny_checkpoints["kyutai-dep8"]
    ours = _ours.load(directory)
    assert ours.config.lm.dep_q == 8 and ours.config.mimi.num_codebooks == 8
    moshi_lm = tiny.load_moshi_lm(directory)
    # Our LM keeps the file's layout; moshi splits the fused attention weights per step.
    expected = tiny.to_official_keys(moshi_lm.state_dict())
    got = ours.lm.state_dict()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


@pytest.fixture(scope="module")
def expanded_checkpoint(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The Kyutai dep_q 8 files under a PersonaPlex config (dep_q 16 and a ``personaplex`` object)."""
    dest = tmp_path_factory.mktemp("expand") / "kyutai-as-personaplex"
    shutil.copytree(tiny_checkpoints["kyutai-dep8"], dest)
    config = tiny.read_config(dest)
    config["dep_q"] = 16
    config["personaplex"] = tiny.personaplex_config()
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def test_eight_step_checkpoint_is_expanded_as_the_reference_does(expanded_checkpoint: pathlib.Path) -> None:
    """Steps 8-15 are copies of steps 0-7 (fused attention weights concatenated with themselves)."""
    lm = _ours.load(expanded_checkpoint).lm
    source = load_file(str(expanded_checkpoint / tiny.MOSHI_NAME))
    state = lm.state_dict()
    for s in range(8):
        for name in ("depformer_in", "linears"):
            assert torch.equal(state[f"{name}.{s + 8}.weight"], source[f"{name}.{s}.weight"])
        for j in range(2):
            for io in ("in", "out"):
                key = f"depformer.layers.{j}.gating.{{}}.linear_{io}.weight"
                assert torch.equal(state[key.format(s + 8)], source[key.format(s)])
    for s in range(7):
        assert torch.equal(state[f"depformer_emb.{s + 8}.weight"], source[f"depformer_emb.{s}.weight"])
    for j in range(2):
        for key in (
            f"depformer.layers.{j}.self_attn.in_proj_weight",
            f"depformer.layers.{j}.self_attn.out_proj.weight",
        ):
            assert torch.equal(state[key], torch.cat([source[key], source[key]]))


def test_expanded_checkpoint_speaks_like_moshi_on_the_eight_step_file(
    expanded_checkpoint: pathlib.Path, tiny_checkpoints, user_codes
) -> None:
    """Run as PersonaPlex, the expanded model's text and agent audio are moshi's on the original file.

    Steps 8-15 are teacher-forced and come after the agent's, so the
    expansion must not change a single agent token.
    """
    ours = _ours.load(expanded_checkpoint)
    assert ours.config.lm.dep_q == 16
    codes = user_codes["kyutai-dep8"][:1, :100]
    got = _ours.lm_generate(ours, codes)
    expected = ref.lm_generate(
        tiny.load_moshi_lm(tiny_checkpoints["kyutai-dep8"]),
        codes,
        semantics=ref.checkpoint_semantics(expanded_checkpoint),
    )
    np.testing.assert_array_equal(got, expected)
