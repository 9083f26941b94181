"""The CPU backend for the target model: what lets SGLang serve a bf16 target fast on a CPU.

Its GEMMs, rotary embeddings and norms routed to our kernels (cpu_linear), its weights packed once
for oneDNN (packed_weights), its Llama layer stack as one loop of those ops (llama_stack), each
scheduler's forward threads (cpu_threads) and how they follow contention (contention), SGLang's CPU subprocesses forked (fork_start), and
stand-ins for the sgl_kernel functions SGLang imports on CPU (sgl_kernel_cpu).

Plain torch over SGLang's modules as they arrive, never importing sglang or srt/: the hooks that
need SGLang's own classes live in srt/cpu_target.py, which plugin.py registers with the rest.
"""
