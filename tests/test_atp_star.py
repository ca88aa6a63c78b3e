"""AtP* (GradDrop) against answers computed without headscan's code.

- Every GradDrop estimate equals a plain loop over the Hugging Face model, one sequence and one dropped layer at
  a time, which drops a block's gradient its own way (a forward hook returning x + (y - x).detach()) and reads
  the gradient at its own pre-hooks on the output projections: GPT-2 (bridge path) and Llama (grouped queries),
  a padded batch, mean and per-position replacements.
- A two-layer GPT-2 built here whose head L0H0's direct effect is cancelled, to first order, by a later MLP:
  AtP says ~0, exact zero ablation (by a plain hook) does not, and AtP* lies much closer to it.
"""

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel

from headscan.metrics.importance import next_token_loss
from headscan.models import load_model
from headscan.models.ablation import Surgery, head_cut
from headscan.models.atp_star import AtPStar, atp_star, attribution, head_attributions
from headscan.testing import build_architecture_checkpoint, build_tiny_checkpoint

TEXTS = ["The cat sat on the mat because it was tired.", "Where is the station?", "I like green tea."]
# each architecture's blocks and output projections as Hugging Face names them, written here, not read from headscan
PATHS = {"gpt2": ("transformer.h.{}", "transformer.h.{}.attn.c_proj"),
         "llama": ("model.layers.{}", "model.layers.{}.self_attn.o_proj")}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def plain_dropped(folder, arch, sequences, n_heads, replacement_of):
    """{(dropped, sequence, layer, head): estimate} with dropped None for plain AtP: each sequence alone, a fresh
    forward pass per dropped block, the gradient of the summed next-token loss at each head's output."""
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    block_path, cut_path = PATHS[arch]
    n_layers = model.config.num_hidden_layers
    found = {}
    for dropped in [None, *range(n_layers)]:
        for s, ids in enumerate(sequences):
            seen, handles = [], []

            def drop(module, args, kwargs, output):
                x = args[0] if args else kwargs["hidden_states"]
                y = output if isinstance(output, torch.Tensor) else output[0]
                new = x + (y - x).detach()
                return new if isinstance(output, torch.Tensor) else (new, *output[1:])

            for layer in range(n_layers):
                cut = model.get_submodule(cut_path.format(layer))
                handles.append(cut.register_forward_pre_hook(lambda module, args: seen.append(args[0])))
            if dropped is not None:
                handles.append(model.get_submodule(block_path.format(dropped)).register_forward_hook(
                    drop, with_kwargs=True))
            try:
                logits = model(input_ids=torch.tensor([ids])).logits[0]
            finally:
                for handle in handles:
                    handle.remove()
            loss = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="sum")
            grads = torch.autograd.grad(loss, seen, allow_unused=True)
            for layer, (z, g) in enumerate(zip(seen, grads)):
                z = z[0].detach()
                g = torch.zeros_like(z) if g is None else g[0]
                for head in range(n_heads):
                    d = z.shape[-1] // n_heads
                    r = replacement_of(layer, head, s, len(ids))  # (seq, d_head)
                    found[dropped, s, layer, head] = float(((r - z[:, head * d:(head + 1) * d])
                                                            * g[:, head * d:(head + 1) * d]).sum())
    return found


def batch_of(model, sequences):
    """Right-padded ids and mask, as the sweep feeds them."""
    width = max(map(len, sequences))
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate(sequences):
        ids[row, :len(tokens)] = torch.tensor(tokens)
        mask[row, :len(tokens)] = 1
    return ids, mask


def loss_target(ids, mask):
    return lambda logits: next_token_loss(logits, ids, mask.bool())[0]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("per_position", [False, True])
