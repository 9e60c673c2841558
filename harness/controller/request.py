"""One ``run()`` call's arguments, checked: a frozen :class:`RunRequest`.

Every argument has one validator here (:data:`VALIDATORS`), named after
it, and every bad value is a :class:`~harness.errors.SettingError` (or a
``FaultError``/``SerializationError``) naming the argument, raised before
any process starts.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

from harness import plan as plan_module
from harness.controller.replicas import parse_check_replicas, parse_reference
from harness.controller.scripts import check_import_time_env
from harness.core import serialize
from harness.errors import SerializationError, SettingError, hide_in_setup_errors
from harness.faults import Fault
from harness.launch.backends import backend_of
from harness.network import NetworkChoice, choose_network
from harness.controller.restarts import check_restart_on
from harness.settings import RunSettings
from harness.validators import (DEFAULT_RESTART_ON, parse_cluster, parse_grace, parse_restart_on,
                                parse_restart_policy, parse_restarts, parse_seconds)

if TYPE_CHECKING:
    from harness.controller.watch import OnProgress

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

LEDGER_LEVELS = ("calls", "collectives")
# run(on_return=...): a worker whose fn returned stays until the run is
# decided, or exits as a script does.
ON_RETURN = ("stay", "exit")


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What ``Cluster.run`` was asked, checked.

    Attributes, one per argument of :meth:`harness.controller.Cluster.run`:

    - ``payload``: ``fn``, ``args`` and ``kwargs``, serialized for the workers.
    - ``settings``: the cluster's settings with ``timeout``, ``grace``,
      ``restarts`` and ``restart_policy`` applied.
    - ``plan``: the fault plan (``faults``), checked against N and the restarts.
    - ``sync_check``, ``env`` (the workers' extra variables), ``ledger`` (a
      level name or None), ``step_fn``, ``restart_on`` (the outcomes that
      restart), ``tolerance`` (``check_replicas``; None: off),
      ``reference_tolerance`` (``reference``; None: off), ``exit_on_return``
      (``on_return="exit"``), ``progress``, ``end_when_certain``,
      ``restart_echoes_together``, ``watch_state``.
    - ``network``: how the run is networked, chosen from the settings and
      the plan (:func:`harness.network.choose_network`).
    """

    payload: bytes
    settings: RunSettings
    plan: Tuple[Fault, ...]
    sync_check: bool = False
    env: Tuple[Tuple[str, str], ...] = ()
    ledger: Optional[str] = "calls"
    step_fn: Optional[str] = None
    restart_on: frozenset = frozenset()
    tolerance: Optional[float] = None
    reference_tolerance: Optional[float] = None
    exit_on_return: bool = False
    end_when_certain: bool = False
    restart_echoes_together: bool = True
    watch_state: bool = False
    progress: Optional[OnProgress] = None
    network: NetworkChoice = NetworkChoice("host")  # noqa: RUF009 - frozen, shared safely

    @property
    def fingerprint(self) -> bool:
        """Whether the workers fingerprint their variables when fn returns."""
        return self.tolerance is not None or self.reference_tolerance is not None


def serialize_call(fn: Callable, args: Sequence, kwargs: Optional[dict]) -> bytes:
    if not callable(fn):
        raise SerializationError(f"mwms_cluster.run: fn must be callable, got {fn!r}")
    try:
        return serialize.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise SerializationError(
            f"mwms_cluster.run: cannot serialize {getattr(fn, '__qualname__', fn)!r} or its "
            f"arguments for the worker processes ({type(e).__name__}: {e}). Objects such as "
            f"open files, locks, sockets or TensorFlow tensors made in the parent cannot be "
            f"sent; create them inside fn.") from e


def parse_ledger(value) -> Optional[str]:
    """``run(ledger=...)`` as a level name, or None for off."""
    if value is True:
        return "calls"
    if value is False or value is None:
        return None
    if value in LEDGER_LEVELS:
        return value
    raise SettingError(f"run(ledger=...): {value!r} is not one of True, False, "
                       f"{', '.join(map(repr, LEDGER_LEVELS))}")


def parse_step_fn(value) -> Optional[str]:
    if value is not None and (not isinstance(value, str) or not value):
        raise SettingError(f"run(step_fn=...): the name of a tf.function, got {value!r}")
    return value


def parse_on_return(value) -> bool:
    """``run(on_return=...)``: whether a worker exits once ``fn`` returned."""
    if value not in ON_RETURN:
        raise SettingError(f"run(on_return=...): one of {', '.join(map(repr, ON_RETURN))}, "
                           f"got {value!r}")
    return value == "exit"


def parse_progress(value) -> Optional[OnProgress]:
    if value is not None and not callable(value):
        raise SettingError(f"run(progress=...): a callable, got {value!r}")
    return value


