"""DFlash block-diffusion speculative decoding as an SGLang plugin.

The stage map (one module per stage, the data flow of a decode step):

  prefill:  target extend (features captured) -> pipeline.context_kv (projection -> drafter KV)
  decode:   pipeline.block -> pipeline.draft (model.drafter, one non-causal forward)
            -> target TARGET_VERIFY (srt.worker) -> pipeline.penalties -> pipeline.target_sampling
            -> pipeline.accept -> pipeline.context_kv (the committed rows only)

model/ and pipeline/ are plain torch; srt/ is the only package that imports sglang.
"""
