"""sglang_dflash/replicas.py's wiring, without processes: `--api-key` reaches every worker and the
gateway (test_drain_serving.py serves SMG's half: 401 without the key, an answer with it)."""

import pytest

from sglang_dflash import replicas


class FakeProc:
    pid = -1

    def poll(self):
        return 0  # every process "exits" at once, so main returns after launching them


def launched(monkeypatch, argv: list[str]) -> tuple[list[list[str]], list]:
    """(the commands main started, the key it read the gateway's /workers with)."""
    cmds: list[list[str]] = []
    keys = []
    monkeypatch.setattr(replicas.subprocess, "Popen", lambda cmd, **_: cmds.append(cmd) or FakeProc())
    monkeypatch.setattr(replicas, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(replicas, "wait_workers", lambda *a, api_key=None, **k: keys.append(api_key))
    monkeypatch.setattr(replicas, "served_model", lambda *a, **k: "/models/target")
    monkeypatch.setattr(replicas.signal, "signal", lambda *a: None)  # pytest keeps its own SIGINT
    with pytest.raises(SystemExit):
        replicas.main(argv)
    return cmds, keys


def flag(cmd: list[str], name: str) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == name]


def test_the_api_key_goes_to_every_worker_and_to_the_gateway(monkeypatch, capsys):
    (*workers, router), keys = launched(monkeypatch, ["--replicas", "2", "--api-key", "s3cret", "--model-path", "m"])
    assert len(workers) == 2 and router[1] == "launch", router
    for cmd in workers:
        assert flag(cmd, "--api-key") == ["s3cret"] and flag(cmd, "--model-path") == ["m"], cmd
    assert flag(router, "--api-key") == ["s3cret"], router  # SMG's key: required of clients, sent to workers
    assert keys == ["s3cret"]  # SMG's /workers list answers 401 without it
    out = capsys.readouterr().out
    assert "Authorization: Bearer" in out and "s3cret" not in out  # the printed curl names no secret
    assert '"model": "/models/target"' in out  # SMG routes by the served model's id, not "default"


def test_without_a_key_nothing_asks_for_one(monkeypatch):
    cmds, keys = launched(monkeypatch, ["--replicas", "2", "--model-path", "m"])
    assert len(cmds) == 3 and not any("--api-key" in cmd for cmd in cmds) and keys == [None], cmds
