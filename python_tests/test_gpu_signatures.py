"""Every SGLang, FlashInfer and torch.cuda name the GPU path calls exists in the installed wheels with
the parameters we pass: srt/verify_widths.py, srt/verify_backend.py, pipeline/flashinfer_attention.py,
pipeline/step_graphs.py. Each call is bound (inspect.Signature.bind) exactly as our code makes it,
on the real classes, without building anything CUDA: a renamed internal fails here, not a GPU
server's start-up."""

import dataclasses
import inspect

import torch

X = object()  # any argument value: binding checks names and arity only


def bind(fn, *args, **kw):
    inspect.signature(fn).bind(*args, **kw)


def assigns(cls, *attrs):
    """The attributes the class's own code sets on its instances (read or swapped by ours)."""
    src = inspect.getsource(cls)
    missing = [a for a in attrs if f"self.{a} =" not in src and f"self.{a}:" not in src]
    assert not missing, f"{cls.__name__} no longer sets {missing}"


def test_verify_widths_names():
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt import runtime_context

    bind(DecodeCudaGraphRunner.__init__, X, X, attn_backend=X, speculative_num_draft_tokens=4)
    bind(ModelRunner._get_attention_backend, X, init_new_workspace=False)
    assigns(ModelRunner, "init_new_workspace", "attn_backend", "decode_cuda_graph_runner", "lora_manager")
    for name in ("get_spec", "get_exec", "get_disagg", "get_parallel"):
        assert callable(getattr(runtime_context, name, None)), name
    bag = inspect.signature(runtime_context.get_spec).return_annotation
    bag = getattr(runtime_context, bag, bag) if isinstance(bag, str) else bag
    assert callable(getattr(bag, "override", None)), "get_spec().override (scoped speculative_num_draft_tokens)"


def test_verify_backend_names():
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    fields = {f.name for f in dataclasses.fields(ForwardBatch)}
    ours = {"forward_mode", "batch_size", "input_ids", "req_pool_indices", "seq_lens", "seq_lens_cpu",
            "out_cache_loc", "seq_lens_sum", "return_logprob", "positions", "spec_algorithm", "spec_info",
            "capture_hidden_mode", "global_forward_mode"}  # fmt: skip
    assert ours <= fields, f"ForwardBatch lacks {sorted(ours - fields)}"
    assert ForwardMode.TARGET_VERIFY and CaptureHiddenMode.FULL
    bind(DFlashVerifyInput, draft_token=X, positions=X, draft_token_num=4, custom_mask=None, capture_hidden_mode=X)
    bind(DFlashVerifyInput.prepare_for_verify, X, X, X, defer_metadata_init=True)
    bind(TpModelWorker.forward_batch_generation, X, batch=None, forward_batch=X, is_verify=True)
    bind(TpModelWorker.forward_batch_generation, X, X, capture_hidden_mode=X)  # the worker's prefill
    bind(KVWriteLoc, X, X)
    assigns(ModelRunner, "kv_index_translator", "spec_algorithm", "req_to_token_pool")


def test_flashinfer_names():
    import flashinfer  # sglang==0.5.23 requires it: installed with it

    W = flashinfer.BatchPrefillWithPagedKVCacheWrapper
    bind(W.__init__, X, X, kv_layout="NHD", backend="fa2")
    bufs = ("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf")
    bind(W.__init__, X, X, kv_layout="NHD", backend="fa2", use_cuda_graph=True, **dict.fromkeys(bufs, X))
    bind(W.plan, X, X, X, X, X, 32, 8, 128, 1, causal=False, sm_scale=0.1, window_left=-1,
         q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)  # fmt: skip
    bind(W.run, X, X, (X, X))


def test_step_graph_names():
    """torch.cuda's graph API as pipeline/step_graphs.py's CudaGraphs uses it (present on CPU builds)."""
    bind(torch.cuda.graph.__init__, X, X, pool=X, stream=X)
    for name in ("replay", "pool"):
        assert callable(getattr(torch.cuda.CUDAGraph, name, None)), name
    for name in ("Stream", "stream", "current_stream", "get_device_properties", "synchronize"):
        assert hasattr(torch.cuda, name), name
