"""Bad input from Python raises an exception that names the problem in a line or two, in Python's
words (keyword names), before anything joins: wrong types, None, tensors the island cannot sync
(dtype, layout, one tensor under two names); a parameter replaced mid-run is caught at the next
step instead of silently going unsynced. Modules of bf16 and fp16 parameters stay bit-identical
to the service. The package links no libtorch and says its version."""

import copy
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import atoll
from conftest import TOKENS_PER_STEP, MlpLm, batches, inner_step, make_optimizer

NOWHERE = "127.0.0.1:1"


def small_run(**outer):
    return {"outer": {"run_id": "bad-input", "islands": 2, "sync_every": 4, **outer},
            "train": {"steps": 16}}


def short(e):
    text = str(e.value)
    assert len(text) < 300 and text.count("\n") < 2, text
    return text


def test_wrong_types_are_named_in_one_line():
    model = MlpLm()
    with pytest.raises(TypeError) as e:
        atoll.Island(model, None, quiet=True)
    assert "coordinator" in short(e)
    with pytest.raises(TypeError) as e:
        atoll.Island(model, NOWHERE, name=123, quiet=True)
    assert short(e) == "name must be a string, got int"
    with pytest.raises(TypeError) as e:
        atoll.Island("a model", NOWHERE, quiet=True)
    assert "model must be a torch.nn.Module" in short(e)
    with pytest.raises(TypeError) as e:
        atoll.Island([("w", 3.0)], NOWHERE, quiet=True)
    assert "(name, tensor) pair" in short(e)
    with pytest.raises(TypeError) as e:
        atoll.Coordinator(small_run(), model=model, port=80.0)
    assert short(e) == "port must be an int, got float"
    with pytest.raises(atoll.InvalidArgumentError, match="model=.... is required"):
        atoll.Coordinator(small_run())
    with pytest.raises(TypeError, match="encode.tensor=.... must be a torch.Tensor"):
        atoll.encode([1.0, 2.0], "fp4_e2m1")


def test_tensors_the_island_cannot_sync_are_refused_by_name():
    w = torch.zeros(4, 4)
    cases = [
        ([("w", torch.zeros(4, dtype=torch.int64))], "parameter 'w' is torch.int64"),
        ([("w", w.t())], "parameter 'w' is not contiguous"),
        ([("a", w), ("b", w)], "parameters 'a' and 'b' are one tensor"),
        ([("w", torch.zeros(4, device="meta"))], "parameter 'w' is on meta"),
        ([], "no parameters to sync"),
    ]
    for params, message in cases:
        with pytest.raises(atoll.InvalidArgumentError) as e:
            atoll.Island(params, NOWHERE, config=small_run(), quiet=True)
        assert message in short(e), e.value


def test_a_replaced_parameter_is_caught_at_the_next_step():
    init = MlpLm()
    with atoll.Coordinator(small_run(), model=init, tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        model = copy.deepcopy(init)
        optimizer, data = make_optimizer(model), batches(0)
        island = atoll.Island(model, coordinator.address, config=small_run(islands=1),
                              token=coordinator.token, quiet=True, handle_sigterm=False)
        inner_step(model, optimizer, next(data))
        assert island.step(TOKENS_PER_STEP)
        # New memory under the same Parameter (.data set), then a new Parameter (as
        # load_state_dict(assign=True) makes): each caught, nothing synced.
        model.emb.weight.data = model.emb.weight.data.clone()
        with pytest.raises(atoll.FailedPreconditionError) as e:
            island.step(TOKENS_PER_STEP)
        assert "parameter 'emb.weight' is no longer the tensor the island joined with" in short(e)
        assert island.steps == 1
        model.fc1.weight = torch.nn.Parameter(model.fc1.weight.detach().clone())
        with pytest.raises(atoll.FailedPreconditionError, match="'emb.weight'"):
            island.step(TOKENS_PER_STEP)
        island.close()


def test_floating_point_buffers_are_named_in_a_warning():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.warns(UserWarning, match=r"buffers \(1.running_mean, 1.running_var\) are not synced"):
        with pytest.raises(atoll.Error):
            atoll.Island(model, NOWHERE, config=small_run(reconnect_timeout_s=0.1), quiet=True)


def nudge_run(init, config):
    """Two islands whose 'training' nudges every parameter in its own dtype (no forward pass:
    Debian's torch 1.13 has no fp16 matmul on the CPU), until the run is over."""
    models = [copy.deepcopy(init) for _ in range(2)]
    hashes = [None, None]
    errors = []
    with atoll.Coordinator(config, model=init, tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        def island(i):
            try:
                g = torch.Generator().manual_seed(i)
                with atoll.Island(models[i], coordinator.address, config=config,
                                  name=f"island{i}", token=coordinator.token, quiet=True,
                                  handle_sigterm=False) as isl:
                    going = True
                    while going:
                        with torch.no_grad():
                            for p in models[i].parameters():
                                p.add_(((torch.rand(p.shape, generator=g) - 0.5) * 0.01).to(p.dtype))
                        going = isl.step(TOKENS_PER_STEP)
                    hashes[i] = isl.fragment_hashes
            except BaseException as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        threads = [threading.Thread(target=island, args=(i,), daemon=True) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert coordinator.wait(30)
    return models, hashes, coordinator


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_modules_stay_bit_identical_to_the_service(dtype):
    init = MlpLm(seed=5).to(dtype)
    models, hashes, coordinator = nudge_run(init, small_run(codec="fp4_e2m1", num_fragments=2))
    assert hashes[0] == hashes[1] == coordinator.params_hashes
    # Each module holds the service's final parameters, rounded to its dtype as torch rounds.
    service = torch.cat(coordinator.params())
    for model in models:
        final = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        assert torch.equal(final, service.to(dtype).float())


def test_parameters_through_host_mirrors_stay_bit_identical(monkeypatch):
    # The path of CUDA parameters (host mirrors copied by the Python side when the core calls
    # back), taken here by CPU ones: no GPU is needed to check it.
    monkeypatch.setattr(atoll._tensors.HostParams, "mirrored", staticmethod(lambda t: True))
    init = MlpLm(seed=6)
    models, hashes, coordinator = nudge_run(init, small_run(codec="fp4_e2m1", num_fragments=2))
    assert hashes[0] == hashes[1] == coordinator.params_hashes
    service = torch.cat(coordinator.params())
    for model in models:
        assert torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), service)


def test_the_package_says_its_version_and_links_no_libtorch():
    assert atoll.__version__.count(".") == 2
    core = atoll._core.__file__
    linked = subprocess.run(["ldd", core], capture_output=True, text=True, check=True).stdout
    assert "libtorch" not in linked and "libc10" not in linked, linked
    assert os.path.basename(core).startswith("_core")


def interrupted_after(code, ready, sig=signal.SIGINT):
    """Runs `code` in a Python of its own, sends it `sig` once it printed `ready`; its stderr
    and the seconds it took to end after the signal."""
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, "-c", code], cwd=here, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == ready
        time.sleep(0.5)
        p.send_signal(sig)
        sent = time.monotonic()
        _, err = p.communicate(timeout=30)
        return err, time.monotonic() - sent
    finally:
        p.kill()


