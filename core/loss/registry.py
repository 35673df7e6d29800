"""The objective registry: dfpo's presets, users' own objectives (``register_objective``) and the ``dfpo.objectives``
entry-point group, behind one read-only mapping, ``OBJECTIVES``.

A user's objective built from existing components is one call, as verl's ``register_policy_loss`` and prime-rl's
import-path losses are::

    import dfpo
    dfpo.register_objective("grpo_tm", base="grpo", source="my paper, sec. 3: token-mean GRPO", aggregation="token_mean")

and then it is a preset like any other: ``policy_loss("grpo_tm", ...)``, labels (``grpo_tm:eps_high=0.28``), the toy,
``dfpo train``, the TRL and verl integrations, the cancellation matrix and ``dfpo objectives`` all read this registry.

A package outside dfpo makes its objectives known to every dfpo process (``dfpo train --nproc``, a verl Ray worker)
by naming a callable in the entry-point group ``dfpo.objectives`` of its own ``pyproject.toml``::

    [project.entry-points."dfpo.objectives"]
    my_losses = "my_package.dfpo_objectives:register"

dfpo calls each such callable once, with no arguments, the first time ``OBJECTIVES`` is listed or read (in every
process). A callable that fails is one sentence naming its entry point, its distribution and the error.

A new *choice* of an existing component (a ratio shape, a clip rule, a token mask) is registered the same way, in
that component's module (``register_ratio_shape``, ``register_clip_rule``, ...), before the objective that uses it;
a new component with its own fields is a module of ``dfpo.core.loss`` (docs/loss.md, "Adding to the loss core").
"""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from importlib import metadata
from types import MappingProxyType

from .spec import COMPONENT_FIELDS, ObjectiveSpec

ENTRY_POINT_GROUP = "dfpo.objectives"
"""The entry-point group a package names its registering callables in."""
BUILTIN = "dfpo"
"""The origin of dfpo's own presets."""
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""An objective's name: lower-case letters, digits and underscores (a label splits on ':' and '=', verl registers the
name as a loss_mode, and the explorer shows it as text)."""


class ObjectivePluginError(ValueError):
    """An entry point of ``dfpo.objectives`` could not be loaded or its callable failed (one sentence, no traceback)."""


class ObjectiveRegistry(Mapping):
    """Every objective by name (a read-only mapping name -> ``ObjectiveSpec``): dfpo's presets first, in their order,
    then users' objectives in registration order. The entry points of ``dfpo.objectives`` are loaded before the first
    read."""

    def __init__(self, builtin: Iterable[ObjectiveSpec]):
        self._specs: dict[str, ObjectiveSpec] = {}
        self._origins: dict[str, str] = {}
        for spec in builtin:
            self._add(spec, BUILTIN)
        self.builtin: tuple[str, ...] = tuple(self._specs)
        """The names of dfpo's own presets."""
        self._lock = threading.RLock()
        self._state = "unloaded"  # unloaded -> loading -> loaded (or failed: every read raises the same error)
        self._error: ObjectivePluginError | None = None
        self._loading_origin: str | None = None

    # --- the mapping (each read loads the entry points first)
    def __getitem__(self, name: str) -> ObjectiveSpec:
        self.load_plugins()
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        self.load_plugins()
        return iter(list(self._specs))

    def __len__(self) -> int:
        self.load_plugins()
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._specs

    def origin(self, name: str) -> str:
        """Who registered ``name``: ``dfpo``, ``entry point NAME = VALUE (DIST VERSION)`` or ``register_objective in MODULE``."""
        self.load_plugins()
        return self._origins[name]

    # --- registration
    def _add(self, spec: ObjectiveSpec, origin: str) -> ObjectiveSpec:
        if spec.name in self._specs:
            raise ValueError(
                f"objective {spec.name!r} is already registered (by {self._origins[spec.name]}); register yours under another name"
            )
        self._specs[spec.name] = spec
        self._origins[spec.name] = origin
        return spec

    def add(self, spec: ObjectiveSpec, origin: str) -> ObjectiveSpec:
        """Register ``spec`` under its name (ValueError naming it if the name is taken or malformed)."""
        if not isinstance(spec, ObjectiveSpec):
            raise ValueError(f"an objective must be an ObjectiveSpec, got {type(spec).__name__}")
        check_name(spec.name)
        with self._lock:
            if self._state != "loading":  # outside a plugin's callable: the plugins' names come first
                self.load_plugins()
            return self._add(spec, self._loading_origin or origin)

    def remove(self, name: str) -> None:
        """Take a user's objective out again (a test's clean-up); dfpo's own presets cannot be removed."""
        with self._lock:
            if name in self.builtin:
                raise ValueError(f"objective {name!r} is one of dfpo's presets and cannot be removed")
            if name not in self._specs:
                raise ValueError(f"objective {name!r} is not registered")
            del self._specs[name], self._origins[name]

    def spec_of(self, name: str) -> ObjectiveSpec | None:
        """The spec of ``name`` without loading the entry points (None when not registered): for a registering callable."""
        return self._specs.get(name)

    # --- the entry points
    def load_plugins(self) -> None:
        """Call every ``dfpo.objectives`` entry point once (the first read of the registry does); ObjectivePluginError
        naming the entry point if one fails, on this and every later read."""
        if self._state == "loaded":
            return
        with self._lock:
            if self._state == "loaded" or self._state == "loading":  # loading: a callable reads the registry itself
                return
            if self._state == "failed":
                raise self._error
            self._state = "loading"
            before = dict(self._specs)
            try:
                for ep in entry_points():
                    with self._registering_as(describe_entry_point(ep)):
                        call_entry_point(ep)
            except ObjectivePluginError as err:
                self._specs = {k: v for k, v in self._specs.items() if k in before}  # nothing of a failed load stays
                self._origins = {k: v for k, v in self._origins.items() if k in before}
                self._state, self._error = "failed", err
                raise
            self._state = "loaded"

    @contextmanager
    def _registering_as(self, origin: str):
        self._loading_origin = origin
        try:
            yield
        finally:
            self._loading_origin = None


