"""atoll from Python: any PyTorch module becomes an island of a DiLoCo run.

    import atoll
    with atoll.Island(model, coordinator="HOST:PORT", config="run.toml", name="island0") as island:
        for batch in loader:
            loss = loss_fn(model(batch))
            loss.backward(); optimizer.step(); optimizer.zero_grad()
            if not island.step(tokens=batch.numel(), loss=loss):
                break  # the run is over: the module holds its final global parameters

The user keeps their model, optimizer, data and precision; atoll does the outer sync: join,
fragments, pseudo-gradients under any codec with error feedback, overlap (tau, alpha), the
Nesterov outer step on the service, heartbeats, rejoins, leaving with its last steps pushed
(SIGTERM), sync and async runs, hash-checked copies of the global parameters. The README's "atoll
from Python" section has the whole story; errors are atoll.Error subclasses with a `.code`.
"""

import os
import re
import secrets
import signal
import socket
import threading
import time
import weakref
import json
import tomllib

import torch

from . import _core, _tensors
from ._core import (  # noqa: F401  (re-exported)
    AbortedError,
    AlreadyExistsError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)

__version__ = _core.__version__

__all__ = [
    "Island", "Coordinator", "Hash", "encode", "decode", "encoded_bytes", "params_hash", "Error",
    "InvalidArgumentError", "FailedPreconditionError", "NotFoundError", "AlreadyExistsError",
    "PermissionDeniedError", "UnauthenticatedError", "UnavailableError", "DeadlineExceededError",
    "ResourceExhaustedError", "DataLossError", "AbortedError",
]


def _flatten(table, prefix=""):
    """{"outer": {"codec": "fp4_e2m1"}} or {"outer.codec": ...} -> [("outer.codec", "fp4_e2m1")]."""
    out = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _flatten(value, name + ".")
        elif isinstance(value, bool):
            out.append((name, "true" if value else "false"))
        elif isinstance(value, (int, float, str)):
            out.append((name, str(value)))
        elif isinstance(value, os.PathLike):
            out.append((name, os.fspath(value)))
        else:
            raise InvalidArgumentError(
                f"config key '{name}': a {type(value).__name__} is not a config value "
                "(numbers, strings and booleans are)")
    return out


def _config(config, overrides):
    """(TOML path or "", [(key, value)], whether the config describes atoll's [model])."""
    path = ""
    pairs = []
    has_model = False
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, "rb") as f:
                has_model = "model" in tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError):
            pass  # the core names the problem
    elif isinstance(config, dict):
        pairs += _flatten(config)
    elif config is not None:
        raise InvalidArgumentError(
            f"config must be a TOML file's path or a dict, got {type(config).__name__}")
    if overrides:
        pairs += _flatten(overrides)
    has_model = has_model or any(k == "model" or k.startswith("model.") for k, _ in pairs)
    return path, pairs, has_model


def _token(token, token_file):
    if token is not None:
        return token
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as e:
            raise NotFoundError(f"the run token file {token_file}: {e.strerror}") from None
    return os.environ.get("ATOLL_TOKEN", "")


def encode(tensor, codec, topk_density=1.0, topk_chunk=4096, stochastic=False, seed=0):
    """The tensor (as fp32, flat) under `codec` ("fp4_e2m1", "int8", "sparse_int2", ...): the
    bytes a push of it carries on the wire."""
    _, flat = _tensors.flat_floats(tensor, "encode(tensor=...)")
    return _core.encode(flat, str(codec), float(topk_density), int(topk_chunk), bool(stochastic),
                        int(seed))


def decode(payload, codec, numel, topk_density=1.0, topk_chunk=4096):
    """The fp32 tensor of `numel` elements a payload of `codec` decodes to."""
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"decode(payload=...) must be bytes, got {type(payload).__name__}")
    return _tensors.tensor_of(_core.decode(bytes(payload), str(codec), int(numel),
                                           float(topk_density), int(topk_chunk)))


def encoded_bytes(codec, numel, topk_density=1.0, topk_chunk=4096):
    """The size of a payload of `numel` elements under `codec`."""
    return _core.encoded_bytes(str(codec), int(numel), float(topk_density), int(topk_chunk))


