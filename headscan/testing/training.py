"""Train a small attention-only transformer on repeated random token runs and save a checkpoint series.

The model is Hugging Face's GPT-NeoX (``GPTNeoXForCausalLM``, Pythia's architecture) with its MLPs switched off:
each layer's MLP is one unit wide (``intermediate_size=1``) and its output projection is zero and frozen, so
the MLPs add exactly nothing and the residual stream is written by attention alone (Olsson et al. 2022's
attention-only models; the LayerNorms stay). GPT-NeoX because both hooking paths load it offline from a
``save_pretrained`` folder with no custom code (TransformerLens has an adapter for it), and because its rotary
positions (all of each head's dimensions rotated here) make "the previous token" one relative offset to learn:
with GPT-2's learned absolute positions the same model and data showed no previous-token head after 800 steps,
with rotary positions one forms within 250. Its tokenizer is a word-level one of `TrainConfig.vocab` tokens
(`word_tokenizer`).

Each training sequence is BOS followed by a random run of `TrainConfig.run_min` to `run_max` tokens (drawn
without replacement from the vocabulary less its special token), repeated until the sequence is
`TrainConfig.seq_len` long. The run's length varies from sequence to sequence, so no fixed offset predicts the
repeats: the model lowers its loss on them only by looking back at the token after an earlier occurrence of the
current one, the induction mechanism. The first copy cannot be predicted (its loss stays near ln of the
vocabulary); the in-context gap is the mean loss on first-copy tokens less that on repeated tokens, on a fixed
evaluation batch.

`train_series` writes one ``step-N`` folder per saved step (`headscan.models.series` reads them) and a
``training.jsonl`` log beside them. It is the data of ``experiments/induction_formation.py`` and of the
checkpoint-series tests (tiny widths and a few steps there).
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import asdict, dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

_EOT = "<|endoftext|>"

__all__ = ["TrainConfig", "train_series", "repeated_runs", "word_tokenizer"]


@dataclass(frozen=True)
class TrainConfig:
    """How the attention-only model is built and trained; the defaults are the experiment's."""

    n_layers: int = 2
    n_heads: int = 4
    vocab: int = 128  # tokens, BOS (id 0) included: words w1 .. w{vocab - 1}
    d_model: int = 64
    seq_len: int = 64  # tokens per training sequence, BOS included
    max_positions: int = 128  # learned positions: the longest input the checkpoints accept
    run_min: int = 4  # shortest random run
    run_max: int = 16  # longest random run
    batch_size: int = 32
    steps: int = 800  # optimiser steps
    lr: float = 3e-3
    warmup: int = 30  # steps of linear warm-up; constant afterwards
    weight_decay: float = 0.01
    save_at: tuple[int, ...] = (0, 100, 200, 300, 400, 800)  # steps whose weights are saved (0: the initialisation)
    eval_size: int = 64  # sequences in the fixed evaluation batch
    seed: int = 0