def test_blocking_calls_give_way_to_ctrl_c():
    # Each would wait 60 s: for the run to end; for a coordinator that is not there.
    waits = [("serving",
              "c = atoll.Coordinator({'outer': {'islands': 1}}, model=conftest.MlpLm(), quiet=True)\n"
              "print('serving', flush=True)\n"
              "c.wait(60)\n"),
             ("joining",
              "print('joining', flush=True)\n"
              "atoll.Island(conftest.MlpLm(), '127.0.0.1:1', quiet=True,\n"
              "             config={'outer': {'reconnect_timeout_s': 60}})\n")]
    for ready, code in waits:
        err, took = interrupted_after("import atoll, conftest\n" + code, ready)
        assert "KeyboardInterrupt" in err and took < 10, (ready, took, err)
        assert "atoll.Error" not in err and "Cancelled" not in err, err


# Island a steps to its first push, whose round waits for island b, which never steps: the round
# would wait outer.round_timeout_s (600 s).
WAITING_FOR_A_ROUND = (
    "import sys, time, atoll, conftest\n"
    "cfg = {'outer': {'islands': 2, 'sync_every': 2}}\n"
    "c = atoll.Coordinator(cfg, model=conftest.MlpLm(), tokens_per_step=conftest.TOKENS_PER_STEP,\n"
    "                      quiet=True)\n"
    "a, b = (atoll.Island(conftest.MlpLm(), c.address, config=cfg, token=c.token, name=n,\n"
    "                     quiet=True, handle_sigterm=n == 'a') for n in 'ab')\n"
    "print('stepping', flush=True)\n")


def test_ctrl_c_ends_a_step_waiting_for_a_round():
    # KeyboardInterrupt there; a later step is refused; close() leaves without waiting, and the
    # process ends with the other island and the coordinator left undone.
    code = WAITING_FOR_A_ROUND + (
        "try:\n"
        "    while a.step(conftest.TOKENS_PER_STEP):\n"
        "        pass\n"
        "except KeyboardInterrupt:\n"
        "    try:\n"
        "        a.step(conftest.TOKENS_PER_STEP)\n"
        "    except atoll.FailedPreconditionError as e:\n"
        "        print('refused:', e, file=sys.stderr)\n"
        "    t = time.monotonic()\n"
        "    a.close()\n"
        "    print(f'closed in {time.monotonic() - t:.1f} s', file=sys.stderr)\n"
        "    raise\n")
    err, took = interrupted_after(code, "stepping")
    assert "KeyboardInterrupt" in err and took < 10, (took, err)
    assert "refused: the island was interrupted while it waited for a round" in err, err
    closed = float(err.split("closed in ")[1].split(" s")[0])
    assert closed < 5, err


def test_sigterm_leaves_a_step_waiting_for_a_round():
    # The documented SIGTERM leave: step() returns False at once, what it trained pushed.
    code = WAITING_FOR_A_ROUND + (
        "steps = 0\n"
        "while a.step(conftest.TOKENS_PER_STEP):\n"
        "    steps += 1\n"
        "print(f'left after {steps + 1} steps', file=sys.stderr)\n")
    err, took = interrupted_after(code, "stepping", signal.SIGTERM)
    assert "left after 2 steps" in err and took < 10, (took, err)
    assert "Traceback" not in err, err


def test_hashes_print_as_the_logs_print_them():
    h = atoll.params_hash(torch.arange(8, dtype=torch.float32))
    assert isinstance(h, int) and len(repr(h)) == 16 and f"{h}" == f"{int(h):016x}"
    assert str([h]) == f"[{int(h):016x}]"
