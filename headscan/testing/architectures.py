"""Tiny random checkpoints of every architecture family headscan supports, and the support matrix they verify.

`ARCHITECTURES` is the one list: `build_architecture_checkpoint` writes a 2-layer, 4-head, 64-wide
checkpoint of any of them (random weights, a ~1000-token vocabulary, tokenizer included, offline, in well
under a second), ``tests/test_architectures.py`` sweeps each one and checks every head metric against a plain
computation from Hugging Face's eager attention weights, and `support_matrix_markdown` prints the table
docs/architectures.md carries. The weights are random, so the scores mean nothing; only their agreement does.

Nothing here loads or scores a model: that is `headscan.models` and `headscan.scan`.
"""

from __future__ import annotations

import copy
import functools
import pathlib
from dataclasses import dataclass, field

import torch

from headscan.testing.checkpoints import TEXT, WORDS, bert_tokenizer

__all__ = ["Architecture", "ARCHITECTURES", "architecture", "build_architecture_checkpoint", "support_matrix_markdown"]

N_LAYERS, N_HEADS, D_MODEL, MAX_POSITIONS = 2, 4, 64, 128

# Byte-level BPE specials, in RoBERTa's order so its pad id is 1 as in the real model.
_BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", "<|endoftext|>"]
_NO_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob")
_TOKENIZERS = {"wordpiece": "WordPiece", "roberta": "byte-level BPE, `<s>` ... `</s>`", "bpe": "byte-level BPE",
               "bpe+bos": "byte-level BPE that adds BOS itself"}


@dataclass(frozen=True)
class Architecture:
    """One row of the support matrix: how to build a tiny checkpoint of it, and what the test expects."""

    name: str  # the Hugging Face model_type, e.g. "deberta-v2"
    label: str  # how people name it, e.g. "DeBERTa-v2"
    family: str  # "bidirectional" or "causal": what headscan must detect
    model_class: str  # the transformers class written by save_pretrained
    config: dict  # keyword arguments of its config class, beyond vocabulary and special token ids
    tokenizer: str  # "wordpiece", "roberta" (byte-level BPE, <s> ... </s>), "bpe" (GPT-2's), "bpe+bos" (adds BOS itself)
    path: str  # the hooking path headscan must pick: "transformer_lens" or "hf_hooks"
    notes: str = ""  # what matters for later work (long-context recompute), e.g. ALiBi, sliding window
    n_kv_heads: int = N_HEADS  # key/value heads per layer the checkpoint has
    default_bos: bool | None = None  # causal: whether a sweep puts BOS first by default (TransformerLens' choice)
    config_class: str = field(default="", compare=False)  # defaults to model_class's prefix + "Config"

    @property
    def causal(self) -> bool:
        return self.family == "causal"

    @property
    def verified(self) -> str:
        """What tests/test_architectures.py checks for this row."""
        paths = "bridge and hf_hooks" if self.path == "transformer_lens" else "hf_hooks"
        bos = "; BOS on and off" if self.causal else ""
        return f"{paths}: every heads metric and its chance = HF eager attention to 1e-6{bos}"


def _encoder(**extra) -> dict:
    return {"hidden_size": D_MODEL, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
            "intermediate_size": 2 * D_MODEL, "max_position_embeddings": MAX_POSITIONS,
            **{name: 0.0 for name in _NO_DROPOUT}, **extra}


def _decoder(**extra) -> dict:
    return {"hidden_size": D_MODEL, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
            "intermediate_size": 2 * D_MODEL, "max_position_embeddings": MAX_POSITIONS, "attention_dropout": 0.0,
            **extra}


SLIDING_WINDOW = 6  # shorter than the test sentences, so the window really cuts

