"""How the target and the drafter run: one batched pass per round over every request.

  slot_pool      `SlotPool`: one K/V pool ([layers, slots, Hkv, C, d]) for every request;
                 a request is a `Slot`; the kept rows of a pass are gathered in at commit;
  pooled_target  the `runtime.engine.backend.TargetBackend` contract over that pool and the
                 batched forward (`runtime.model.batch_graph.BatchVerifyGraph`); torch runs it
                 eagerly (`runtime.engine.backend.TorchTarget`), onnxruntime exported:
  ort_target     `OrtTarget`: the exported batched verify graph on onnxruntime's CPU provider;
  ort_drafter    `OrtDrafter`: the DFlash drafter's batched draft and context graphs;
  onnx_cache     where those graphs are exported to on first use (and reused from), and the
                 CPU session plumbing both onnxruntime backends share.
"""
