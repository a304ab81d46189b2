"""AOT compile of the kernel to PTX on a machine without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plugins.tree_attention.aot import AOT_ARCHS, KERNEL_NAME
from plugins.tree_attention.kernel_spec import KernelSpec
from plugins.tree_attention.triton_kernel import triton_available

ROOT = Path(__file__).resolve().parents[2]

# Compiled in a fresh process: this test session may run triton under TRITON_INTERPRET=1,
# which swaps triton.language's own jit functions for interpreter wrappers.
_COMPILE = """
import json, re, sys
from plugins.tree_attention.aot import AOT_ARCHS, compile_kernel
from plugins.tree_attention.kernel_spec import KernelSpec
spec = KernelSpec(dtype="bfloat16", num_q_heads=32, num_kv_heads=8, head_dim=128, mask_words=8)
result = {}
for arch in AOT_ARCHS:
    k = compile_kernel(spec, arch=arch)
    entry = re.search(r"\\.entry\\s+(\\w+)\\(([^)]*)\\)", k.ptx)
    result[arch] = dict(name=k.name, entry=entry.group(1), params=entry.group(2).count(".param"),
                        target=re.search(r"\\.target\\s+(\\w+)", k.ptx).group(1),
                        threads=k.threads_per_block, shared=k.shared_mem, grid=k.grid(40, 3, 32))
json.dump(result, sys.stdout)
"""


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_ptx_for_every_target_arch_is_produced_on_cpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = {int(arch): info for arch, info in json.loads(done.stdout).items()}
    assert sorted(result) == sorted(AOT_ARCHS)
    for arch, info in result.items():
        assert info["name"] == info["entry"] == KERNEL_NAME
        assert info["target"].startswith(f"sm_{arch}")
        assert info["params"] == 12  # 8 inputs, num_requests, out, 2 Triton scratch pointers
        assert info["threads"] == 128
        assert info["grid"] == [3 + 3, 32, 1]  # cdiv(40, 16) + B tiles, Hq


@pytest.mark.parametrize("field,value", [("dtype", "float64"), ("num_kv_heads", 3), ("block_m", 24),
                                         ("mask_words", 0), ("scale", -1.0)])
def test_invalid_kernel_spec_raises_value_error(field, value):
    args = dict(dtype="float16", num_q_heads=8, num_kv_heads=2, head_dim=64, mask_words=2)
    args[field] = value
    with pytest.raises(ValueError, match=field if field != "num_kv_heads" else "multiple"):
        KernelSpec(**args)


def test_kernel_spec_folds_contiguous_strides_and_default_scale():
    spec = KernelSpec(dtype="float32", num_q_heads=9, num_kv_heads=3, head_dim=64, mask_words=4)
    consts = spec.constexprs()
    assert (consts["stride_qt"], consts["stride_kt"], consts["stride_mt"], consts["GROUP"]) == (576, 192, 4, 3)
    assert consts["sm_scale"] == pytest.approx(0.125)
    assert consts["DOT_PRECISION"] == "ieee"
    runtime = [name for name, ty in spec.signature().items() if ty != "constexpr"]
    assert runtime == ["Q", "K_PREFIX", "V_PREFIX", "K_PACK", "V_PACK", "BITMASK", "CU_SEQLENS", "CU_PREFIX",
                       "num_requests", "OUT"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_aot_binary_with_folded_strides_matches_reference_on_cuda():
    """The AOT specialisation (folded scale/strides, TensorRT argument order) computes the op.

    Runs in a subprocess: the compile must not see an interpreted triton.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", _LAUNCH], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) < 1e-2


_LAUNCH = """
import torch
from plugins.tree_attention.aot import compile_binary
from plugins.tree_attention.kernel_spec import KernelSpec
from plugins.tree_attention.reference import tree_attention_reference
from tests.plugins.trees import bushy_parents, chain_parents, make_batch
packs = [bushy_parents(40, 1), chain_parents(9), bushy_parents(70, 2)]
batch = make_batch(packs, [100, 0, 33], num_q_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.float16)
spec = KernelSpec("float16", 8, 2, 64, mask_words=batch["bitmask"].shape[1], scale=0.1)
major, minor = torch.cuda.get_device_capability()
binary = compile_binary(spec, arch=10 * major + (9 if (major, minor) == (8, 9) else 0))
cuda = {k: v.cuda() for k, v in batch.items()}
out = torch.empty_like(cuda["q"])
total, num_requests = out.shape[0], len(packs)
grid = (-(-total // spec.block_m) + num_requests, spec.num_q_heads, 1)
args = [cuda[k] for k in ("q", "k_prefix", "v_prefix", "k_pack", "v_pack", "bitmask", "cu_seqlens", "cu_prefix")]
binary[grid](*args, num_requests, out, *spec.constexprs().values())
torch.cuda.synchronize()
ref = tree_attention_reference(**batch, scale=0.1)
print((out.cpu().float() - ref.float()).abs().max().item())
"""