def test_graddrop_equals_a_plain_loop(arch, per_position, tmp_path):
    folder = (build_tiny_checkpoint(tmp_path / arch, "gpt2", n_layers=3, seed=3) if arch == "gpt2"
              else build_architecture_checkpoint(tmp_path / arch, arch, seed=5))
    model = load_model(str(folder), device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sequences = [[tokenizer.bos_token_id or 0] + tokenizer(text)["input_ids"] for text in TEXTS]
    ids, mask = batch_of(model, sequences)
    cut = head_cut(model)
    L, H, d = model.n_layers, model.n_heads, cut.d_head
    generator = torch.Generator().manual_seed(11)
    if per_position:  # another prompt's outputs, one per position (contrastive patching)
        replacement = torch.randn(L, *ids.shape, H, d, generator=generator)
        def replacement_of(layer, head, s, n):
            return replacement[layer, s, :n, head]
    else:
        replacement = torch.randn(L, H, d, generator=generator)
        def replacement_of(layer, head, s, n):
            return replacement[layer, head].expand(n, d)
    before = replacement.clone()
    with Surgery(model, cut, "next_token_loss") as surgery:
        result = atp_star(surgery, ids, mask, replacement, loss_target(ids, mask))
    assert torch.equal(replacement, before)  # never written into
    assert result.atp.shape == (len(TEXTS), L, H) and result.dropped.shape == (L, len(TEXTS), L, H)
    expected = plain_dropped(folder, arch, sequences, H, replacement_of)
    scale = max(abs(v) for v in expected.values())
    for (dropped, s, layer, head), value in expected.items():
        got = result.atp if dropped is None else result.dropped[dropped]
        assert abs(float(got[s, layer, head]) - value) <= 1e-4 * scale, (dropped, s, layer, head)
    # the paper's structure: a dropped later block leaves a node's AtP, its own block leaves it nothing, and the
    # score is the mean of L - 1 sizes
    for layer in range(L):
        assert torch.equal(result.dropped[layer][:, layer], torch.zeros(len(TEXTS), H))
        assert torch.equal(result.dropped[layer][:, layer + 1:], result.atp[:, layer + 1:])
    torch.testing.assert_close(result.star, result.dropped.abs().sum(0) / (L - 1))


def test_plain_atp_is_the_sweeps_attribution(tiny_gpt2):
    model = load_model(str(tiny_gpt2), device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    ids, mask = batch_of(model, [[0] + tokenizer(text)["input_ids"] for text in TEXTS])
    cut = head_cut(model)
    means = torch.randn(model.n_layers, model.n_heads, cut.d_head, generator=torch.Generator().manual_seed(2))
    with Surgery(model, cut, "next_token_loss") as surgery:
        result = atp_star(surgery, ids, mask, means, loss_target(ids, mask))
        run = surgery.run(ids, mask, capture=True, grad=True)
        grads = torch.autograd.grad(loss_target(ids, mask)(run.output).sum(), run.heads)
    for layer, (z, g) in enumerate(zip(run.heads, grads)):
        torch.testing.assert_close(result.atp[:, layer], attribution(z.detach(), g, means[layer], mask.bool()))
    torch.testing.assert_close(head_attributions(run.heads, grads, means, mask.bool()), result.atp)


def build_cancelling_gpt2(folder):
    """Two layers, relu MLPs, d_model 32: every token embeds as one vector c of norm 100 in the first half of
    the residual stream (no positions), so each layer norm is nearly a fixed scale k on small changes. L0H0's
    values are a constant v, its output projection writes (z . a) e with a = v / |v|^2 (1 along e, a unit
    vector in the second half); no other head, no other MLP, writes anything. Layer 1's MLP has one neuron,
    relu(w k s + b), that writes -beta e, with beta w k = 1: to first order it takes away what L0H0 adds, so the
    logit of token 0, the unembedding's e, does not depend on s. b = -0.9 w k turns the neuron off when s goes
    to 0, so zero ablation of L0H0 changes each position's logit by about -0.9 k; AtP says ~0; dropping layer
    1's gradient leaves the direct effect, -k: AtP* ~ k."""
    build_tiny_checkpoint(folder, "gpt2", n_layers=2, n_heads=4, d_model=32, seed=9)
    model = GPT2LMHeadModel.from_pretrained(folder)
    model.config.activation_function = "relu"
    generator = torch.Generator().manual_seed(1)
    c = torch.randn(16, generator=generator)
    c = 100 * (c - c.mean()) / (c - c.mean()).norm()
    e = torch.zeros(32)
    e[16], e[17] = 2 ** -0.5, -(2 ** -0.5)  # unit norm, zero mean: a layer norm's centring leaves it
    v = torch.randn(8, generator=generator)
    k = (32 / (100 ** 2 + 1)) ** 0.5  # 1 / the layer norm's standard deviation with s = 1 along e
    w = 10.0
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        model.transformer.wte.weight[:, :16] = c
        model.transformer.wpe.weight.zero_()
        for block in model.transformer.h:
            block.attn.c_proj.weight.zero_()
            block.attn.c_proj.bias.zero_()
            block.mlp.c_fc.weight.zero_()
            block.mlp.c_fc.bias.zero_()
            block.mlp.c_proj.weight.zero_()
            block.mlp.c_proj.bias.zero_()
            for norm in (block.ln_1, block.ln_2):
                norm.weight.fill_(1.0)
                norm.bias.zero_()
        attention = model.transformer.h[0].attn.c_attn  # Conv1D (32, 3 * 32): q, k, v
        attention.weight[:, 64:] = 0
        attention.bias[64:72] = v  # head 0's values: v at every position
        model.transformer.h[0].attn.c_proj.weight[0:8, :] = (v / v.dot(v))[:, None] * e[None, :]
        mlp = model.transformer.h[1].mlp
        mlp.c_fc.weight[:, 0] = w * e
        mlp.c_fc.bias[0] = -0.9 * w * k
        mlp.c_proj.weight[0, :] = -e / (w * k)
        model.transformer.ln_f.weight.fill_(1.0)
        model.transformer.ln_f.bias.zero_()
        unembedding = torch.zeros(model.config.vocab_size, 32)
        unembedding[0] = e
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(unembedding)
    model.save_pretrained(folder)
    return folder, k


def test_atp_star_finds_a_head_whose_effects_cancel_where_atp_does_not(tmp_path):
    folder, k = build_cancelling_gpt2(tmp_path / "cancel")
    model = load_model(str(folder), device="cpu")
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    mask = torch.ones_like(ids)
    cut = head_cut(model)
    zeros = torch.zeros(model.n_layers, model.n_heads, cut.d_head)
    def logit_0(logits):
        return logits[..., 0].sum(-1)  # (batch,)
    with Surgery(model, cut, "next_token_loss") as surgery:
        result = atp_star(surgery, ids, mask, zeros, logit_0)
    # exact zero ablation of L0H0 by a plain pre-hook on the Hugging Face model's own output projection
    plain = GPT2LMHeadModel.from_pretrained(folder).eval()
    def zero_head(module, args):
        x = args[0].clone()
        x[..., 0:8] = 0
        return (x,)
    with torch.no_grad():
        clean = float(logit_0(plain(input_ids=ids).logits)[0])
        handle = plain.transformer.h[0].attn.c_proj.register_forward_pre_hook(zero_head)
        try:
            ablated = float(logit_0(plain(input_ids=ids).logits)[0])
        finally:
            handle.remove()
    exact = ablated - clean
    n = ids.shape[1]
    assert exact == pytest.approx(-0.9 * k * n, rel=0.02)  # the construction does what it says
    atp, star = float(result.atp[0, 0, 0]), float(result.star[0, 0, 0])
    assert abs(atp) < 0.02 * abs(exact)  # AtP: cancelled
    assert star == pytest.approx(k * n, rel=0.02)  # GradDrop of layer 1: the direct effect alone
    assert abs(star - abs(exact)) < 0.2 * abs(abs(atp) - abs(exact))  # AtP* far closer than AtP


def test_graddrop_refuses_a_model_of_one_layer(tmp_path):
    folder = build_tiny_checkpoint(tmp_path / "one", "gpt2", n_layers=1, seed=1)
    model = load_model(str(folder), device="cpu")
    cut = head_cut(model)
    ids = torch.tensor([[1, 2, 3]])
    with Surgery(model, cut, "next_token_loss") as surgery, pytest.raises(ValueError, match="at least 2 layers"):
        atp_star(surgery, ids, torch.ones_like(ids), torch.zeros(1, model.n_heads, cut.d_head),
                 loss_target(ids, torch.ones_like(ids)))


def test_the_score_is_the_mean_size_over_the_other_layers():
    dropped = torch.tensor([[[[0.0, 0.0], [1.0, -1.0], [2.0, 0.5]]],
                            [[[-4.0, 2.0], [0.0, 0.0], [2.0, 0.5]]],
                            [[[6.0, -2.0], [-3.0, 1.0], [0.0, 0.0]]]])  # (dropped 3, batch 1, layer 3, head 2)
    torch.testing.assert_close(AtPStar(torch.zeros(1, 3, 2), dropped).star,
                               torch.tensor([[[5.0, 2.0], [2.0, 1.0], [2.0, 0.5]]]))
