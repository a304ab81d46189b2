"""Target executor backends beyond the torch reference (`runtime.engine.backend.TorchTarget`).

  ort_target   `OrtTarget`: the verify graph (`runtime.model.graphs.VerifyGraph`) exported
               from the same weights and run by onnxruntime on the CPU, K/V kept in place;
  onnx_cache   where that graph is exported to on first use, and reused from.
Each implements the `runtime.engine.backend.TargetBackend` contract.
"""
