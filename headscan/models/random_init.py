"""The random-init control: a model of the same architecture whose weights come from its config's own initialiser.

What training made and what the architecture, the positions and the tokenizer make apart: a control model
has the trained model's config (shape, positions, norms, attention masks) and tokenizer, but no trained
weights. In transformers 5, ``from_config`` builds the model and its ``post_init`` runs the model's own
``_init_weights`` on every module: linear and embedding weights drawn from N(0, ``initializer_range``)
(0.02 for BERT, GPT-2 and Llama), biases zero, norm gains one (the model's own rules, whatever they are). The
draws come from torch's CPU generator seeded with the control's seed inside a forked RNG state, so the same
seed gives the same weights on any device and the caller's random state is left as it was.

This module does not hook models (see `headscan.models.load`).
"""

from __future__ import annotations

import torch

__all__ = ["random_init", "initializer_note"]


def random_init(model_class, config, *, seed: int, dtype: torch.dtype):
    """A `model_class` (a Hugging Face model or Auto class) built from `config` with freshly initialised weights,
    drawn with `seed`, in `dtype`, eager attention, on the CPU, in eval mode.

    >>> from transformers import BertConfig, BertModel
    >>> config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    ...                     intermediate_size=32)
    >>> a, b = (random_init(BertModel, config, seed=3, dtype=torch.float32) for _ in range(2))
    >>> all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    True
    >>> round(float(a.embeddings.word_embeddings.weight.detach().std()), 2)  # N(0, initializer_range)
    0.02
    """
    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        torch.manual_seed(seed)
        # Auto classes have from_config; a model class has _from_config, which AutoModel's calls
        build = getattr(model_class, "from_config", None) or model_class._from_config
        model = build(config, attn_implementation="eager", dtype=dtype)
    return model.eval()


def initializer_note(model, seed: int) -> str:
    """How a control's weights were drawn, for its provenance."""
    config = model.config.get_text_config()
    scale = getattr(config, "initializer_range", None)
    scale = f", initializer_range {scale}" if scale is not None else ""
    return f"{type(model).__name__}.from_config: the model's own _init_weights{scale}, torch seed {seed}"