def params_hash(flat):
    """atoll's hash of fp32 parameters (a fragment's, flat), as islands and the service print it
    (16 hex digits: f"{params_hash(t):016x}")."""
    _, buffer = _tensors.flat_floats(flat, "params_hash(flat=...)")
    return Hash(_core.params_hash(buffer))


class Hash(int):
    """atoll's 64-bit hash of parameters: an int that prints as the logs and rounds.jsonl write it,
    16 hex digits."""

    def __repr__(self):
        return f"{int(self):016x}"

    __str__ = __repr__


def _hashes(values):
    return [Hash(v) for v in values]


def _landed(records):
    for r in records:
        r["global_hash"] = Hash(r["global_hash"])
    return records


def _check_types(**named):
    """Arguments of the wrong type, named as Python names them (one line each)."""
    for name, (value, kinds, wanted) in named.items():
        if value is not None and not isinstance(value, kinds):
            raise TypeError(f"{name} must be {wanted}, got {type(value).__name__}")


def _default_name():
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


def _core_state(state):
    """A state_dict() as the core reads it: residual values as fp32 host memory (the tensors are
    kept by the returned dict while the core copies them)."""
    if state is None:
        return None
    core = dict(state)
    residuals = state.get("residuals")
    if isinstance(residuals, list):
        core["residuals"] = []
        for r in residuals:
            if isinstance(r, dict) and isinstance(r.get("values"), torch.Tensor):
                r = dict(r)
                kept, r["values"] = _tensors.flat_floats(r["values"], "a residual's values")
                r["_kept"] = kept
            core["residuals"].append(r)
    return core


