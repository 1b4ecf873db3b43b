"""Building workflows: steps, chains and groups, and the body of ``POST /v1/flows``.

A flow is a list of named steps; each runs a job (or waits for a signal) once the steps it
comes ``after`` have finished, and its handler receives their results in ``job.parents``::

    from conveyor_client import chain, group, step, wait_step

    steps = chain([
        step("fetch", "fetch_page", {"url": url}),
        group([step("thumbs", "make_thumbnails"), step("text", "extract_text")]),
        wait_step("review", "approved", timeout=3600),
        step("publish", "publish_page"),
    ])
    client.create_flow(steps, name="publish")

``chain`` runs its items one after another, ``group`` side by side; ``group([...]).then(x)``
runs ``x`` once every member of the group has finished. A nested list in ``chain`` or
``group`` is a group. Steps are plain dicts in the wire format (``{"name", "job", "after",
...}``), so hand-written ones mix with built ones.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from . import _wire
from .models import NewJob

__all__ = ["Steps", "StepLike", "chain", "group", "step", "wait_step", "flow_body"]

StepLike = Union[Mapping[str, Any], "Steps", Sequence[Any]]
JobSpec = Union[str, Mapping[str, Any], NewJob, Any]


def step(
    name: str,
    kind: str,
    payload: Any = None,
    *,
    after: Optional[Iterable[str]] = None,
    on_parent_failure: Optional[str] = None,
    compensate: Optional[JobSpec] = None,
    **options: Any,
) -> Dict[str, Any]:
    """A job step: its job is ``kind`` with ``payload`` and ``enqueue``'s keyword options
    (``queue``, ``priority``, ``delay``, ``max_attempts``, ``timeout``, ``tags``, ...; a step's
    job takes no ``idempotency_key`` or ``unique``: give the flow an ``idempotency_key``).

    ``after`` names the steps it waits for (``chain`` and ``group(...).then`` fill it in);
    ``on_parent_failure`` is ``"fail"`` (default: the flow fails), ``"skip"`` (skip this step
    and its dependents) or ``"continue"`` (run anyway); ``compensate`` is the job to run if the
    flow compensates after this step completed (a kind, a dict as ``enqueue_many`` takes, or a
    ``NewJob``)."""
    if not isinstance(name, str) or not name:
        raise ValueError("a step's name must be a non-empty string")
    job = _wire.job_spec_body({"kind": kind, "payload": payload, **options}, 0, where=f"step {name!r}")
    body: Dict[str, Any] = {"name": name, "job": job}
    if after is not None:
        body["after"] = _names(after, name)
    if on_parent_failure is not None:
        body["on_parent_failure"] = on_parent_failure
    if compensate is not None:
        body["compensate"] = _compensation(compensate, f"step {name!r} compensate")
    return body


def wait_step(
    name: str,
    signal: str,
    *,
    timeout: Optional[_wire.Seconds] = None,
    after: Optional[Iterable[str]] = None,
) -> Dict[str, Any]:
    """A durable wait: the step completes when ``client.signal(flow_id, signal, payload)``
    delivers ``signal`` (its result is the payload), or fails once ``timeout`` (seconds or a
    timedelta) has passed since it began waiting."""
    if not isinstance(name, str) or not name:
        raise ValueError("a step's name must be a non-empty string")
    wait: Dict[str, Any] = {"signal": signal}
    if timeout is not None:
        wait["timeout_ms"] = max(1, _wire.milliseconds(timeout, "timeout"))
    body: Dict[str, Any] = {"name": name, "wait": wait}
    if after is not None:
        body["after"] = _names(after, name)
    return body


class Steps:
    """Steps with the dependencies ``chain`` and ``group`` gave them. ``heads`` are the steps
    that start it (nothing inside comes before them), ``tails`` those that end it (nothing
    inside comes after them). Iterating yields the steps (copies); ``create_flow`` takes it."""

    __slots__ = ("_steps", "heads", "tails")

    def __init__(self, steps: List[Dict[str, Any]], heads: List[str], tails: List[str]) -> None:
        self._steps = steps
        self.heads = heads
        self.tails = tails

    @property
    def steps(self) -> List[Dict[str, Any]]:
        """The steps, as ``POST /v1/flows`` takes them."""
        return [dict(s) for s in self._steps]

    def then(self, next_steps: StepLike) -> "Steps":
        """These steps, then ``next_steps`` (a step, ``Steps``, or a list: a group) once every
        one of the tails has finished."""
        return chain([self, next_steps])

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self._steps)

    def __repr__(self) -> str:
        return f"Steps({[s.get('name') for s in self._steps]!r}, heads={self.heads!r}, tails={self.tails!r})"


def chain(items: Iterable[StepLike]) -> Steps:
    """Runs ``items`` one after another: each starts once the one before has finished (all of
    it, for a group)."""
    steps: List[Dict[str, Any]] = []
    heads: Optional[List[str]] = None
    tails: List[str] = []
    for item in _items(items, "chain"):
        part = _fragment(item)
        if heads is None:
            heads = list(part.heads)
            steps.extend(part._steps)
        else:
            first = set(part.heads)
            steps.extend(_with_after(s, tails) if s["name"] in first else s for s in part._steps)
        tails = list(part.tails)
    if heads is None:
        raise ValueError("chain() needs at least one step")
    return Steps(steps, heads, tails)


def group(items: Iterable[StepLike]) -> Steps:
    """Runs ``items`` side by side; ``group([...]).then(x)`` runs ``x`` once all have
    finished."""
    steps: List[Dict[str, Any]] = []
    heads: List[str] = []
    tails: List[str] = []
    for item in _items(items, "group"):
        part = _fragment(item)
        steps.extend(part._steps)
        heads.extend(part.heads)
        tails.extend(part.tails)
    if not steps:
        raise ValueError("group() needs at least one step")
    return Steps(steps, heads, tails)


def flow_body(
    flow: Any,
    *,
    name: Optional[str] = None,
    on_failure: Optional[str] = None,
    idempotency_key: Optional[str] = None,
    tags: Optional[Iterable[str]] = None,
) -> Dict[str, Any]:
    """The JSON of ``POST /v1/flows`` from ``flow``: a list of steps (dicts in the wire format,
    or built with ``step``/``wait_step``), a ``Steps`` from ``chain``/``group``, or a whole body
    (a dict with ``steps``). Steps' jobs may use ``enqueue``'s keyword names (``delay``,
    ``timeout``); a wait's ``timeout`` is in seconds. The keywords set the flow's fields."""
    body: Dict[str, Any]
    if isinstance(flow, Steps):
        body, raw_steps = {}, flow.steps
    elif isinstance(flow, Mapping):
        if "steps" not in flow:
            raise TypeError("create_flow takes a list of steps, chain()/group(), or a body with 'steps'")
        body = dict(flow)
        raw_steps = body.pop("steps")
    elif isinstance(flow, (str, bytes)):
        raise TypeError("create_flow takes a list of steps, chain()/group(), or a body with 'steps'")
    else:
        body, raw_steps = {}, flow
    if isinstance(raw_steps, Steps):
        raw_steps = raw_steps.steps
    flat: List[Any] = []
    for item in raw_steps:
        if isinstance(item, Steps):
            flat.extend(item.steps)
        else:
            flat.append(item)
    body["steps"] = [_step_body(s, i) for i, s in enumerate(flat)]
    if name is not None:
        body["name"] = name
    if on_failure is not None:
        body["on_failure"] = on_failure
    if idempotency_key is not None:
        body["idempotency_key"] = idempotency_key
    if tags is not None:
        body["tags"] = list(tags)
    return body


# --- Internals -----------------------------------------------------------------------------


def _names(after: Iterable[str], name: str) -> List[str]:
    if isinstance(after, str):
        raise TypeError(f"step {name!r}: after takes a list of step names, not a string")
    return list(after)


def _compensation(spec: JobSpec, where: str) -> Dict[str, Any]:
    if isinstance(spec, str):
        return {"kind": spec}
    return _wire.job_spec_body(spec, 0, where=where)


def _items(items: Iterable[StepLike], what: str) -> List[StepLike]:
    if isinstance(items, (Mapping, Steps, str, bytes)):
        raise TypeError(f"{what}() takes a list of steps: {what}([a, b, ...])")
    return list(items)


def _fragment(item: StepLike) -> Steps:
    if isinstance(item, Steps):
        return item
    if isinstance(item, Mapping):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a step needs a 'name': {dict(item)!r}")
        return Steps([dict(item)], [name], [name])
    if isinstance(item, (list, tuple)):
        return group(item)
    raise TypeError(f"expected a step (dict), chain()/group() or a list, got {type(item).__name__}")


def _with_after(step_body: Dict[str, Any], names: List[str]) -> Dict[str, Any]:
    after = list(step_body.get("after") or [])
    after.extend(n for n in names if n not in after)
    return {**step_body, "after": after}


def _step_body(spec: Any, index: int) -> Dict[str, Any]:
    where = f"steps[{index}]"
    if not isinstance(spec, Mapping):
        raise TypeError(f"{where}: expected a step (dict), got {type(spec).__name__}")
    body = dict(spec)
    if "name" not in body:
        raise ValueError(f"{where}: missing 'name'")
    job = body.get("job")
    if job is not None:
        body["job"] = _wire.job_spec_body(job, index, where=f"{where}.job")
    compensate = body.get("compensate")
    if compensate is not None:
        body["compensate"] = _compensation(compensate, f"{where}.compensate")
    wait = body.get("wait")
    if isinstance(wait, Mapping):
        wait = dict(wait)
        timeout = wait.pop("timeout", None)
        if timeout is not None:
            wait["timeout_ms"] = max(1, _wire.milliseconds(timeout, f"{where}.wait.timeout"))
        body["wait"] = wait
    after = body.get("after")
    if after is not None:
        body["after"] = _names(after, str(body["name"]))
    return body