def repeated_runs(n: int, config: TrainConfig, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor,
                                                                                                    torch.Tensor]:
    """`n` training sequences and which of their tokens repeat an earlier run.

    Returns ``(ids, repeated)``: ids (n, seq_len) with BOS (id 0) first and tokens from 1 .. vocab - 1, and
    repeated (n, seq_len) True where a token is a repeat of the run (its position is at least one run's length
    after the run opened).
    """
    lengths = torch.randint(config.run_min, config.run_max + 1, (n,), generator=generator)  # (n,)
    order = torch.rand(n, vocab - 1, generator=generator).argsort(dim=1) + 1  # (n, vocab - 1) ids without BOS
    position = torch.arange(config.seq_len - 1)  # (seq - 1,) positions after BOS
    within = position[None, :] % lengths[:, None]  # (n, seq - 1) place in the run
    body = order.gather(1, within)  # (n, seq - 1)
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), body], dim=1)  # (n, seq)
    repeated = torch.cat([torch.zeros(n, 1, dtype=torch.bool), position[None, :] >= lengths[:, None]], dim=1)
    return ids, repeated


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A fast tokenizer of `vocab` tokens: ``<|endoftext|>`` (id 0: BOS, EOS and unknown) and the words ``w1`` to
    ``w{vocab - 1}``, split on white space. A small vocabulary makes each token's embedding train often enough
    for induction to form in minutes on a CPU; repeat-random draws from it as from any model's vocabulary.

    >>> word_tokenizer(8)("w1 w7 cat", add_special_tokens=False)["input_ids"]
    [1, 7, 0]
    """
    words = Tokenizer(models.WordLevel(vocab={_EOT: 0, **{f"w{i}": i for i in range(1, vocab)}}, unk_token=_EOT))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece()  # joins the words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=words, bos_token=_EOT, eos_token=_EOT, unk_token=_EOT)


def _model(config: TrainConfig, vocab: int) -> GPTNeoXForCausalLM:
    neox = GPTNeoXConfig(vocab_size=vocab, hidden_size=config.d_model, num_hidden_layers=config.n_layers,
                         num_attention_heads=config.n_heads, intermediate_size=1, rotary_pct=1.0,
                         max_position_embeddings=config.max_positions, attention_dropout=0.0, hidden_dropout=0.0,
                         bos_token_id=0, eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = GPTNeoXForCausalLM(neox)
    for layer in model.gpt_neox.layers:  # attention only: the MLP's output is zero and stays zero
        with torch.no_grad():
            layer.mlp.dense_4h_to_h.weight.zero_()
            layer.mlp.dense_4h_to_h.bias.zero_()
        for parameter in layer.mlp.parameters():
            parameter.requires_grad_(False)
    return model


def _losses(model, ids: torch.Tensor) -> torch.Tensor:
    """Per-token next-token losses, (batch, seq - 1)."""
    logits = model(input_ids=ids).logits[:, :-1]  # (batch, seq - 1, vocab)
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")


def train_series(folder, config: TrainConfig = TrainConfig(), *, progress=None) -> list[dict]:
    """Train the attention-only model and save each step of `config.save_at` into ``folder/step-N`` (its
    weights, config and tokenizer, by ``save_pretrained``).

    Returns the log, one record per saved step (also written to ``folder/training.jsonl``): ``step``,
    ``tokens`` seen, ``train_loss`` (the mean of the training losses since the previous save; NaN at step 0),
    ``eval_loss`` (the fixed evaluation batch, every predicted token), ``first_loss`` and ``repeat_loss`` (its
    first-copy and repeated tokens) and ``icl_gap`` (first_loss - repeat_loss: what the model gains from its
    context). `progress`, if given, is called with each record.

    >>> import tempfile
    >>> tiny = TrainConfig(d_model=16, n_heads=2, steps=2, save_at=(0, 2), batch_size=4, eval_size=4)
    >>> [record["step"] for record in train_series(tempfile.mkdtemp(), tiny)]
    [0, 2]
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not config.save_at or min(config.save_at) < 0 or max(config.save_at) > config.steps:
        raise ValueError(f"save_at={config.save_at} must name steps from 0 to steps={config.steps}")
    if config.seq_len > config.max_positions or config.run_max >= config.seq_len - 1:
        raise ValueError(f"seq_len={config.seq_len} must fit max_positions={config.max_positions} and hold two "
                         f"runs of run_max={config.run_max}")
    tokenizer = word_tokenizer(config.vocab)
    vocab = config.vocab
    model = _model(config, vocab)
    data = torch.Generator().manual_seed(config.seed)
    eval_ids, eval_repeated = repeated_runs(config.eval_size, config, vocab,
                                            torch.Generator().manual_seed(config.seed + 1))
    trained = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(trained, lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: min(1.0, (step + 1) / max(1, config.warmup)))
    log, since = [], []
    saves = set(config.save_at)
    for step in range(config.steps + 1):
        if step in saves:
            model.eval()
            with torch.no_grad():
                losses = _losses(model, eval_ids)  # (eval, seq - 1)
            target_repeated = eval_repeated[:, 1:]  # (eval, seq - 1) whether each predicted token is a repeat
            first, repeat = losses[~target_repeated].mean().item(), losses[target_repeated].mean().item()
            record = {"step": step, "tokens": step * config.batch_size * config.seq_len,
                      "train_loss": sum(since) / len(since) if since else math.nan,
                      "eval_loss": losses.mean().item(), "first_loss": first, "repeat_loss": repeat,
                      "icl_gap": first - repeat}
            log.append(record)
            since = []
            model.save_pretrained(folder / f"step-{step}")
            tokenizer.save_pretrained(folder / f"step-{step}")
            if progress is not None:
                progress(record)
        if step == config.steps:
            break
        model.train()
        ids, _ = repeated_runs(config.batch_size, config, vocab, data)
        loss = _losses(model, ids).mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        schedule.step()
        since.append(loss.item())
    with open(folder / "training.jsonl", "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"config": asdict(config)}) + "\n")
        for record in log:
            handle.write(json.dumps(record) + "\n")
    return log
