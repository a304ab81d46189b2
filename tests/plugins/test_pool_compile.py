"""The pool kernels compile for Hopper (sm_90) on a machine without a GPU, at Qwen3-8B shapes, and
their tiles fit its shared memory (the interpreter checks the math, not the compiled pipeline)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.tree_attention import triton_available

ROOT = Path(__file__).resolve().parents[2]
HOPPER_SHARED_BYTES = 232448  # 227 KiB per block on sm_90

# A fresh process: this test session may run triton under TRITON_INTERPRET=1.
_COMPILE = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from plugins.tree_attention.pool_kernel import plan_pool_launch, pool_combine_kernel, pool_split_kernel
INTS = ("batch num_queries num_kv_heads capacity chunk stride_qb stride_qn stride_qh stride_kb stride_kn stride_kh "
        "stride_vb stride_vn stride_vh stride_ps stride_ph stride_pc stride_ws stride_wh stride_wc stride_mb stride_mn")
def build(fn, sig, const, **options):
    sig = {**sig, **{k: "constexpr" for k in const}}
    source = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).metadata.shared
result = {}
for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
    plan = plan_pool_launch(32, 128, 32, 8, 128, 8192, dtype, num_splits=4)  # the largest tiles of each dtype
    ptr = "*" + name
    sig = dict(Q=ptr, K_NEW=ptr, V_NEW=ptr, K_POOL=ptr, V_POOL=ptr, SLOT_IDS="*i32", PREFIX_LENS="*i32",
               BITMASK="*i32", OUT=ptr, M_WS="*fp32", L_WS="*fp32", ACC_WS="*fp32", sm_scale="fp32")
    sig.update({k: "i32" for k in INTS.split()})
    const = dict(GROUP=4, HEAD_DIM=128, BLOCK_D=plan.block_d, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, SPLIT=True,
                 DOT_PRECISION="ieee" if name == "fp32" else "tf32")
    result[name] = build(pool_split_kernel, sig, const, num_warps=plan.num_warps, num_stages=plan.num_stages)
sig = dict(M_WS="*fp32", L_WS="*fp32", ACC_WS="*fp32", PREFIX_LENS="*i32", OUT="*bf16", batch="i32",
           num_queries="i32", num_q_heads="i32", capacity="i32", chunk="i32", num_splits="i32")
result["combine"] = build(pool_combine_kernel, sig, dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_H=32), num_warps=4)
json.dump(result, sys.stdout)
"""


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_pool_kernels_compile_for_sm90_within_shared_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shared = json.loads(done.stdout)
    assert set(shared) == {"bf16", "fp32", "combine"}
    assert all(0 <= used <= HOPPER_SHARED_BYTES // 2 for used in shared.values()), shared  # room for 2 blocks/SM
