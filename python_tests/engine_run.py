"""Run by test_engine.py in a subprocess: plain then DFLASH `sglang.Engine` on the same prompts."""

import json
import sys


def main(target, drafter, out_path):
    from sglang_dflash.cpu.sgl_kernel_cpu import install_cpu_shims

    install_cpu_shims()  # the Engine imports sgl_kernel before SGLang loads plugins
    import sglang

    from sglang_dflash.testing.servers import prompts
    from sglang_dflash.cpu_serving import engine_kwargs

    batch = prompts(16, seed=7, max_len=120)
    sp = {"max_new_tokens": 24, "temperature": 0}
    common = dict(
        model_path=target, dtype="float32", random_seed=0, log_level="warning", **engine_kwargs(max_total_tokens=8192)
    )
    eng = sglang.Engine(**common)
    plain = eng.generate(input_ids=batch, sampling_params=sp, return_logprob=True, top_logprobs_num=2)
    eng.shutdown()
    eng = sglang.Engine(**common, speculative_algorithm="DFLASH", speculative_draft_model_path=drafter)
    spec = eng.generate(input_ids=batch, sampling_params=sp)
    eng.shutdown()
    tops = [o["meta_info"]["output_top_logprobs"] for o in plain]
    refs = [
        {
            "output_ids": o["output_ids"],
            "gaps": [abs(t[0][0] - t[1][0]) for t in top],
            "runner_up": [t[1][1] for t in top],
        }
        for o, top in zip(plain, tops)
    ]
    outs = [
        {
            "output_ids": o["output_ids"],
            "tau": o["meta_info"].get("spec_accept_length"),
            "tokens": o["meta_info"]["completion_tokens"],
            "verify": o["meta_info"]["spec_verify_ct"],
        }
        for o in spec
    ]
    with open(out_path, "w") as f:
        json.dump({"refs": refs, "outs": outs}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
