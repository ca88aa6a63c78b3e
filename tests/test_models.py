"""Loading: local checkpoints, embedded aliases, and the one-paragraph error when a model is nowhere."""

import pytest

from headscan.errors import ConfigError, ModelNotFoundError
from headscan.models import ALIASES, alias_status, load_model


def test_local_checkpoints_load_with_family_shape_and_hash(tiny_models, tiny_gpt2):
    gpt2, bert = tiny_models["gpt2"], tiny_models["bert"]
    assert (gpt2.family, gpt2.n_layers, gpt2.n_heads, gpt2.n_kv_heads) == ("causal", 2, 4, 4)
    assert (bert.family, bert.n_layers, bert.n_heads) == ("bidirectional", 2, 4)
    assert bert.special_token_ids["cls"] is not None and bert.special_token_ids["sep"] is not None
    assert gpt2.special_token_ids["sep"] is None and gpt2.source == "local"
    assert gpt2.revision.startswith("sha256:") and gpt2.id == str(tiny_gpt2)
    assert gpt2.provenance()["architecture"] == "GPT2LMHeadModel"


def test_unknown_model_offline_is_one_paragraph_with_the_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as caught:
        load_model("no-such-org/no-such-model", device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert "not in the local Hugging Face cache" in message
    assert "minilm" in message and "smollm2" in message
    assert "HF_HUB_OFFLINE=1" in message and "snapshot_download('no-such-org/no-such-model')" in message


def test_a_folder_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotFoundError, match="needs config.json"):
        load_model(str(tmp_path), device="cpu")


def test_bad_device_and_dtype_name_the_choices():
    with pytest.raises(ConfigError, match="--device 'tpu' is not one of auto, cpu, cuda, mps"):
        load_model("minilm", device="tpu")
    with pytest.raises(ConfigError, match="--dtype 'int8' is not one of float32, float16, bfloat16"):
        load_model("minilm", device="cpu", dtype="int8")


def test_aliases_are_listed_with_install_commands():
    assert set(ALIASES) == {"minilm", "smollm2"}
    assert alias_status()["minilm"] is not None  # a normal dependency
    assert "--no-deps" in ALIASES["smollm2"].install


def test_kv_group_maps_query_heads_to_their_shared_key_value_head(tiny_models):
    model = tiny_models["gpt2"]
    assert [model.kv_group(h) for h in range(4)] == [0, 1, 2, 3]
    model_gqa = type(model)(**{**model.__dict__, "n_heads": 9, "n_kv_heads": 3})
    assert [model_gqa.kv_group(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_hugging_face_ids_load_from_the_local_cache_offline(tmp_path, tiny_bert):
    """The real path for Hugging Face ids: a cache laid out as huggingface_hub writes it, read offline."""
    import shutil
    import subprocess
    import sys

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--tiny-bert"
    shutil.copytree(tiny_bert, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    script = (
        "from headscan.models import load_model; "
        "m = load_model('test-org/tiny-bert', device='cpu'); "
        "print(m.source, m.revision, m.family, m.n_layers)"
    )
    env = {**__import__("os").environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["huggingface", commit, "bidirectional", "2"]
