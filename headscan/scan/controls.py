"""Control models: what a sweep sweeps beside each model, and how each one is loaded and fed.

With ``control=("random-init", "shuffled-words")`` a sweep of ``minilm`` sweeps three models, one after the
other, each a model of its own in every table (`headscan.config.control_name`):

- ``minilm``: the trained model over the corpus;
- ``minilm [random init]``: the same architecture and tokenizer, its weights drawn from its config's own
  initialiser with the controls' seed (`headscan.models.random_init`), over the same corpus: what the
  architecture, the positions and the tokenizer make without training;
- ``minilm [shuffled words]``: the trained model over the corpus with each segment's words permuted
  (`headscan.corpus.shuffle`): what a head finds from the words without their order.

The random-init controls are the null of the trained model's findings (`headscan.metrics.nulls`); the
shuffled-words control says whether a finding follows position or content (`headscan.analysis.shuffled`); which
control answers what, metric by metric, is `headscan.metrics.null_policy`.

Each control costs about as much as its model, so one control doubles the sweep's time. A control resumes,
shards, merges and runs on Ray like any model: its name says what to load and what to feed it.

This module does not score heads.
"""

from __future__ import annotations

from ..config import SweepConfig, control_name, control_number, split_control
from ..corpus import Corpus, shuffle_words
from ..models import HookedModel, load_model

__all__ = ["swept_names", "load_swept", "corpus_for"]


def swept_names(models: list[str], config: SweepConfig) -> list[str]:
    """The models a sweep sweeps, in order: each model, then its controls.

    >>> swept_names(["minilm", "gpt2"], SweepConfig(control=("shuffled-words", "random-init")))
    ['minilm', 'minilm [random init]', 'minilm [shuffled words]', 'gpt2', 'gpt2 [random init]', 'gpt2 [shuffled words]']
    >>> swept_names(["gpt2"], SweepConfig(control=("random-init",), control_seeds=3))
    ['gpt2', 'gpt2 [random init]', 'gpt2 [random init 2]', 'gpt2 [random init 3]']
    """
    numbers = {"random-init": range(1, config.control_seeds + 1), "shuffled-words": range(1, 2)}
    controls = [(c, n) for c in ("random-init", "shuffled-words") if c in config.control for n in numbers[c]]
    return [control_name(spec, *control) for spec in models for control in ((None, 1), *controls)]


def load_swept(name: str, config: SweepConfig) -> HookedModel:
    """The model a swept `name` stands for: a model spec, or a control of one (`swept_names`)."""
    spec, control = split_control(name)
    # the n-th random-init control draws its weights with the controls' seed + n - 1
    model = load_model(spec, device=config.device, dtype=config.dtype, prepend_bos=config.prepend_bos,
                       device_map=config.device_map, control=control,
                       control_seed=config.controls_seed + control_number(name) - 1)
    model.name = name
    return model


def corpus_for(name: str, corpus: Corpus, config: SweepConfig) -> Corpus:
    """What model `name` is swept over: `corpus`, or its words shuffled for a shuffled-words control."""
    return shuffle_words(corpus, config.controls_seed) if split_control(name)[1] == "shuffled-words" else corpus