def parse_env(value, start_method: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """``run(env=...)``: str names and values, no ``TF_CONFIG``, and nothing
    TensorFlow reads at import that a forked worker could not take."""
    if not value:
        return ()
    if not isinstance(value, dict):
        raise SettingError(f"run(env=...): a dict of str to str, got {value!r}")
    bad = [k for k, v in value.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad or "TF_CONFIG" in value:
        raise SettingError("run(env=...): give str names and str values, and no TF_CONFIG "
                           "(the harness sets it; use faults=[BadTFConfig(...)] to break it)")
    check_import_time_env(value, start_method, "run(env=...)")
    return tuple(value.items())


def _optional(parse: Callable[[Any, str], Any], where: str) -> Callable[[Any], Any]:
    return lambda value: None if value is None else parse(value, where)


# One validator per argument of run() that is checked on its own.
def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise SettingError(f"{name}: True or False, not {value!r}")
    return value


VALIDATORS = {
    "cluster": _optional(parse_cluster, "run(cluster=...)"),
    "timeout": _optional(parse_seconds, "run(timeout=...)"),
    "grace": _optional(parse_grace, "run(grace=...)"),
    "restarts": _optional(parse_restarts, "run(restarts=...)"),
    "restart_policy": _optional(parse_restart_policy, "run(restart_policy=...)"),
    "ledger": parse_ledger,
    "step_fn": parse_step_fn,
    "restart_on": lambda value: parse_restart_on(value, "run(restart_on=...)"),
    "check_replicas": parse_check_replicas,
    "reference": parse_reference,
    "on_return": parse_on_return,
    "progress": parse_progress,
    "end_when_certain": lambda value: _flag(value, "run(end_when_certain=...)"),
    "restart_echoes_together": lambda value: _flag(value, "run(restart_echoes_together=...)"),
    "watch_state": lambda value: _flag(value, "run(watch_state=...)"),
}


def check_coordinated(settings: RunSettings, sync_check: bool, values: dict) -> None:
    """A SettingError for what a parameter-server cluster cannot do: the
    checks that compare MultiWorkerMirroredStrategy's replicas, and
    restarts of one task."""
    shape = settings.shape
    if not shape.chief or not shape.worker or shape.evaluator:
        # parse_cluster refuses these as typed; a RunSettings made by hand too.
        parse_cluster(shape, "cluster")
    asked = [name for name, on in (("check_replicas", values.get("check_replicas") is not None),
                                   ("reference", values.get("reference") is not None),
                                   ("sync_check", sync_check)) if on]
    if asked:
        raise SettingError(f"run({asked[0]}=...): the cluster {shape} has parameter servers, "
                           f"which keep one copy of each variable: there are no replicas to "
                           f"compare")
    if settings.restart_policy == "task":
        raise SettingError(f"run(restart_policy='task'): the cluster {shape} has parameter "
                           f"servers; restarts of the whole cluster (restart_policy='cluster') "
                           f"are run, one task's are not")


def make_request(settings: RunSettings, start_method: Optional[str], fn: Callable,
                 args: Sequence = (), kwargs: Optional[dict] = None, *, faults: Sequence = (),
                 sync_check: bool = False, env: Optional[dict] = None,
                 restart_on=DEFAULT_RESTART_ON, **checked: Any) -> RunRequest:
    """The request of one ``run()`` call on a cluster of ``settings``
    (whose workers start by ``start_method``); ``checked`` holds the
    arguments of :data:`VALIDATORS`."""
    values = {name: VALIDATORS[name](value) for name, value in
              {**checked, "restart_on": restart_on}.items()}
    settings = settings.with_overrides(cluster=values.pop("cluster", None),
                                       timeout=values.pop("timeout", None),
                                       grace=values.pop("grace", None),
                                       restarts=values.pop("restarts", None),
                                       restart_policy=values.pop("restart_policy", None))
    check_restart_on(settings.restart_policy, values["restart_on"])
    if settings.shape.coordinated:
        check_coordinated(settings, bool(sync_check), values)
    plan = plan_module.validate(faults, settings.workers, settings.restarts, settings.shape)
    payload = serialize_call(fn, args, kwargs)
    backend = backend_of(settings)
    backend.check(settings, "backend")
    return RunRequest(
        payload=payload, settings=settings, plan=plan, sync_check=bool(sync_check),
        env=parse_env(env, start_method), ledger=values.get("ledger", "calls"),
        step_fn=values.get("step_fn"), restart_on=values["restart_on"],
        tolerance=values.get("check_replicas"), reference_tolerance=values.get("reference"),
        exit_on_return=values.get("on_return", False), progress=values.get("progress"),
        end_when_certain=values.get("end_when_certain", False),
        restart_echoes_together=values.get("restart_echoes_together", True),
        watch_state=values.get("watch_state", False),
        network=choose_network(settings.network, backend.no_network_namespace, plan))

