"""The GGUF cache: a dequantized checkpoint written once, whole or not at all, and read back as the file holds it.

The real-model check reads smollm2 as every other smollm2 test does (through the cache) and compares two of its
tensors with the `gguf` package's own dequantization of the file, an answer that involves neither headscan nor
transformers' GGUF conversion.
"""

import numpy as np
import pytest
import torch

from headscan.models import gguf as gguf_cache


@pytest.mark.parametrize("setting, want", [("off", None), ("0", None), ("~/elsewhere", "elsewhere"), ("", "headscan")])
def test_the_cache_folder_follows_headscan_cache(monkeypatch, tmp_path, setting, want):
    monkeypatch.setenv("HEADSCAN_CACHE", setting)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = gguf_cache.cache_root()
    if want is None:
        assert root is None
    else:
        assert root.name == want and str(root).startswith(str(tmp_path))


class _Saves:
    """Stands in for a model or tokenizer: save_pretrained writes a file, or then fails (a full disk, a model that cannot be saved)."""

    def __init__(self, name, fail=None):
        self.name, self.fail = name, fail

    def save_pretrained(self, folder):
        (folder / self.name).write_text("x")
        if self.fail:
            raise self.fail


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), ValueError("not serializable")])
def test_a_cache_folder_appears_whole_or_not_at_all(tmp_path, monkeypatch, failure):
    monkeypatch.setattr(gguf_cache, "_save_model", lambda model, folder: model.save_pretrained(folder))
    folder = tmp_path / "gguf" / "abc"
    gguf_cache._write(folder, _Saves("model.safetensors"), _Saves("tokenizer.json", fail=failure))
    assert not folder.exists() and list((tmp_path / "gguf").iterdir()) == []  # no partial copy left behind
    gguf_cache._write(folder, _Saves("model.safetensors"), _Saves("tokenizer.json"))
    assert sorted(p.name for p in folder.iterdir()) == ["headscan-complete", "model.safetensors", "tokenizer.json"]
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == ["abc"]


def test_an_unwritable_cache_only_costs_the_speed_up(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_cache, "_save_model", lambda model, folder: model.save_pretrained(folder))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    gguf_cache._write(blocker / "gguf" / "abc", _Saves("model.safetensors"), _Saves("tokenizer.json"))  # no raise
    assert blocker.read_text() == "not a folder"


def test_smollm2_through_the_cache_holds_the_files_dequantized_tensors(smollm2):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from headscan.models.aliases import ALIASES

    reader = GGUFReader(ALIASES["smollm2"].locate())
    tensors = {t.name: t for t in reader.tensors if t.name in ("token_embd.weight", "blk.3.ffn_down.weight")}
    # the bridge wraps the model's modules: their own parameters are under "..._original_component..."
    state = {name.replace("._original_component", ""): p for name, p in smollm2.hf_model.named_parameters()}
    model_names = {"token_embd.weight": "model.embed_tokens.weight", "blk.3.ffn_down.weight": "model.layers.3.mlp.down_proj.weight"}
    for name, tensor in tensors.items():
        want = dequantize(tensor.data, tensor.tensor_type).reshape(state[model_names[name]].shape)
        assert torch.equal(state[model_names[name]], torch.from_numpy(np.ascontiguousarray(want, dtype=np.float32))), name
    folder = gguf_cache._cached_folder(smollm2.revision)
    if folder is not None:  # the session's load went through the cache: the folder is complete
        assert (folder / gguf_cache._COMPLETE).is_file()


def test_two_loads_of_one_file_at_once_convert_it_once(tmp_path, monkeypatch):
    """The second load waits for the first one's copy instead of dequantizing the same file beside it."""
    import threading
    import time

    monkeypatch.setenv("HEADSCAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_cache, "_save_model", lambda model, folder: model.save_pretrained(folder))
    reads = []

    def slow_read(path, dtype):
        reads.append(threading.get_ident())
        time.sleep(0.5)  # long enough for the other thread to arrive while this one converts
        return _Saves("model.safetensors"), _Saves("tokenizer.json")

    monkeypatch.setattr(gguf_cache, "_read", slow_read)
    monkeypatch.setattr(gguf_cache, "_from_folder", lambda folder, dtype: ("from", folder.name))
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        gguf_cache.read_gguf(tmp_path / "m.gguf", dtype=torch.float32, sha256="sha256:" + "ab" * 32)))
        for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reads) == 1  # converted once
    assert results[0] == results[1] and results[0][0] == "from"
