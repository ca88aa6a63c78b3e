"""headscan.testing: tiny checkpoints load through the bridge; planted heads attend where they were told to."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformer_lens.model_bridge import TransformerBridge
from transformers import AutoConfig, AutoModel, AutoTokenizer

from headscan.testing import build_planted_checkpoint, build_tiny_checkpoint

ARCHS = ["gpt2", "bert"]


@pytest.fixture(scope="module")
def sentences(ewt_dev):
    """The first 50 sentences of the UD English EWT dev set."""
    lines = ewt_dev.read_text(encoding="utf-8").splitlines()
    return [line.removeprefix("# text = ") for line in lines if line.startswith("# text = ")][:50]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    return request.param, build_tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module", params=ARCHS)
def planted(request, tmp_path_factory):
    return request.param, *build_planted_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def _tokenizer(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token  # GPT-2 has no pad token
    return tokenizer


@functools.cache
def _eager_model(path):
    # eager: the other attention implementations may not return attention weights.
    return AutoModel.from_pretrained(path, attn_implementation="eager")


def test_tiny_checkpoint_hooks_pattern_through_bridge(tiny):
    arch, path = tiny
    bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
    assert not any(module.training for module in bridge.modules())
    tokenizer = bridge.tokenizer
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    enc = tokenizer(["the cat sat on the mat", "a"], padding=True, return_tensors="pt")
    patterns = []
    bridge.run_with_hooks(
        enc["input_ids"],
        attention_mask=enc["attention_mask"],
        fwd_hooks=[("blocks.1.attn.hook_pattern", lambda pattern, hook: patterns.append(pattern))],
    )
    (pattern,) = patterns  # (batch, head, q, k)
    assert pattern.shape == (2, 4, *enc["input_ids"].shape[1:] * 2)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    # Padding keys of the short row get no attention.
    padding = ~enc["attention_mask"][1].bool()
    assert pattern[1][..., padding].abs().max() < 1e-6


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_checkpoint_is_deterministic(arch, tmp_path):
    first = build_tiny_checkpoint(tmp_path / "first", arch, seed=0)
    again = build_tiny_checkpoint(tmp_path / "again", arch, seed=0)
    other = build_tiny_checkpoint(tmp_path / "other", arch, seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


def test_tiny_tokenizer_reads_english(tiny, sentences):
    tokenizer = _tokenizer(tiny[1])
    ids = tokenizer(sentences)["input_ids"]
    assert max(map(max, ids)) < AutoConfig.from_pretrained(tiny[1]).vocab_size
    n_tokens = sum(map(len, ids))
    n_unknown = sum(row.count(tokenizer.unk_token_id) for row in ids)
    assert n_unknown < 0.01 * n_tokens
    assert n_tokens < 4 * sum(len(s.split()) for s in sentences)  # mostly words and pieces, not bytes


def head_scores(attention, mask, name):
    """Per-sentence mean attention from each valid query to its expected key, for every head.

    attention: (batch, head, q, k); mask: (batch, seq). Returns (batch, head).
    """
    seq = mask.shape[1]
    q = torch.arange(seq)
    target = torch.zeros(seq, dtype=torch.long) if name == "first_token" else q + {
        "prev_token": -1, "next_token": 1, "offset_-2": -2}[name]
    valid = (target >= 0) & (target < seq) & (q >= 1)  # (q,)
    target = target.clamp(0, seq - 1)
    valid = valid & mask.bool() & mask.gather(1, target.expand_as(mask)).bool()  # (batch, q)
    on_target = attention[:, :, q, target]  # (batch, head, q)
    return (on_target * valid[:, None]).sum(-1) / valid.sum(-1, keepdim=True)


def test_planted_heads_attend_where_planted(planted, sentences):
    arch, path, heads = planted
    model = _eager_model(path)
    enc = _tokenizer(path)(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        attentions = model(**enc, output_attentions=True).attentions  # per layer (batch, head, q, k)
    attention = torch.stack(attentions, 1).flatten(1, 2)  # (batch, layer * head, q, k)
    n_heads = model.config.num_attention_heads
    for name, (layer, head) in heads.items():
        scores = head_scores(attention, enc["attention_mask"], name)  # (batch, layer * head)
        planted_index = layer * n_heads + head
        assert scores[:, planted_index].min() > 0.95, name
        others = torch.cat([scores[:, :planted_index], scores[:, planted_index + 1 :]], 1)
        assert others.mean(0).max() < 0.6, name


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_planted_heads_ignore_the_text(planted, data):
    """Any token ids, any lengths: the planted heads do not look at the tokens, only at positions."""
    arch, path, heads = planted
    model = _eager_model(path)
    vocab_size = model.config.vocab_size
    lengths = data.draw(st.lists(st.integers(3, 30), min_size=1, max_size=3))
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):  # right padding, pad id 0
        ids[row, :length] = torch.tensor(data.draw(st.lists(st.integers(1, vocab_size - 1), min_size=length,
                                                            max_size=length)))
        mask[row, :length] = 1
    with torch.no_grad():
        attention = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[0]
    for name, (_layer, head) in heads.items():
        assert head_scores(attention, mask, name)[:, head].min() > 0.999, name


def test_planted_heads_seen_through_bridge(planted, sentences):
    arch, path, heads = planted
    bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
    model = _eager_model(path)
    enc = _tokenizer(path)(sentences[:8], padding=True, return_tensors="pt")
    patterns = []
    bridge.run_with_hooks(
        enc["input_ids"],
        attention_mask=enc["attention_mask"],
        fwd_hooks=[("blocks.0.attn.hook_pattern", lambda pattern, hook: patterns.append(pattern))],
    )
    with torch.no_grad():
        expected = model(**enc, output_attentions=True).attentions[0]  # (batch, head, q, k)
    real = enc["attention_mask"].bool()
    pairs = real[:, None, :, None] & real[:, None, None, :]  # (batch, 1, q, k): padding rows may differ
    torch.testing.assert_close(patterns[0] * pairs, expected * pairs, atol=1e-5, rtol=1e-4)