def check_name(name: object) -> str:
    """ValueError unless ``name`` is an objective name (``NAME_PATTERN``)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(
            f"an objective name must be lower-case letters, digits and underscores, starting with a letter (at most 64), got {name!r}"
        )
    return name


def entry_points() -> list[metadata.EntryPoint]:
    """The ``dfpo.objectives`` entry points installed here, each once, in a stable order (by name, then value)."""
    seen, out = set(), []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            out.append(ep)
    return out


def describe_entry_point(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f" ({dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value}{where}"


def call_entry_point(ep: metadata.EntryPoint) -> None:
    """Load ``ep`` and call what it names with no arguments; ObjectivePluginError naming it on any failure."""
    what = describe_entry_point(ep)
    try:
        target = ep.load()
    except Exception as err:  # noqa: BLE001 - any import failure of a user's package is reported as one sentence
        raise ObjectivePluginError(
            f"dfpo.objectives {what} could not be imported ({type(err).__name__}: {err}); fix or uninstall that package"
        ) from None
    if not callable(target):
        raise ObjectivePluginError(f"dfpo.objectives {what} names a {type(target).__name__}, not a callable; point it at a function")
    try:
        target()
    except Exception as err:  # noqa: BLE001
        raise ObjectivePluginError(f"dfpo.objectives {what} failed: {type(err).__name__}: {err}") from None


def caller_module(depth: int = 2) -> str:
    """The module that called the public function ``depth`` frames up (for an objective's origin)."""
    frame = sys._getframe(depth)
    return frame.f_globals.get("__name__", "?")


def make_objective(
    registry: ObjectiveRegistry,
    name: str,
    base: str | ObjectiveSpec,
    source: str | Mapping[str, str],
    description: str | None,
    components: Mapping[str, object],
) -> ObjectiveSpec:
    """The spec of a new objective: ``base`` with ``components`` changed, each change citing ``source``."""
    check_name(name)
    if isinstance(base, ObjectiveSpec):
        base_spec = base
    else:
        base_spec = registry.spec_of(base) if isinstance(base, str) else None
        if base_spec is None:
            raise ValueError(f"base={base!r} is not a registered objective; known: {', '.join(registry._specs)}")
    unknown = sorted(set(components) - set(COMPONENT_FIELDS))
    if unknown:
        raise ValueError(f"unknown component(s) {unknown} for objective {name!r}; known: {', '.join(COMPONENT_FIELDS)}")
    if isinstance(source, str):
        if not source.strip():
            raise ValueError(f"objective {name!r} needs a source: where its components come from (a paper, a peer's file), got {source!r}")
        sources = dict.fromkeys(components, source.strip())
    elif isinstance(source, Mapping):
        missing = sorted(set(components) - set(source))
        extra = sorted(set(source) - set(components))
        if missing or extra:
            raise ValueError(f"objective {name!r}: source must cite each changed component once, missing {missing}, not changed {extra}")
        sources = {}
        for key, text in source.items():
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"objective {name!r}: the source of {key!r} must be a non-empty text, got {text!r}")
            sources[key] = text.strip()
    else:
        raise ValueError(f"objective {name!r}: source must be a text or a mapping component -> text, got {type(source).__name__}")
    if description is None:
        changes = ", ".join(f"{k}={v!r}" for k, v in components.items())
        description = f"{base_spec.name} with {changes}" if changes else f"{base_spec.name} under another name"
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"objective {name!r}: description must be a non-empty text, got {description!r}")
    try:
        return dataclasses.replace(
            base_spec, name=name, description=description.strip(), sources=MappingProxyType({**base_spec.sources, **sources}), **components
        )
    except ValueError as err:  # the component's own check, named for this objective
        raise ValueError(f"objective {name!r}: {err}") from None
