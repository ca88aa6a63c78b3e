"""Where each layer's attention parts are (`headscan.models.sites`), checked against the Hugging Face model's own
modules; the attention module names of an architecture written in that one file; no module importing another
module's private name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[1] / "headscan"


def _private_imports(path: Path, root: Path) -> list[str]:
    """'file:line: from X import _y' for every private name the module at `path` imports from another module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            found += [f"{path.relative_to(root)}:{node.lineno}: from {'.' * node.level}{node.module or ''} import "
                      f"{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not (alias.name.startswith("__") and alias.name.endswith("__"))]
    return found


def test_no_module_imports_another_modules_private_name():
    """A helper two modules share is public in a module meant for sharing; a private name stays in its module
    (imports inside functions count: ast sees every one)."""
    offending = [line for path in sorted(PACKAGE.rglob("*.py")) for line in _private_imports(path, PACKAGE.parent)]
    assert not offending, "private names imported across modules:\n" + "\n".join(offending)


def test_the_private_import_check_finds_a_planted_one(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import os\nfrom .specs import (\n    check_spec,\n    _quiet,\n)\n\n\ndef f():\n"
                       "    from ..config import __version__, _whole\n")
    assert _private_imports(planted, tmp_path) == ["planted.py:2: from .specs import _quiet",
                                                   "planted.py:9: from ..config import _whole"]


def _attention_names() -> set[str]:
    """The module names of `headscan.models.sites` that only an architecture's attention uses: those with an
    underscore or a capital (``o_proj``, ``c_attn``, ``Wqkv``) and every dotted path (``attention.output.dense``);
    plain words (``dense``, ``query``) name other things too."""
    from headscan.models import sites

    names = {*sites.OUTPUT_NAMES, *sites.OUTPUT_SIBLINGS, *sites.FUSED_QKV_NAMES,
             *(name for triple in sites.QKV_NAMES for name in triple)}
    for layout in sites.LAYOUTS:
        paths = [layout.layers, layout.query, layout.key, layout.value, layout.output, layout.norm, layout.final]
        for path in filter(None, paths):
            names |= {path, *path.split(".")}
    return {n for n in names if "_" in n or n != n.lower() or "." in n}


def test_attention_module_names_are_written_in_sites_alone():
    """Outside `headscan.models.sites`, nothing in headscan/ names an attention module, in code or docstring
    (`headscan.testing` builds checkpoints of known architectures, writing their weights by name: not a model
    read at load)."""
    names = _attention_names()
    assert {"o_proj", "c_attn", "Wqkv", "out_lin", "attention.output.dense", "input_layernorm"} <= names
    pattern = re.compile(r"(?<![\w.])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w])")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "sites.py" and path.parent.name == "models" or "testing" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(PACKAGE.parent)}:{number}: {m.group(1)}" for m in pattern.finditer(line)]
    assert not found, "attention module names outside headscan/models/sites.py:\n" + "\n".join(found)


def test_a_bridged_gpt2s_sites_are_its_own_modules(tiny_models, tiny_gpt2):
    """Each layer's output projection and value weights, compared with the modules of the checkpoint loaded
    on its own by transformers (GPT-2: Conv1D c_proj, fused c_attn whose last third is the values)."""
    from transformers import AutoModelForCausalLM

    from headscan.models.weights import heads_of

    model = tiny_models["gpt2"]
    plain = AutoModelForCausalLM.from_pretrained(tiny_gpt2).eval()
    sites = model.layer_sites
    assert model.path == "transformer_lens" and sites.layout.name == "gpt2" and sites.attention == ()
    assert len(sites.outputs) == model.n_layers == len(plain.transformer.h)
    for layer, block in enumerate(plain.transformer.h):
        assert torch.equal(sites.outputs[layer].weight, block.attn.c_proj.weight)
        assert torch.equal(sites.output(layer).weight, block.attn.c_proj.weight)
        weight, bias = heads_of(sites, layer, "v", model.n_heads)  # (head, d_model, d_head)
        d = model.d_model
        expected = block.attn.c_attn.weight[:, 2 * d:].reshape(d, model.n_heads, -1).permute(1, 0, 2)
        assert torch.equal(weight, expected) and torch.equal(bias.flatten(), block.attn.c_attn.bias[2 * d:])
        assert torch.equal(sites.norm(layer).weight, block.ln_1.weight)
    assert torch.equal(sites.final_norm.weight, plain.transformer.ln_f.weight) and sites.norm_kind() == "layer"


def test_an_encoders_output_projection_is_beside_its_attention_on_either_path(tiny_models, tiny_bert):
    """BERT keeps its output projection beside the attention module (attention.output.dense); on the hf_hooks path
    it is found from the attention module the sweep reads, on the bridge from the bridge's blocks."""
    from transformers import AutoModel

    from headscan.models.load import _via_hooks
    from headscan.models.sites import layer_sites

    plain = AutoModel.from_pretrained(tiny_bert).eval()
    hooked = _via_hooks(str(tiny_bert), device="cpu", dtype=torch.float32)
    by_hooks = layer_sites(hooked["hf_model"], attention=hooked["sites"], n_layers=hooked["n_layers"])
    for sites in (tiny_models["bert"].layer_sites, by_hooks):
        assert sites.layout.name == "bert" and sites.norm_kind() is None and sites.final_norm is None
        for layer, block in enumerate(plain.encoder.layer):
            assert torch.equal(sites.outputs[layer].weight, block.attention.output.dense.weight)
            first = sites.projections[layer][0]  # nearest the cut: attention.self's query, key and value
            for kind, own in zip("qkv", (block.attention.self.query, block.attention.self.key,
                                         block.attention.self.value)):
                module, column = first[kind]
                assert column == 0 and torch.equal(module.weight, own.weight)
    assert len(by_hooks.attention) == plain.config.num_hidden_layers


def test_a_model_without_known_sites_loads_and_is_refused_where_they_are_needed(tiny_models):
    """Nothing is refused at load: a part not found is None, and ablation names what it looked for."""
    import dataclasses

    import pytest

    from headscan.errors import ModelLoadError
    from headscan.models.ablation import head_cut
    from headscan.models.sites import OUTPUTS_SOUGHT

    model = tiny_models["gpt2"]
    blank = dataclasses.replace(model.layer_sites, outputs=(None,) * model.n_layers)
    with pytest.raises(ModelLoadError, match=re.escape(OUTPUTS_SOUGHT)):
        head_cut(dataclasses.replace(model, layer_sites=blank))
