"""Our DFLASH speculative worker: the one module that drives the stages through SGLang's scheduler.

prefill:  target extend (aux features captured) -> projection -> drafter KV at the prompt's slots
decode:   width W (pipeline/width.py) -> block -> one non-causal draft forward (none at W = 1) ->
          one target TARGET_VERIFY forward over W rows -> accept -> commit the accepted rows'
          context K/V (the block's other rows are simply overwritten by later writes to the slots).
"""

from __future__ import annotations

import logging
import time

import torch

from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_exec, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2

from sglang_dflash import env
from sglang_dflash.model.config import check_against_target, load_drafter_config, resolve_block_size
from sglang_dflash.model.loader import load_drafter
from sglang_dflash.model.mask_token import resolve_mask_token_id
from sglang_dflash.pipeline.accept import accept_block
from sglang_dflash.pipeline.attention_choice import check_capture_layers, dump_context
from sglang_dflash.pipeline.attention_choice import capturable, warm_up_block_attention
from sglang_dflash.pipeline.block import block_slots, build_block
from sglang_dflash.pipeline.context_kv import DraftKVCache, write_context
from sglang_dflash.pipeline.draft import Proposal
from sglang_dflash.pipeline.grammar_mask import apply_masks, chain_masks
from sglang_dflash.pipeline.penalties import apply_penalties
from sglang_dflash.pipeline.target_sampling import target_tokens
from sglang_dflash.cpu import contention, cpu_linear, llama_stack, packed_weights
from sglang_dflash.srt import metrics as dflash_metrics, verify_widths
from sglang_dflash.srt.draft_head import DraftHead
from sglang_dflash.srt.draft_stage import DraftStage
from sglang_dflash.srt.graph_choice import make_step_graphs
from sglang_dflash.srt.idle_result import idle_result
from sglang_dflash.srt.metrics import StageClock
from sglang_dflash.srt.seeded_prefill import PreSampleLogits, reseed_first_tokens
from sglang_dflash.srt.step_inputs import StepInputs, sampling_rows
from sglang_dflash.srt.step_profile import make_controller, played_widths
from sglang_dflash.srt.verify_backend import verify_forward

logger = logging.getLogger("sglang_dflash")

# Debug switch (tests): save every request's drafter context K/V rows after prefill.
DEBUG_DUMP_DIR = env.DEBUG_DUMP_DIR.get()


