"""Shared by the training tests: a tiny workdir of cyclic answers and one run of the trainer."""

import json

from sglang_dflash.train import trainer


def train_run(workdir, model, **kw):
    """One training run with TrainConfig(workdir, model, **kw)."""
    return trainer.run(trainer.TrainConfig(workdir, model, **kw))


def _tiny_workdir(tmp_path):
    """A data.jsonl of 12 cyclic answers (learnable from the anchor token), one held out."""
    wd = tmp_path / "run"
    wd.mkdir()
    with open(wd / "data.jsonl", "w") as f:
        for i in range(12):
            ans = [10 + (i + k) % 20 for k in range(40)] + [2]
            f.write(
                json.dumps(
                    {
                        "id": f"p{i}",
                        "family": "arithmetic",
                        "split": "heldout" if i == 0 else "train",
                        "prompt_ids": [1, 5 + i, 6, 7],
                        "answer_ids": ans,
                    }
                )
                + "\n"
            )
    return str(wd)
