"""The codecs from Python are atoll's (the same bytes), and with FP4 or sparse int2 on the wire
(Streaming DiLoCo fragments, overlap, error feedback) every island's copy of the global
parameters hashes as the service's, every round."""

import copy

import pytest
import torch

import atoll
from conftest import TOKENS_PER_STEP, IslandThread, MlpLm, train_run


def fp4_e2m1(value):
    """The E2M1 code of a value already on its grid (sign, 2-bit exponent, 1-bit mantissa)."""
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    return (8 if value < 0 else 0) | grid.index(abs(value))


def test_fp4_bytes_are_the_codecs_layout():
    # MXFP4: one block of 32 values on the E2M1 grid times 0.5 (absmax 3.0: the scale is
    # 2^(floor(log2 3) - 2) = 2^-1, E8M0 byte 126), then the codes, two per byte, low nibble
    # first.
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    values = [(-1) ** i * grid[i % 8] * 0.5 for i in range(32)]
    payload = atoll.encode(torch.tensor(values), "fp4_e2m1")
    assert len(payload) == atoll.encoded_bytes("fp4_e2m1", 32) == 17
    codes = [fp4_e2m1(v / 0.5) for v in values]
    packed = bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, 32, 2))
    assert payload == bytes([126]) + packed, payload.hex()
    assert torch.equal(atoll.decode(payload, "fp4_e2m1", 32), torch.tensor(values))


@pytest.mark.parametrize("codec,density", [("fp4_e2m1", 1.0), ("int8", 1.0), ("int2", 0.05),
                                           ("int2_centroid", 0.05)])
def test_encode_then_decode_bounds_the_error(codec, density):
    x = torch.randn(10240, generator=torch.Generator().manual_seed(3))
    payload = atoll.encode(x, codec, topk_density=density, topk_chunk=1024)
    assert len(payload) == atoll.encoded_bytes(codec, x.numel(), density, 1024)
    y = atoll.decode(payload, codec, x.numel(), topk_density=density, topk_chunk=1024)
    assert y.shape == x.shape and torch.isfinite(y).all()
    if density < 1:
        # Each chunk of 1024 keeps its round(0.05 x 1024) = 51 largest magnitudes.
        assert (y != 0).sum().item() == 10 * 51
        chunks = x.abs().reshape(10, 1024)
        threshold = chunks.kthvalue(1024 - 51 + 1, 1).values.unsqueeze(1)
        assert torch.equal((y != 0).reshape(10, 1024), chunks >= threshold)
        assert len(payload) < x.numel() * 4 / 50
    else:
        assert (y - x).norm() / x.norm() < (0.2 if codec == "fp4_e2m1" else 0.02)
    # Stochastic rounding is seeded: the same seed, the same bytes; another seed, other bytes
    # (bin means have nothing to round).
    seeded = atoll.encode(x, codec, density, 1024, True, 5)
    assert seeded == atoll.encode(x, codec, density, 1024, True, 5)
    if codec not in ("fp32", "int2_centroid"):
        assert seeded != atoll.encode(x, codec, density, 1024, True, 6)


def test_codec_errors_name_the_problem():
    with pytest.raises(atoll.InvalidArgumentError, match="fp5"):
        atoll.encode(torch.zeros(4), "fp5")
    with pytest.raises(atoll.InvalidArgumentError, match="not finite|non-finite|finite"):
        atoll.encode(torch.tensor([1.0, float("nan")]), "fp4_e2m1")
    with pytest.raises(atoll.InvalidArgumentError, match="bytes"):
        atoll.decode(b"\x00" * 3, "fp4_e2m1", 32)


@pytest.mark.parametrize("outer", [
    {"codec": "fp4_e2m1", "num_fragments": 2, "fragment_sync_delay": 1, "error_feedback": True},
    {"codec": "int2", "topk_density": 0.05, "topk_chunk": 256, "error_feedback": True,
     "num_fragments": 2, "fragment_sync_delay": 1, "eager_updates": True},
], ids=["fp4-streaming", "sparse-int2-eager"])
def test_every_copy_hashes_as_the_service_every_round(outer):
    init = MlpLm(seed=3)
    config = {"outer": {"run_id": "codecs", "islands": 2, "sync_every": 4, **outer},
              "train": {"steps": 24}}
    islands, coordinator = train_run(init, config)
    records, final = coordinator.rounds, coordinator.params_hashes
    service = {(r["fragment"], r["round"]): int(r["params_hash"], 16) for r in records}
    # Fragment 0 syncs after steps 4, 8, .., 24; fragment 1 (offset H/2) after 2, 6, .., 22 and
    # with the run's last step.
    assert sorted(service) == [(0, r) for r in range(6)] + [(1, r) for r in range(7)]
    for island in islands:
        landed = island.island.landed
        assert len(landed) == len(service), landed
        for r in landed:
            assert r["global_hash"] == service[(r["fragment"], r["round"])], r
        assert island.island.fragment_hashes == final
        assert island.island.stats["bytes_sent"] > 0
    # Each fragment is a contiguous run of the module's parameters.
    names = [n for n, _ in init.named_parameters()]
    assert sum(coordinator.fragment_parameters, []) == names


def test_async_islands_end_on_the_services_parameters():
    init = MlpLm(seed=5)
    config = {"outer": {"run_id": "async", "islands": 2, "mode": "async", "sync_every": 4,
                        "codec": "fp4_e2m1", "error_feedback": True},
              "train": {"steps": 24}}
    islands, coordinator = train_run(init, config)
    records, final = coordinator.rounds, coordinator.params_hashes
    # Each island's contributions become versions on their own; every version's hash is the
    # service's, and both islands end on the final one.
    service = {r["round"]: int(r["params_hash"], 16) for r in records}
    for island in islands:
        assert island.island.is_async and island.island.run_progress > 0
        assert island.island.landed, "no version landed"
        for r in island.island.landed:
            assert r["global_hash"] == service[r["version"] - 1], (r, records)
        assert island.island.fragment_hashes == final
    assert sum(len(r["contributors"]) for r in records) >= 10


def test_figures_can_be_read_while_the_run_trains():
    # The getters take the service's and the islands' locks while commits and steps run on other
    # threads: reading them all the time must neither deadlock nor crash.
    init = MlpLm(seed=2)
    config = {"outer": {"run_id": "live", "islands": 2, "sync_every": 2, "codec": "fp4_e2m1",
                        "num_fragments": 2},
              "train": {"steps": 200}}
    with atoll.Coordinator(config, model=init, tokens_per_step=TOKENS_PER_STEP,
                           quiet=True) as coordinator:
        islands = [IslandThread(copy.deepcopy(init), coordinator.address, f"island{s}", s,
                                config=config, token=coordinator.token) for s in (0, 1)]
        for island in islands:
            island.start()
        reads = 0
        while any(i.is_alive() for i in islands):
            assert len(coordinator.params_hashes) == 2
            assert sum(p.numel() for p in coordinator.params()) == sum(
                p.numel() for p in init.parameters())
            coordinator.rounds
            for i in islands:
                if i.island is not None:
                    i.island.landed, i.island.stats, i.island.fragment_hashes, i.island.state_dict()
            reads += 1
        for island in islands:
            island.join(60)
            assert island.error is None, island.error
        assert coordinator.wait(30)
    assert reads > 10
    assert islands[0].island.fragment_hashes == coordinator.params_hashes
