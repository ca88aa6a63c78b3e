"""The sweep on a CUDA device agrees with the CPU; skipped, with the reason, where this machine has no GPU.

A GPU machine runs these with the rest of the suite; `benchmarks/gpu_check.py` does the same on the embedded
models and adds tokens per second.
"""

import numpy as np
import pytest
import torch

from headscan import SweepConfig
from headscan.corpus import read_corpus
from headscan.models import load_model
from headscan.scan import sweep_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


@needs_cuda
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 5e-2)])
def test_a_cuda_sweep_agrees_with_the_cpu(tiny_bert, dtype, tolerance):
    corpus = read_corpus("builtin", limit=16)
    cpu = sweep_model(load_model(str(tiny_bert), device="cpu"), corpus, SweepConfig(device="cpu", bootstrap=20))
    model = load_model(str(tiny_bert), device="cuda", dtype=dtype)
    cuda = sweep_model(model, corpus, SweepConfig(device="cuda", dtype=dtype, bootstrap=20))
    np.testing.assert_allclose(cuda.heads["value"], cpu.heads["value"], atol=tolerance, rtol=0)
    np.testing.assert_array_equal(cuda.heads["count"], cpu.heads["count"])
    assert cuda.provenance.config["device"] == "cuda"


def test_a_device_map_gives_the_same_tables(tiny_bert, tiny_gpt2):
    """`device_map` goes through accelerate's placement; on a machine with one device ("cpu") the tables must
    not change. (Spreading a model over several GPUs needs several GPUs to test.)"""
    corpus = read_corpus("builtin", limit=8)
    for path in (tiny_bert, tiny_gpt2):
        plain = sweep_model(load_model(str(path), device="cpu"), corpus, SweepConfig(device="cpu", bootstrap=20))
        mapped = sweep_model(load_model(str(path), device="cpu", device_map="cpu"), corpus,
                             SweepConfig(device="cpu", device_map="cpu", bootstrap=20))
        np.testing.assert_allclose(mapped.heads["value"], plain.heads["value"], atol=1e-6, rtol=0)
        assert mapped.provenance.config["device_map"] == "cpu"
