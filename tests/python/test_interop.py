"""A Python island and a C++ `atoll island` in one run of atoll's own GPT: the Python one holds a
GPT written here in PyTorch under atoll's parameter names (`atoll export --names atoll`'s), and
every copy of the global parameters stays bit-identical to the service's for 20 rounds."""

import json
import os
import re
import struct
import subprocess

import torch

import atoll
from atoll_gpt import Gpt
from conftest import run_atoll

N_LAYER, D_MODEL, N_HEAD, CONTEXT, VOCAB, BATCH = 1, 32, 2, 32, 256, 2
H, STEPS = 2, 40


def read_safetensors(path):
    """{name: tensor} of an F32 safetensors file (8-byte header length, JSON header, data)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=torch.float32).reshape(info["shape"])
    return out


def text(n=30000):
    words = ["the", "island", "trains", "a", "model", "across", "slow", "links", "and", "every",
             "round", "brings", "its", "pseudo", "gradient", "home", "to", "service"]
    g = torch.Generator().manual_seed(11)
    picks = torch.randint(0, len(words), (n // 4,), generator=g).tolist()
    return (" ".join(words[i] for i in picks) + ".\n")[:n]


def test_a_python_and_an_atoll_island_stay_bit_identical_for_20_rounds(tmp_path, atoll_bin):
    corpus = text()
    (tmp_path / "text.txt").write_text(corpus)
    config = tmp_path / "run.toml"
    config.write_text(f"""
[model]
n_layer = {N_LAYER}
d_model = {D_MODEL}
n_head = {N_HEAD}
context = {CONTEXT}
vocab = {VOCAB}
[data]
path = "{tmp_path / 'text.txt'}"
val_fraction = 0.1
[train]
steps = {STEPS}
batch_size = {BATCH}
eval_every = 0
threads = 1
log_every = 10
[optim]
warmup_steps = 2
[outer]
run_id = "interop"
islands = 2
sync_every = {H}
codec = "fp4_e2m1"
error_feedback = true
""")
    env = dict(os.environ, ATOLL_TOKEN="interop-token")
    coordinator = subprocess.Popen(
        [atoll_bin, "coordinator", "--config", str(config), "--run-dir", str(tmp_path / "service"),
         "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)
    cpp = None
    try:
        first = coordinator.stdout.readline()
        address = re.search(r"listening on (\S+)", first).group(1)
        cpp = subprocess.Popen(
            [atoll_bin, "island", "--config", str(config), "--coordinator", address, "--name",
             "cpp", "--run-dir", str(tmp_path / "cpp")], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=env)
        model = Gpt(N_LAYER, D_MODEL, N_HEAD, CONTEXT, VOCAB)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.tensor(list(corpus.encode()), dtype=torch.long)
        g = torch.Generator().manual_seed(5)
        with atoll.Island(model, address, config=str(config), name="py", token="interop-token",
                          quiet=True, handle_sigterm=False) as island:
            assert island.num_fragments == 1
            while True:
                starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=g)
                x = torch.stack([data[s:s + CONTEXT] for s in starts])
                y = torch.stack([data[s + 1:s + CONTEXT + 1] for s in starts])
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if not island.step(tokens=BATCH * CONTEXT, loss=loss):
                    break
            landed = island.landed
            final = island.fragment_hashes
        cpp_out = cpp.communicate(timeout=120)[0]
        assert cpp.returncode == 0, cpp_out
        service_out = coordinator.communicate(timeout=60)[0]
        assert coordinator.returncode == 0, service_out
    finally:
        for p in (cpp, coordinator):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    rounds = [json.loads(line) for line in open(tmp_path / "service" / "rounds.jsonl")]
    assert len(rounds) == STEPS // H == 20
    service = {r["round"]: r["params_hash"] for r in rounds}
    assert all(sorted(r["contributors"]) == ["cpp", "py"] for r in rounds), rounds
    cpp_rounds = [json.loads(line) for line in open(tmp_path / "cpp" / "metrics.jsonl")]
    cpp_hashes = {r["round"]: r["global_hash"] for r in cpp_rounds if "global_hash" in r}
    assert len(landed) == 20 and len(cpp_hashes) == 20
    for r in landed:
        assert f"{r['global_hash']:016x}" == service[r["round"]] == cpp_hashes[r["round"]], r
    final_hex = f"{final[0]:016x}"
    assert f"global params {final_hex}" in cpp_out, cpp_out
    assert f"stopped after 20 rounds, global params {final_hex}" in service_out, service_out

    # atoll export's safetensors (atoll's names) load into the module written here, and hold the
    # very values the Python island ended on.
    out = tmp_path / "global.safetensors"
    exported = run_atoll(atoll_bin, "export", str(tmp_path / "service"), "--names", "atoll",
                         "--out", str(out))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    fresh = Gpt(N_LAYER, D_MODEL, N_HEAD, CONTEXT, VOCAB)
    fresh.load_state_dict(read_safetensors(out))
    for (name, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a.detach(), b.detach()), name
