"""Run Triton kernels through the interpreter on machines without CUDA.

TRITON_INTERPRET is read when `triton.language` and each kernel are decorated, so it
must be set before anything imports triton. Here it is set before the modules of this
folder import the kernel; in a whole-suite run, a test folder collected earlier may
already have imported triton (then the kernel tests skip and say so; setting the
variable in tests/conftest.py, or running tests/plugins on its own, avoids that).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
