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
import json
import tomllib

import torch  # before the core: libtorch's Python bindings, which its tensors are

from . import _core
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
    decode,
    encode,
    encoded_bytes,
    params_hash,
)

__all__ = [
    "Island", "Coordinator", "encode", "decode", "encoded_bytes", "params_hash", "Error",
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


def _default_name():
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


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
        trained since its last push, leave, and return False.
    """

    def __init__(self, model, coordinator, *, config=None, overrides=None, name=None, token=None,
                 token_file=None, state=None, credential_file=None, tls_ca=None, tls_cert=None,
                 tls_key=None, quiet=False, handle_sigterm=True):
        if isinstance(model, torch.nn.Module):
            params = list(model.named_parameters())
        else:
            params = list(model)
        path, pairs, has_model = _config(config, overrides)
        self._stop = threading.Event()
        self._handling_sigterm = False
        self._core = None
        self._core = _core._Island(
            params, coordinator, name or _default_name(), _token(token, token_file), path, pairs,
            has_model, os.fspath(credential_file) if credential_file else "", state,
            [os.fspath(f) if f else "" for f in (tls_ca, tls_cert, tls_key)], quiet)
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            stop = self._stop  # the handler holds the event, not the island

            def on_sigterm(signum, frame):
                stop.set()

            previous = signal.signal(signal.SIGTERM, on_sigterm)
            # A handler installed from C reads as None: the default is put back then.
            self._previous_handler = signal.SIG_DFL if previous is None else previous
            self._handling_sigterm = True

    def _restore_sigterm(self):
        # Only the main thread may set handlers (one set there is put back there).
        if self._handling_sigterm and threading.current_thread() is threading.main_thread():
            self._handling_sigterm = False
            signal.signal(signal.SIGTERM, self._previous_handler)

    def step(self, tokens, loss=None):
        """After each inner optimizer step, with the tokens it trained (and its loss, shown on the
        service's status page). True: go on. False: the island is done (the run's last step: the
        module then holds the run's final global parameters; or SIGTERM: it left)."""
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach())
        tokens = int(tokens)
        if tokens < 1:
            raise InvalidArgumentError(f"step(tokens=...) must be the tokens the step trained, >= 1; got {tokens}")
        going = self._core.step(tokens, loss, self._stop.is_set())
        if not going:
            self._restore_sigterm()
        return going

    def stop(self):
        """Asks the island to leave at its next step(), as SIGTERM does."""
        self._stop.set()

    def close(self):
        """Leaves the run (idempotent): an island that is not done pushes what it trained since its
        last push first."""
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
        return self._core.state()

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
    fragment_hashes = property(lambda self: self._core.fragment_hashes,
                               doc="atoll's hash of each fragment's global parameters, here")
    rounds = property(lambda self: self._core.rounds, doc="each fragment's open round")
    landed = property(lambda self: self._core.landed, doc="the rounds merged so far")
    stats = property(lambda self: self._core.stats)


class Coordinator:
    """A run's coordinator in this process (notebooks, tests): `atoll coordinator` on a thread,
    serving gRPC over TCP until the run ends (every island gone after its last round) or stop().

    config: a TOML path or dict, as for Island (the run's [outer] and [train] steps).
    model: a module (or (name, tensor) pairs) atoll does not build: the run's initial global
        parameters, in fragments of contiguous parameters. Without it, the run trains atoll's
        model of the config's [model].
    tokens_per_step: with a module, the most tokens an island trains per inner step (what a
        contribution weighs at most; default: the config's [train] batch x model.context).
    token / token_file: the run token islands present (default: $ATOLL_TOKEN, else a random one:
        coordinator.token).
    """

    def __init__(self, config=None, *, overrides=None, model=None, host="127.0.0.1", port=0,
                 token=None, token_file=None, run_dir=None, resume=False, http_port=None,
                 tokens_per_step=0, quiet=False):
        path, pairs, _ = _config(config, overrides)
        # A run always has a token: without one given (or in $ATOLL_TOKEN), a random one, which
        # islands of this process take from coordinator.token.
        self.token = _token(token, token_file) or secrets.token_hex(16)
        module = None
        if model is not None:
            module = list(model.named_parameters()) if isinstance(model, torch.nn.Module) else list(model)
        self._core = _core._Coordinator(
            path, pairs, f"{host}:{port}", self.token,
            os.fspath(run_dir) if run_dir else "", resume,
            f"{host}:{http_port}" if http_port is not None else "", module, int(tokens_per_step),
            quiet)

    address = property(lambda self: self._core.address, doc='"HOST:PORT" islands join at')

    def wait(self, timeout_s):
        """Waits up to timeout_s for the run to end; True when it has."""
        return self._core.wait(float(timeout_s))

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
    params_hashes = property(lambda self: self._core.params_hashes,
                             doc="atoll's hash of each fragment's global parameters")
    fragment_parameters = property(lambda self: self._core.fragment_parameters)

    def params(self):
        """Each fragment's global parameters, flat (fp32 copies)."""
        return self._core.params()