class Island:
    """One island of a DiLoCo run around a torch.nn.Module (or named parameters).

    model: the module whose parameters are synced (all of model.named_parameters()), or a list
        of (name, tensor) pairs.
    coordinator: "HOST:PORT" of the run's coordinator (`atoll coordinator` or atoll.Coordinator).
    config: a TOML file's path or a dict ({"outer": {"codec": "fp4_e2m1"}} or
        {"outer.codec": "fp4_e2m1"}): the island's [outer] choices (codec, error feedback, tau,
        alpha, timeouts, run_id); overrides: more keys on top. When it has a [model] section, the
        module holds atoll's own model of that config (the names and shapes of `atoll export
        --names atoll`) and joins runs of `atoll island`s; otherwise it joins a run whose
        coordinator serves this module (atoll.Coordinator(model=...)).
    name: the island's name in the run (default: host and pid).
    token / token_file: the run token (default: $ATOLL_TOKEN).
    state: a dict from Island.state_dict(), to resume after a restart.
    credential_file: where the session credential is kept, so that a restarted island ends its
        old membership at once instead of waiting for its lease to run out.
    tls_ca: use TLS and trust these root certificates (PEM); tls_cert, tls_key: mutual TLS, the
        island's certificate and key (as `atoll island --tls-ca/--tls-cert/--tls-key`).
    handle_sigterm: in the main thread, SIGTERM makes the next step() push what the island
        trained since its last push, leave, and return False (a step() waiting for a round
        leaves at once).

    Parameters are float32, bfloat16, float16 or float64, contiguous, on the CPU (read and written
    in place) or a CUDA device (through host copies); each tensor once (tied weights: once). The
    island reads and writes the tensors it joined with: replacing one (load_state_dict(assign=
    True), setting .data) raises at the next step(). Buffers are not synced (a warning names
    persistent floating-point ones, e.g. BatchNorm's running statistics).
    """

    def __init__(self, model: "torch.nn.Module | list", coordinator: str, *, config=None,
                 overrides: "dict | None" = None, name: "str | None" = None,
                 token: "str | None" = None, token_file=None, state: "dict | None" = None,
                 credential_file=None, tls_ca=None, tls_cert=None, tls_key=None,
                 quiet: bool = False, handle_sigterm: bool = True):
        self._core = None
        path_like = (str, os.PathLike)
        _check_types(coordinator=(coordinator, str, 'a "HOST:PORT" string'),
                     name=(name, str, "a string"), token=(token, str, "a string"),
                     token_file=(token_file, path_like, "a path"),
                     credential_file=(credential_file, path_like, "a path"),
                     state=(state, dict, "a dict from Island.state_dict()"),
                     overrides=(overrides, dict, "a dict"))
        if coordinator is None:
            raise TypeError('coordinator must be a "HOST:PORT" string, got None')
        self._params = _tensors.HostParams(
            _tensors.named_parameters(model, "model"),
            model if isinstance(model, torch.nn.Module) else None)
        path, pairs, has_model = _config(config, overrides)
        self._stop = threading.Event()
        self._handling_sigterm = False
        self._core = _core._Island(
            self._params.specs(), self._params.mirror_copies(), coordinator,
            name or _default_name(), _token(token, token_file), path, pairs, has_model,
            os.fspath(credential_file) if credential_file else "", _core_state(state),
            [os.fspath(f) if f else "" for f in (tls_ca, tls_cert, tls_key)], bool(quiet))
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            island = weakref.ref(self)  # the handler does not keep the island alive

            def on_sigterm(signum, frame):
                target = island()
                if target is not None:
                    target.stop()

            previous = signal.signal(signal.SIGTERM, on_sigterm)
            # A handler installed from C reads as None: the default is put back then.
            self._previous_handler = signal.SIG_DFL if previous is None else previous
            self._handling_sigterm = True

    def _restore_sigterm(self):
        # Only the main thread may set handlers (one set there is put back there).
        if self._handling_sigterm and threading.current_thread() is threading.main_thread():
            self._handling_sigterm = False
            signal.signal(signal.SIGTERM, self._previous_handler)

    def step(self, tokens: int, loss: "float | torch.Tensor | None" = None) -> bool:
        """After each inner optimizer step, with the tokens it trained (and its loss, shown on the
        service's status page). True: go on. False: the island is done (the run's last step: the
        module then holds the run's final global parameters; or SIGTERM: it left). Ctrl-C while
        it waits for a round raises KeyboardInterrupt; the island can then only be closed."""
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach())
        elif loss is not None and not isinstance(loss, (int, float)):
            raise TypeError(f"loss must be a number or a tensor, got {type(loss).__name__}")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise TypeError(f"tokens must be an int, got {type(tokens).__name__}")
        if tokens < 1:
            raise InvalidArgumentError(f"step(tokens=...) must be the tokens the step trained, >= 1; got {tokens}")
        self._params.check_unchanged()
        going = self._core.step(tokens, None if loss is None else float(loss), self._stop.is_set())
        if not going:
            self._restore_sigterm()
        return going

    def stop(self):
        """Asks the island to leave at its next step(), as SIGTERM does; a step() waiting for a
        round leaves at once (returning False: what it trained was pushed)."""
        self._stop.set()
        self._core.request_stop()

    def close(self):
        """Leaves the run (idempotent): an island that is not done pushes what it trained since its
        last push first; one interrupted by Ctrl-C leaves at once, without the rounds in flight."""
        try:
            self._core.close()
        finally:
            self._restore_sigterm()

    def __del__(self):
        # An island dropped without close() leaves the run here, not in the core's destructor
        # (which would wait for the network holding the GIL).
        if getattr(self, "_core", None) is not None:
            try:
                self._core.close()
                self._restore_sigterm()
            except Exception:  # noqa: BLE001  (nothing can be raised from __del__)
                pass

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        try:
            self.close()
        except Error:
            if kind is None:
                raise  # else the loop's own exception is the one to see
        return False

    def state_dict(self):
        """The island's outer state for a checkpoint, beside the module's and optimizer's own
        state_dict: its step and tokens, each fragment's round and global hash, and what error
        feedback has not sent yet. Resume with atoll.Island(..., state=...)."""
        state = self._core.state()
        for r in state["residuals"]:
            r["values"] = _tensors.tensor_of(r["values"])
        return state

    def describe(self):
        """"H = 50, 2 fragment(s), tau = 2, alpha = 0.50, fp4_e2m1": the island's outer settings."""
        return self._core.describe()

    # What the island knows (read-only).
    steps = property(lambda self: self._core.step_count, doc="inner steps, as the run counts them")
    tokens = property(lambda self: self._core.tokens, doc="tokens trained")
    done = property(lambda self: self._core.done)
    is_async = property(lambda self: self._core.is_async)
    max_steps = property(lambda self: self._core.max_steps, doc="the run's steps for this island")
    run_progress = property(lambda self: self._core.run_progress,
                            doc="the run's position (async: for the learning-rate schedule)")
    island_id = property(lambda self: self._core.island_id)
    num_fragments = property(lambda self: self._core.num_fragments)
    fragment_parameters = property(lambda self: self._core.fragment_parameters,
                                   doc="each fragment's parameter names")
    fragment_hashes = property(lambda self: _hashes(self._core.fragment_hashes),
                               doc="atoll's hash of each fragment's global parameters, here")
    rounds = property(lambda self: self._core.rounds, doc="each fragment's open round")
    landed = property(lambda self: _landed(self._core.landed), doc="the rounds merged so far")
    stats = property(lambda self: self._core.stats)


