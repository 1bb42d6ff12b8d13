"""Errors cross as Python exceptions naming the problem (never a crash of the interpreter); a
killed Python island restarts from its checkpoint and rejoins, a SIGTERMed one leaves with its last
steps pushed, and islands rejoin a restarted coordinator: every copy ends on the run's parameters."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

import atoll
from conftest import TOKENS_PER_STEP, IslandThread, MlpLm

HERE = os.path.dirname(os.path.abspath(__file__))


def small_run(**outer):
    return {"outer": {"run_id": "errors", "islands": 2, "sync_every": 4, **outer},
            "train": {"steps": 24}}


def test_a_module_of_another_shape_is_refused_naming_the_parameter():
    with atoll.Coordinator(small_run(), model=MlpLm(d=16), tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        with pytest.raises(atoll.FailedPreconditionError) as e:
            atoll.Island(MlpLm(d=24), coordinator.address, config=small_run(),
                         token=coordinator.token, quiet=True)
        assert "the run's parameter 'emb.weight' has 512 elements, the island's 768" in str(e.value), e.value
        assert e.value.code == "FAILED_PRECONDITION"


def test_a_bad_config_key_is_refused_before_joining():
    with pytest.raises(atoll.InvalidArgumentError) as e:
        atoll.Island(MlpLm(), "127.0.0.1:1", config={"outer": {"codecc": "fp4_e2m1"}}, quiet=True)
    assert "codecc" in str(e.value) and "codec" in str(e.value).replace("codecc", "")
    assert isinstance(e.value, ValueError) and e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(atoll.InvalidArgumentError, match="outer.codec"):
        atoll.Island(MlpLm(), "127.0.0.1:1", config={"outer": {"codec": "fp5"}}, quiet=True)
    with pytest.raises(atoll.InvalidArgumentError, match="island name"):
        atoll.Island(MlpLm(), "127.0.0.1:1", name="no spaces", quiet=True)
    # A rehearsed copier trains another island's data stream: a Python loop brings its own data.
    with pytest.raises(atoll.InvalidArgumentError, match=r'outer.fault = "copy"'):
        atoll.Island(MlpLm(), "127.0.0.1:1", config={"outer": {"fault": "copy"}}, quiet=True)


def test_a_refused_join_raises():
    with atoll.Coordinator(small_run(), model=MlpLm(), token="the-run-token",
                           tokens_per_step=TOKENS_PER_STEP, quiet=True) as coordinator:
        with pytest.raises(atoll.Error) as e:
            atoll.Island(MlpLm(), coordinator.address, config=small_run(), token="a-guess",
                         quiet=True)
        assert e.value.code in ("UNAUTHENTICATED", "PERMISSION_DENIED"), e.value
        assert "token" in str(e.value)
        with pytest.raises(atoll.NotFoundError, match="unknown run 'other'"):
            atoll.Island(MlpLm(), coordinator.address, config=small_run(run_id="other"),
                         token="the-run-token", quiet=True)
    with pytest.raises(atoll.InvalidArgumentError, match="format 1"):
        atoll.Island(MlpLm(), "127.0.0.1:1", state={"step": 3}, quiet=True)
    state = {"format": 1, "step": 8, "tokens": 256, "rounds": [2], "global_hashes": [1],
             "residuals": [{"fragment": 0, "elements": 10, "ranges": [(5, 2)],
                            "values": torch.zeros(3)}]}
    with pytest.raises(atoll.InvalidArgumentError, match=r"residual range \[5, 2\)"):
        atoll.Island(MlpLm(), "127.0.0.1:1", state=state, quiet=True)
    del state["tokens"]
    with pytest.raises(atoll.InvalidArgumentError, match="no 'tokens'"):
        atoll.Island(MlpLm(), "127.0.0.1:1", state=state, quiet=True)


def test_a_killed_island_resumes_from_its_checkpoint(tmp_path):
    config = small_run()
    init = MlpLm(seed=3)
    with atoll.Coordinator(config, model=init, tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        peer = IslandThread(MlpLm(seed=3), coordinator.address, "steady", 1, config=config,
                            token=coordinator.token)
        peer.start()
        worker = [sys.executable, os.path.join(HERE, "island_worker.py"), "--coordinator",
                  coordinator.address, "--name", "phoenix", "--config", json.dumps(config),
                  "--checkpoint", str(tmp_path / "phoenix.pt")]
        env = dict(os.environ, ATOLL_TOKEN=coordinator.token, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
        first = subprocess.run(worker + ["--die-at", "10"], capture_output=True, text=True,
                               timeout=120, env=env)
        assert first.returncode == -9, first.stdout + first.stderr
        assert "checkpoint 8" in first.stdout
        second = subprocess.run(worker, capture_output=True, text=True, timeout=120, env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "resuming at step 8" in second.stdout
        peer.join(120)
        assert not peer.is_alive() and peer.error is None, peer.error
        assert coordinator.wait(30)
        final = json.loads(second.stdout.strip().splitlines()[-1])
        rounds = coordinator.rounds
    # It trained steps 9 and 10 again (they were not checkpointed), then to its last step.
    assert final["steps"] == 24 and peer.island.steps == 24
    # Every copy ends on the service's parameters, bit for bit.
    assert final["hashes"] == coordinator.params_hashes == peer.island.fragment_hashes
    # The service went on without it while it was down (its lease ran out) and took its pushes
    # again after it rejoined: rounds 0 and 1 before the crash, its last rounds after.
    assert [r["round"] for r in rounds] == list(range(len(rounds)))
    assert all("phoenix" in r["contributors"] for r in rounds[:2]), rounds
    assert "phoenix" in rounds[-1]["contributors"], rounds


def test_sigterm_pushes_the_last_steps_and_leaves(tmp_path):
    config = small_run()
    with atoll.Coordinator(config, model=MlpLm(seed=3), tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        peer = IslandThread(MlpLm(seed=3), coordinator.address, "steady", 1, config=config,
                            token=coordinator.token)
        peer.start()
        leaving = subprocess.run(
            [sys.executable, os.path.join(HERE, "island_worker.py"), "--coordinator",
             coordinator.address, "--name", "leaver", "--config", json.dumps(config),
             "--checkpoint", str(tmp_path / "leaver.pt"), "--term-at", "10"],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, ATOLL_TOKEN=coordinator.token,
                     PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])))
        assert leaving.returncode == 0, leaving.stdout + leaving.stderr
        assert json.loads(leaving.stdout.strip().splitlines()[-1])["steps"] == 10
        assert "leaving: the last 2 step(s) of fragment 0 pushed to its round 2" in leaving.stderr
        peer.join(120)
        assert not peer.is_alive() and peer.error is None, peer.error
        assert coordinator.wait(30)
        rounds = coordinator.rounds
    # Its steps 9 and 10 count in round 2; the run went on with the other island.
    assert rounds[2]["ledger"]["leaver"]["on_time"] == 2 * TOKENS_PER_STEP, rounds[2]
    assert all(r["contributors"] == ["steady"] for r in rounds[3:]), rounds
    assert peer.island.fragment_hashes == coordinator.params_hashes


def test_islands_rejoin_a_restarted_coordinator(tmp_path):
    config = small_run()
    config["train"]["steps"] = 400  # 100 rounds: the restart comes early in them
    init = MlpLm(seed=3)
    first = atoll.Coordinator(config, model=init, tokens_per_step=TOKENS_PER_STEP,
                              run_dir=tmp_path / "service", quiet=True)
    second = None
    try:
        port = first.address.rsplit(":", 1)[1]
        islands = [IslandThread(MlpLm(seed=3), first.address, f"island{s}", s, config=config,
                                token=first.token) for s in (0, 1)]
        for island in islands:
            island.start()
        deadline = time.monotonic() + 60
        while first.committed_rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 3 <= first.committed_rounds < 100, first.committed_rounds
        first.stop()  # the islands lose their link; the service's state is on disk
        second = atoll.Coordinator(config, model=init, tokens_per_step=TOKENS_PER_STEP,
                                   run_dir=tmp_path / "service", resume=True, port=port,
                                   token=first.token, quiet=True)
        for island in islands:
            island.join(120)
            assert not island.is_alive() and island.error is None, island.error
        assert second.wait(30)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    a, b = islands
    assert a.island.steps == b.island.steps == 400
    assert a.island.fragment_hashes == b.island.fragment_hashes == second.params_hashes
    assert a.island.stats["rejoins"] + a.island.stats["resyncs"] >= 1, a.island.stats
    assert second.rounds[-1]["round"] == 99
