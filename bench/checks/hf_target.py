"""The loop check's target (loop_check.py): a random-weight transformers causal LM on the device, in
float32, verifying one request at a time over its own KV cache. No SGLang: the lent GPU box has
torch + transformers only.

Steering (testing/tiny_drafter.wire_steering) gives mixed acceptance without a trained drafter: the
steered drafter always proposes STEER_TOKEN, and the target's head reads the steering channel for
that token with a strength calibrated here so the target picks it about `share` of the time."""

from __future__ import annotations

import torch

from sglang_dflash.testing.tiny_drafter import STEER_CHANNEL, STEER_TOKEN, wire_steering

# name -> (architecture, shape). Tiny ones for the CPU dry run; the others are real models' shapes
# (SmolLM2-135M, Qwen3-0.6B) with random weights, as large as fits the GPU check's minutes.
PRESETS = {
    "llama-tiny": ("llama", dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "qwen3-tiny": ("qwen3", dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "llama-smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         head_dim=64)),
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128)),
}  # fmt: skip


def crop(cache, length: int) -> None:
    """Keep the first `length` positions of a transformers cache (a negative crop removes that many
    tokens in transformers 4.x and 5.x alike)."""
    drop = cache.get_seq_length() - length
    if drop > 0:
        cache.crop(-drop)


class Target:
    def __init__(self, preset: str, device: str, seed: int = 0):
        import transformers

        kind, shape = PRESETS[preset]
        conf, cls = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        }[kind]
        config = conf(**shape, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False)
        torch.manual_seed(seed)
        with torch.device(device):
            model = cls(config)
        # Matrices at 4/sqrt(hidden) (0.5 at hidden 64): HF's 0.02 leaves the top-2 logits of a random
        # model ~1e-4 apart, where a verify's and a decode's float32 roundings could pick differently.
        std = 4 / shape["hidden_size"] ** 0.5
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std)
        self.model = model.float().eval().requires_grad_(False)
        self.device, self.num_layers, self.vocab = device, shape["num_hidden_layers"], shape["vocab_size"]
        self.embed, self.head = model.model.embed_tokens, model.lm_head
        self.config = config

    @torch.no_grad()  # not inference mode: the weights it wires are used by later forwards
    def steer(self, prompts: list[list[int]], n: int, share: float = 0.4, iters: int = 6) -> tuple[float, float]:
        """Wire the steering channel, then bisect the steer token's head weight until about `share`
        of the target's greedy tokens after `prompts` are the steer token (once emitted it tends to
        repeat, so a strength read off the prompts alone overshoots). -> (strength, share reached)."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        head = params["lm_head.weight"]
        wire_steering(params, head, 0.0)
        ids = torch.tensor([sum(prompts, [])], device=self.device)
        h = self.model.model(input_ids=ids).last_hidden_state[0]  # [T, H] after the final norm
        logits = self.head(h)  # [T, V]
        rest = logits.clone()
        rest[:, STEER_TOKEN] = float("-inf")
        need = (rest.max(-1).values - logits[:, STEER_TOKEN]) / h[:, STEER_CHANNEL]  # [T]: where it starts to win
        lo, hi = 0.0, max(float(torch.quantile(need, share)), 0.0)
        seen = {}  # strength -> share of steer tokens in the greedy outputs
        for _ in range(iters):
            head[STEER_TOKEN, STEER_CHANNEL] = mid = (lo + hi) / 2
            outs = sum((self.greedy(p, n) for p in prompts), [])
            seen[mid] = outs.count(STEER_TOKEN) / len(outs)
            lo, hi = (mid, hi) if seen[mid] < share else (lo, mid)
        strength = lo if lo > 0 else mid  # the strongest tried that stayed under `share`
        head[STEER_TOKEN, STEER_CHANNEL] = strength
        return strength, seen[strength]

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    @torch.inference_mode()
    def forward(self, ids: list[int], cache, layer_ids: list[int] | None = None):
        """ids: tokens after what `cache` holds -> logits [n, V] float32, features [n, K*H] (the
        outputs of decoder layers layer_ids, z-lab's convention: HF hidden_states[id + 1]) or None."""
        x = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=x, past_key_values=cache, use_cache=True, output_hidden_states=bool(layer_ids))
        feats = None
        if layer_ids:
            feats = torch.cat([out.hidden_states[i + 1][0] for i in layer_ids], dim=-1)
        return out.logits[0].float(), feats

    @torch.inference_mode()
    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """The target's own greedy decoding: prefill, then one token a step over its cache."""
        cache = self.new_cache()
        logits, _ = self.forward(prompt, cache)
        out = [int(logits[-1].argmax())]
        while len(out) < n:
            logits, _ = self.forward(out[-1:], cache)
            out.append(int(logits[-1].argmax()))
        return out