class DFlashWorker(BaseSpecWorker):
    ends_grammar_like_plain = True  # hooks.accept_grammar_tokens: grammar ends commit as plain decoding does

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        self.device = target_worker.device
        runner = self.model_runner
        text_cfg = runner.model_config.hf_text_config
        path = get_spec().speculative_draft_model_path
        self.cfg = load_drafter_config(path, int(text_cfg.num_hidden_layers))
        self.vocab_size = int(runner.model_config.vocab_size)
        check_against_target(self.cfg, hidden_size=int(text_cfg.hidden_size), vocab_size=self.vocab_size)
        self.block_size = resolve_block_size(get_spec().speculative_num_draft_tokens, self.cfg)
        self.mask_token_id = resolve_mask_token_id(
            self.cfg, server_args.tokenizer_path or server_args.model_path, self.vocab_size
        )
        check_capture_layers(runner.model, self.cfg)
        self.drafter = load_drafter(path, self.cfg, runner.dtype, str(self.device))
        # RoPE rows for every position a request can reach, once: a captured draft step holds the table
        self.drafter.rope_table(runner.model_config.context_len + self.block_size, str(self.device))
        self.draft_head = DraftHead(runner.model.lm_head, self.drafter, self.vocab_size)
        self.draft_kv = None
        self.device_type = torch.device(self.device).type
        self.cpu_gemm = cpu_linear.enable(self.device_type, runner.dtype)  # before any forward
        if self.cpu_gemm:
            self.drafter.route_matmuls(cpu_linear.linear)
            packed_weights.enable(runner.model, cpu_linear.amx_bf16())
        llama_stack.enable(self.device_type)
        self.flashinfer_sampler = get_exec().kernel.sampling_backend in ("flashinfer", "intel_xpu")
        self.metrics = dflash_metrics.create(self.block_size)
        # the draft stage, width controller, step graphs and verify widths: start-up's end (init_cuda_graphs)
        self.drafting = self.width = self.graphs = self.verify_widths = None
        self._step_cost = None  # (bs, width, stage seconds, end time) of the last decode step
        trace = env.DEBUG_STEP_TRACE.get()
        self.trace = dflash_metrics.StepTrace(trace) if trace else None
        self.pre_sample = PreSampleLogits(runner.sampler)  # seeded prefill rows: see seeded_prefill.py
        kind = f"DFlash 2 ({self.cfg.dflash2})" if self.cfg.dflash2 else "DFlash 1"
        logger.info(
            f"DFLASH served by sglang_dflash (ours): block_size={self.block_size} (drafter trained "
            f"{self.cfg.block_size}), drafter layers={self.cfg.num_layers}, target_layer_ids="
            f"{self.cfg.target_layer_ids}, mask_token_id={self.mask_token_id}, dtype={runner.dtype}, "
            f"device={self.device}, {kind}, bf16 GEMMs by our CPU kernel: {self.cpu_gemm}"
        )

    # ---- SGLang worker interface -------------------------------------------------------------
    @property
    def draft_worker(self):
        return None

    def __getattr__(self, name):
        if name == "_target_worker":
            raise AttributeError(name)
        return getattr(self._target_worker, name)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        num_slots = int(self.model_runner.token_to_kv_pool.get_key_buffer(0).shape[0])
        c = self.cfg
        self.draft_kv = DraftKVCache(
            c.num_layers, num_slots, c.num_kv_heads, c.head_dim, self.model_runner.dtype, str(self.device)
        )

    def init_attention_backends(self):
        warm_up_block_attention(self.cfg, self.block_size, self.device_type == "cuda", self.draft_kv)

    def init_cuda_graphs(self):
        """SGLang's last start-up hook (pools and attention backends exist): set up the width choice."""
        cuda = self.device_type == "cuda"
        held = capturable(self.cfg, self.block_size, cuda, self.draft_kv.k.dtype)
        self.graphs = make_step_graphs(self.device_type, self.model_runner.req_to_token_pool.size, held)
        self.drafting = DraftStage(
            self.drafter,
            self.draft_head,
            self.model_runner.model.model.embed_tokens,
            self.draft_kv,
            self.model_runner.req_to_token_pool.req_to_token,
            self.cfg,
            self.block_size,
            self.vocab_size,
            self.mask_token_id,
            cuda,
            self.graphs,
            self.metrics,
        )
        if cuda:  # every width's verify forward its own attention backend and graphs (verify_widths.py)
            widths, graphs = played_widths(self), env.GRAPHS.get() != "0"
            self.verify_widths = verify_widths.for_sglang(self.model_runner, self.block_size, widths, graphs)
        self.width = make_controller(self)  # after the graphs: the profile measures replayed steps

    def clear_cache_pool(self):
        pass

    # ---- one scheduler step ------------------------------------------------------------------
    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        contention.tick()
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, on_publish)
        if batch.spec_info is None:
            batch.spec_info = DFlashDraftInputV2.create_idle_input(device=self.device)
        if batch.forward_mode.is_idle() or batch.batch_size() == 0:
            return idle_result(self.device, self.block_size, on_publish)
        return self._decode(batch, on_publish)

    def stats(self) -> dict:
        """Live counters for /server_info (internal_states[i]["dflash"])."""
        width = self.width.stats() if self.width is not None else {}
        graphs = {"graphs": dict(self.graphs.counts)} if self.graphs is not None else {}
        if self.verify_widths is not None:
            graphs["verify_graphs"] = dict(self.verify_widths.counts)
        stack = {"target_stack": {**llama_stack.counts, "packed_weights": packed_weights.count()}}
        drafting = self.drafting
        return {
            "draft_steps": drafting.steps if drafting is not None else 0,
            "draft_failures": drafting.failures if drafting is not None else 0,
            **width,
            **graphs,
            **stack,
            "threads": torch.get_num_threads(),  # the forward's OpenMP threads (cpu/cpu_threads.py)
            **contention.stats(),  # the count chosen and how often contention moved it
        }

    def _prefill(self, batch, on_publish):
        self._step_cost = None  # a prefill runs between: the gap is not the last decode step's
        sampling = sampling_rows(batch, self.flashinfer_sampler)
        seeded = sampling is not None and any(s is not None for s in sampling.seeds)
        self.pre_sample.armed = seeded
        try:
            out = self._target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        finally:
            self.pre_sample.armed = False
        out.new_seq_lens = batch.seq_lens
        if seeded:
            reseed_first_tokens(self.pre_sample.take(), sampling, out, batch.return_logprob)
        if on_publish is not None:
            on_publish(out.new_seq_lens)
        features = out.logits_output.hidden_states
        if features is None:
            raise RuntimeError("DFLASH prefill got no target features; the target did not capture aux layers")
        dev = features.device
        positions = torch.cat(
            [torch.arange(p, p + n, device=dev) for p, n in zip(batch.prefix_lens, batch.extend_lens)]
        )
        write_context(self.drafter, self.draft_kv, features, positions, batch.out_cache_loc.to(torch.int64))
        if DEBUG_DUMP_DIR:
            dump_context(self.draft_kv, self.model_runner.req_to_token_pool.req_to_token, batch, DEBUG_DUMP_DIR)
        out.logits_output.hidden_states = None
        out.next_draft_input = make_draft_input_v2(bonus_tokens=out.next_token_ids, new_seq_lens=batch.seq_lens)
        return out

    def _decode(self, batch, on_publish):
        B = self.block_size
        inp = StepInputs.from_batch(batch, self.vocab_size, self.device, self.flashinfer_sampler)
        prefix, sampling, req_rows = inp.prefix, inp.sampling, inp.req_rows  # prefix [bs]
        all_in = None
        if self._step_cost is not None:  # the last step's cost, all in: its stages + the scheduler until now
            bs, width, stages, end = self._step_cost
            all_in = stages + time.perf_counter() - end
            self.width.observe_cost(bs, width, all_in)
        W = self.width.choose(len(inp.sampled), sum(inp.sampled), inp.verify_ct, req_rows, inp.max_width)
        block_ids, positions = build_block(inp.anchors, prefix, B, self.mask_token_id)  # [bs, B]
        slots = block_slots(
            self.model_runner.req_to_token_pool.req_to_token, inp.req_pool_indices, prefix, B
        )  # [bs, B] KV slot ids of the block (target and drafter share them)
        clock = StageClock(self.device_type)

        # 1) draft: one non-causal drafter forward over the block's first W rows (pipeline/draft.py
        #    draft_rows) proposes the drafts the step verifies. W = 1 is a plain decode step: no draft
        #    forward at all.
        if W > 1:
            proposal = self.drafting.run(inp.req_pool_indices, prefix, slots, block_ids, positions, sampling, W)
        else:
            proposal = Proposal(block_ids[:, :1])
        positions, slots = positions[:, :W], slots[:, :W]
        clock.mark("draft")

        # 2) verify: the target runs the W rows as a causal chain; then sample its token per row and
        #    accept while drafts match them
        logits_output, replayed = verify_forward(
            self._target_worker, batch, proposal.tokens, positions, slots, self.verify_widths
        )
        logits = logits_output.next_token_logits  # [bs*W, V]
        clock.mark("verify")
        if inp.penalties is not None:  # in place, as plain decoding does (logprobs see them too)
            logits.copy_(apply_penalties(logits, proposal.tokens, inp.penalties).to(logits.dtype))
        if inp.grammars is not None:  # structured outputs: each row masked with the grammar along the chain
            apply_masks(inp.grammars, logits, chain_masks(inp.grammars, proposal.tokens, self.vocab_size))
        tokens = target_tokens(logits, W, sampling, proposal)  # [bs, W]
        acc = accept_block(proposal.tokens, tokens, prefix, inp.budget, inp.stop_ids)
        new_seq_lens = acc.new_seq_lens.to(prefix.dtype)
        if inp.return_logprob:  # SGLang's own spec-logprob gather over the chain layout
            compute_spec_logprobs(batch, logits_output, acc.out_tokens.clamp(min=0).reshape(-1), chain_stride=W)
        if on_publish is not None:
            on_publish(new_seq_lens)
        clock.mark("sample")

        # 3) commit: only the committed rows' context K/V stay (at W = 1 the anchor's, so the next
        #    draft sees the full context); later writes overwrite the rest
        rows = acc.committed_rows()
        write_context(
            self.drafter,
            self.draft_kv,
            logits_output.hidden_states[rows],
            positions.reshape(-1)[rows],
            slots.reshape(-1)[rows],
            self.model_runner.model_config.context_len + B,  # bounds every position: no positions.max() sync
        )
        logits_output.hidden_states = None
        clock.mark("kv_write")

        seconds = clock.seconds()  # waits for the step's last stage, so the one copy below waits for nothing
        failed = proposal.failed if proposal.failed is not None else torch.zeros_like(acc.accept_lens)
        host = torch.stack([acc.accept_lens, acc.commit_lens, failed.to(acc.accept_lens.dtype)]).tolist()
        accepted, commits = host[0], host[1]  # [bs] each, one copy
        if any(host[2]):
            self.drafting.failed("drafter output not finite (NaN or inf)", sum(host[2]))
        self.width.observe_rows(W, req_rows, accepted)
        self._step_cost = (len(accepted), W, sum(seconds.values()), time.perf_counter())
        if self.metrics is not None:
            self.metrics.record(commits, seconds, W, self.width.last_rates)
        if self.trace is not None:
            self.trace.write(prev_all_in=all_in, W=W, commits=commits, stages=seconds, **self.width.trace())
        nxt = make_draft_input_v2(bonus_tokens=acc.bonus, new_seq_lens=new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=acc.out_tokens.reshape(-1),
            accept_lens=acc.commit_lens.to(torch.int32),
            can_run_cuda_graph=replayed,
            next_draft_input=nxt,
            speculative_num_draft_tokens=W,
            new_seq_lens=new_seq_lens,
        )