ARCHITECTURES: tuple[Architecture, ...] = (
    # --- encoders ------------------------------------------------------------------------------------------
    Architecture("bert", "BERT", "bidirectional", "BertForMaskedLM", _encoder(), "wordpiece", "transformer_lens",
                 "learned absolute positions"),
    Architecture("roberta", "RoBERTa", "bidirectional", "RobertaForMaskedLM",
                 _encoder(max_position_embeddings=MAX_POSITIONS + 2), "roberta", "transformer_lens",
                 "learned absolute positions, offset by pad id + 1 (usable context = max_position_embeddings - 2)"),
    Architecture("distilbert", "DistilBERT", "bidirectional", "DistilBertForMaskedLM",
                 {"dim": D_MODEL, "n_layers": N_LAYERS, "n_heads": N_HEADS, "hidden_dim": 2 * D_MODEL,
                  "max_position_embeddings": MAX_POSITIONS, "dropout": 0.0, "attention_dropout": 0.0},
                 "wordpiece", "hf_hooks", "learned absolute positions"),
    Architecture("deberta-v2", "DeBERTa-v2", "bidirectional", "DebertaV2ForMaskedLM",
                 _encoder(relative_attention=True, position_biased_input=False, pos_att_type=["p2c", "c2p"],
                          position_buckets=16, max_relative_positions=-1),
                 "wordpiece", "hf_hooks",
                 "relative position (disentangled content/position attention, log buckets); no absolute positions"),
    Architecture("electra", "ELECTRA", "bidirectional", "ElectraForMaskedLM", _encoder(embedding_size=32),
                 "wordpiece", "hf_hooks", "learned absolute positions"),
    Architecture("albert", "ALBERT", "bidirectional", "AlbertForMaskedLM", _encoder(embedding_size=32),
                 "wordpiece", "hf_hooks", "one attention module shared by all layers (layers told apart by call order)"),
    Architecture("xlm-roberta", "XLM-RoBERTa", "bidirectional", "XLMRobertaForMaskedLM",
                 _encoder(max_position_embeddings=MAX_POSITIONS + 2), "roberta", "hf_hooks",
                 "as RoBERTa: positions offset by pad id + 1"),
    Architecture("mpnet", "MPNet", "bidirectional", "MPNetForMaskedLM",
                 _encoder(max_position_embeddings=MAX_POSITIONS + 2), "roberta",
                 "hf_hooks", "learned absolute positions (offset by pad id + 1) plus a relative position bias; "
                 "older transformers code that returns weights only when asked (output_attentions)"),
    Architecture("modernbert", "ModernBERT", "bidirectional", "ModernBertForMaskedLM",
                 {"hidden_size": D_MODEL, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
                  "intermediate_size": 2 * D_MODEL, "max_position_embeddings": MAX_POSITIONS,
                  "local_attention": SLIDING_WINDOW, "layer_types": ["full_attention", "sliding_attention"],
                  "attention_dropout": 0.0, "embedding_dropout": 0.0, "mlp_dropout": 0.0},
                 "wordpiece", "hf_hooks", f"RoPE; local (sliding window, {SLIDING_WINDOW} here) and global layers"),
    # --- decoders ------------------------------------------------------------------------------------------
    Architecture("gpt2", "GPT-2", "causal", "GPT2LMHeadModel",
                 {"n_embd": D_MODEL, "n_layer": N_LAYERS, "n_head": N_HEADS, "n_positions": MAX_POSITIONS,
                  "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                 "bpe", "transformer_lens", "learned absolute positions", default_bos=True),
    Architecture("gpt_neox", "GPT-NeoX (Pythia)", "causal", "GPTNeoXForCausalLM",
                 _decoder(hidden_dropout=0.0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.25}),
                 "bpe", "transformer_lens", "partial RoPE (a quarter of each head), parallel attention and MLP", default_bos=False),
    Architecture("opt", "OPT", "causal", "OPTForCausalLM",
                 {"hidden_size": D_MODEL, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
                  "ffn_dim": 2 * D_MODEL, "max_position_embeddings": MAX_POSITIONS, "word_embed_proj_dim": D_MODEL,
                  "dropout": 0.0, "attention_dropout": 0.0},
                 "bpe+bos", "transformer_lens", "learned absolute positions (offset 2)", default_bos=True),
    Architecture("llama", "Llama", "causal", "LlamaForCausalLM", _decoder(num_key_value_heads=2), "bpe+bos",
                 "transformer_lens", "RoPE; grouped-query attention", n_kv_heads=2, default_bos=True),
    Architecture("mistral", "Mistral", "causal", "MistralForCausalLM",
                 _decoder(num_key_value_heads=2, sliding_window=SLIDING_WINDOW), "bpe+bos", "transformer_lens",
                 f"RoPE; grouped-query; sliding window on every layer ({SLIDING_WINDOW} here)", n_kv_heads=2, default_bos=True),
    Architecture("qwen2", "Qwen2", "causal", "Qwen2ForCausalLM", _decoder(num_key_value_heads=2), "bpe",
                 "transformer_lens", "RoPE; grouped-query; q/k/v biases", n_kv_heads=2, default_bos=False),
    Architecture("qwen3", "Qwen3", "causal", "Qwen3ForCausalLM", _decoder(num_key_value_heads=2, head_dim=16), "bpe",
                 "transformer_lens", "RoPE; grouped-query; q/k RMSNorm", n_kv_heads=2, default_bos=False),
    Architecture("gemma2", "Gemma 2", "causal", "Gemma2ForCausalLM",
                 _decoder(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
                          layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=50.0,
                          final_logit_softcapping=30.0),
                 "bpe+bos", "transformer_lens",
                 f"RoPE; grouped-query; sliding window on alternate layers ({SLIDING_WINDOW} here); "
                 "attention logit soft-capping (tanh, 50)", n_kv_heads=2, default_bos=True),
    Architecture("phi", "Phi", "causal", "PhiForCausalLM",
                 _decoder(resid_pdrop=0.0, embd_pdrop=0.0,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                 "bpe", "transformer_lens", "partial RoPE (half of each head), parallel attention and MLP", default_bos=False),
    Architecture("bloom", "BLOOM", "causal", "BloomForCausalLM",
                 {"hidden_size": D_MODEL, "n_layer": N_LAYERS, "n_head": N_HEADS, "hidden_dropout": 0.0,
                  "attention_dropout": 0.0},
                 "bpe", "transformer_lens", "ALiBi (linear distance bias per head, no position embeddings)", default_bos=False),
    Architecture("gemma3_text", "Gemma 3", "causal", "Gemma3ForCausalLM",
                 _decoder(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
                          layer_types=["sliding_attention", "full_attention"]),
                 "bpe+bos", "transformer_lens",
                 f"RoPE (local and global bases); grouped-query; q/k RMSNorm; sliding window on local layers "
                 f"({SLIDING_WINDOW} here)", n_kv_heads=2, config_class="Gemma3TextConfig", default_bos=True),
    Architecture("phi3", "Phi-3", "causal", "Phi3ForCausalLM", _decoder(num_key_value_heads=2, resid_pdrop=0.0,
                                                                       embd_pdrop=0.0),
                 "bpe+bos", "transformer_lens", "RoPE; grouped-query; fused qkv", n_kv_heads=2, default_bos=True),
    Architecture("olmo2", "OLMo 2", "causal", "Olmo2ForCausalLM", _decoder(num_key_value_heads=2), "bpe",
                 "transformer_lens", "RoPE; grouped-query; q/k RMSNorm after projection", n_kv_heads=2, default_bos=True),
    Architecture("stablelm", "StableLM", "causal", "StableLmForCausalLM",
                 _decoder(num_key_value_heads=2, hidden_dropout=0.0), "bpe", "transformer_lens",
                 "partial RoPE (a quarter of each head); grouped-query", n_kv_heads=2, default_bos=True),
    Architecture("falcon", "Falcon", "causal", "FalconForCausalLM",
                 {"hidden_size": D_MODEL, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
                  "num_kv_heads": 1, "multi_query": True, "parallel_attn": True, "hidden_dropout": 0.0,
                  "attention_dropout": 0.0, "max_position_embeddings": MAX_POSITIONS},
                 "bpe", "transformer_lens", "RoPE; multi-query attention (one key/value head); parallel attention "
                 "and MLP", n_kv_heads=1, default_bos=True),
    Architecture("gpt_neo", "GPT-Neo", "causal", "GPTNeoForCausalLM",
                 {"hidden_size": D_MODEL, "num_layers": N_LAYERS, "num_heads": N_HEADS,
                  "max_position_embeddings": MAX_POSITIONS,
                  "attention_types": [[["global", "local"], 1]], "window_size": SLIDING_WINDOW,
                  "resid_dropout": 0.0, "embed_dropout": 0.0, "attention_dropout": 0.0},
                 "bpe", "transformer_lens",
                 f"learned positions; local (window {SLIDING_WINDOW} here) and global layers; unscaled attention scores", default_bos=True),
)


def architecture(name: str) -> Architecture:
    """The row of `ARCHITECTURES` called `name`."""
    for row in ARCHITECTURES:
        if row.name == name:
            return row
    raise ValueError(f"no architecture {name!r}; choose from {', '.join(a.name for a in ARCHITECTURES)}")


def build_architecture_checkpoint(path, name: str, *, seed: int = 0) -> pathlib.Path:
    """Write a tiny randomly initialised checkpoint of architecture `name`, with its tokenizer, into `path`.

    Parameters
    ----------
    path : str or os.PathLike
        Folder to write into; created if missing. ``from_pretrained(path)`` and `headscan.models.load_model`
        accept it.
    name : str
        One of ``[a.name for a in ARCHITECTURES]``: a Hugging Face ``model_type`` such as ``"deberta-v2"``.
    seed : int
        Seed of the weights (default 0); the vocabulary never varies.

    Returns
    -------
    pathlib.Path
        ``path``, as a ``Path``.

    Examples
    --------
    >>> import tempfile
    >>> from transformers import AutoConfig
    >>> folder = build_architecture_checkpoint(tempfile.mkdtemp(), "distilbert")
    >>> config = AutoConfig.from_pretrained(folder)
    >>> config.model_type, config.n_layers, config.n_heads, config.dim
    ('distilbert', 2, 4, 64)
    """
    import transformers

    row = architecture(name)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(row.tokenizer, path)
    special = {key: getattr(tokenizer, f"{key}_token_id", None) for key in ("bos", "eos", "pad")}
    if special["pad"] is None:
        special["pad"] = special["eos"]  # GPT-2 style: no pad token of its own
    config_class = getattr(transformers, row.config_class or _config_class(row.model_class))
    config = config_class(vocab_size=len(tokenizer), **{f"{k}_token_id": v for k, v in special.items()}, **row.config)
    with torch.random.fork_rng(devices=[]):  # seed the init without changing the caller's random state
        torch.manual_seed(seed)
        model = getattr(transformers, row.model_class)(config)
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _config_class(model_class: str) -> str:
    for suffix in ("ForMaskedLM", "ForCausalLM", "LMHeadModel"):
        if model_class.endswith(suffix):
            return model_class.removesuffix(suffix) + "Config"
    raise ValueError(f"cannot tell the config class of {model_class}")


@functools.cache
def _bpe():
    """A byte-level BPE (1000 tokens) trained on the English text of headscan.testing.checkpoints."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=_BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator([TEXT, " ".join(WORDS)], trainer=trainer)
    return bpe


def _tokenizer(kind: str, folder: pathlib.Path):
    from transformers import GPT2TokenizerFast, RobertaTokenizerFast

    if kind == "wordpiece":
        return bert_tokenizer(folder)
    bpe = copy.deepcopy(_bpe())
    if kind == "roberta":
        return RobertaTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                    cls_token="<s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    if kind == "bpe":  # as GPT-2: one <|endoftext|> for BOS and EOS, no pad, nothing added by itself
        eot = "<|endoftext|>"
        return GPT2TokenizerFast(tokenizer_object=bpe, bos_token=eot, eos_token=eot, unk_token=eot)
    if kind == "bpe+bos":  # as Llama's: adds <s> by itself (add_bos_token=True)
        return GPT2TokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 pad_token="<pad>", add_bos_token=True)
    raise ValueError(f"unknown tokenizer kind {kind!r}")


def support_matrix_markdown() -> str:
    """The support matrix as a Markdown table, one row per entry of `ARCHITECTURES`.

    >>> print(support_matrix_markdown().splitlines()[0])
    | Architecture | Family | Hooking path | BOS by default | Verified | Test tokenizer | Notes for long-context work |
    """
    lines = ["| Architecture | Family | Hooking path | BOS by default | Verified | Test tokenizer | Notes for long-context work |",
             "|---|---|---|---|---|---|---|"]
    for row in ARCHITECTURES:
        family = "encoder" if row.family == "bidirectional" else "decoder"
        bos = "n/a" if row.default_bos is None else ("yes" if row.default_bos else "no")
        lines.append(f"| {row.label} (`{row.model_class}`) | {family} | `{row.path}` | {bos} | {row.verified} | "
                     f"{_TOKENIZERS[row.tokenizer]} | {row.notes} |")
    return "\n".join(lines) + "\n"