class Coordinator:
    """A run's coordinator in this process (notebooks, tests): `atoll coordinator` on a thread,
    serving gRPC over TCP until the run ends (every island gone after its last round) or stop().

    config: a TOML path or dict, as for Island (the run's [outer] and [train] steps).
    model: a module (or (name, tensor) pairs): the run's initial global parameters, in fragments
        of contiguous parameters. Required: a run of atoll's own model of a config's [model] is
        served by `atoll coordinator` (the binary builds that model; this package links no
        libtorch).
    tokens_per_step: with a module, the most tokens an island trains per inner step (what a
        contribution weighs at most; default: the config's [train] batch x model.context).
    token / token_file: the run token islands present (default: $ATOLL_TOKEN, else a random one:
        coordinator.token).
    """

    def __init__(self, config=None, *, overrides: "dict | None" = None,
                 model: "torch.nn.Module | list | None" = None, host: str = "127.0.0.1",
                 port: int = 0, token: "str | None" = None, token_file=None, run_dir=None,
                 resume: bool = False, http_port: "int | None" = None, tokens_per_step: int = 0,
                 quiet: bool = False):
        _check_types(host=(host, str, "a string"), port=(port, (int, str), "an int"),
                     token=(token, str, "a string"), http_port=(http_port, int, "an int"),
                     tokens_per_step=(tokens_per_step, int, "an int"),
                     overrides=(overrides, dict, "a dict"))
        if model is None:
            raise InvalidArgumentError(
                "Coordinator(model=...) is required: the run's initial parameters (a run of "
                "atoll's own [model] is served by `atoll coordinator`)")
        path, pairs, _ = _config(config, overrides)
        # A run always has a token: without one given (or in $ATOLL_TOKEN), a random one, which
        # islands of this process take from coordinator.token.
        self.token = _token(token, token_file) or secrets.token_hex(16)
        module, kept = [], []
        for name, t in _tensors.named_parameters(model, "model"):
            flat, buffer = _tensors.flat_floats(t, f"parameter '{name}'")
            kept.append(flat)
            module.append((name, list(t.shape), buffer))
        self._core = _core._Coordinator(
            path, pairs, f"{host}:{port}", self.token,
            os.fspath(run_dir) if run_dir else "", bool(resume),
            f"{host}:{http_port}" if http_port is not None else "", module, int(tokens_per_step),
            bool(quiet))

    address = property(lambda self: self._core.address, doc='"HOST:PORT" islands join at')

    def wait(self, timeout_s: float) -> bool:
        """Waits up to timeout_s for the run to end; True when it has. Ctrl-C interrupts it."""
        deadline = time.monotonic() + float(timeout_s)
        while True:
            # In slices, so that Python handles signals (KeyboardInterrupt) between them.
            if self._core.wait(max(0.0, min(0.1, deadline - time.monotonic()))):
                return True
            if time.monotonic() >= deadline:
                return False

    def stop(self):
        self._core.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def rounds(self):
        """Each committed round's record (rounds.jsonl's), in commit order."""
        return [json.loads(r) for r in self._core.rounds]

    committed_rounds = property(lambda self: self._core.committed_rounds)
    params_hashes = property(lambda self: _hashes(self._core.params_hashes),
                             doc="atoll's hash of each fragment's global parameters")
    fragment_parameters = property(lambda self: self._core.fragment_parameters)

    def params(self):
        """Each fragment's global parameters, flat (fp32 copies)."""
        return [_tensors.tensor_of(b) for b in self._core.params()]
