"""What each field of ``ObjectiveSpec`` is, and what each component of an objective says about a spec.

Every field carries a :class:`FieldInfo`: the component that owns it, the kind of value and its bounds or
choices, where the shared default comes from, when the loss core reads it (``active_when``), whether a
matched control must hold it equal (``trust_region``) and what it means (``doc``). ``validate_spec``'s value
checks, ``COMMON_SOURCES``, ``TRUST_REGION_FIELDS``, ``unmatched_components`` and the component docs of
``dfpo objectives`` are all derived from it, so a new field is one declaration.

Each component (a clip rule, the token mask, the KL term, ...) is one module of ``dfpo.core.loss`` that
declares its fields (``spec_field``) next to the code that reads them, and one :class:`Component` record: the
rules that tie its fields to others, the optional ``policy_loss`` inputs it needs, why it couples a batch, and
its step of the loss pipeline. ``ObjectiveSpec`` lists the fields; ``validate_spec``,
``ObjectiveSpec.required_inputs``, ``ObjectiveSpec.batch_coupling`` and ``policy_loss`` loop over the
components, so no setting is read outside its component's module.

``Bounds`` and the bounds and choice checks are those of ``dfpo.core.settings``, the one mechanism of every
config (the trainer's, the toy's, and these objective overrides); ``FieldInfo`` adds what only an objective
component has (owner, source, trust region, when it is read).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..settings import Bounds, check_bounds, check_choice

META_KEY = "dfpo"
"""The key of a field's ``FieldInfo`` in ``dataclasses.Field.metadata``."""

OWNERS = (
    "preset",  # name, description, sources: bookkeeping, not a component of the loss
    "cancel",  # reads the log-probs before the ratio: their gradient stopped at whole-group shared tokens
    "ratio",
    "clip",
    "transform",
    "token_mask",
    "preference",
    "cov_control",
    "proximal",
    "aggregation",
    "kl",
    "old_kl",
    "correction",
    "entropy",
    "imitation",
    "entropy_control",
    "advantage",
)
"""The components a field can belong to, in the order the loss core applies them."""

KINDS = ("label", "choice", "number", "optional_number", "bool", "count")
"""label: free text (not validated); choice: a key of a registry; number: a finite float in ``bounds``;
optional_number: None or a number in ``bounds``; bool; count: a positive int or None."""


@dataclass(frozen=True)
class When:
    """A condition on one choice field of a spec: ``field`` is one of ``values`` (``negate``: none of them)."""

    field: str
    values: Collection[str]
    """The values (a tuple, or a live view of a registry, e.g. the clip modes whose rule reads a field)."""
    negate: bool = False

    def holds(self, spec: object) -> bool:
        return (getattr(spec, self.field) in self.values) != self.negate

    def describe(self) -> str:
        values = list(self.values)
        if len(values) == 1:
            return f"{self.field} {'!=' if self.negate else '='} {values[0]}"
        return f"{self.field} {'not in' if self.negate else 'in'} {{{', '.join(values)}}}"


@dataclass(frozen=True)
class FieldInfo:
    """Everything the project states about one spec field."""

    owner: str
    """The component that reads the field (one of ``OWNERS``)."""
    kind: str
    """How its value is checked (one of ``KINDS``)."""
    source: str
    """Where the shared default comes from (a preset that changes it cites its own in ``sources``)."""
    trust_region: bool
    """True: part of what a matched control must hold equal (the trust region, the normaliser, the masks, the
    penalties). False: the mechanism under comparison (the DFPO transform and its parameters) or bookkeeping."""
    choices: Collection[str] | None = None
    """kind choice: the registry whose keys are the allowed values (read at validation, so later registrations count)."""
    bounds: Bounds | None = None
    """kind number / optional_number: the interval the value must lie in."""
    bounds_when: tuple[tuple[When, Bounds | None], ...] = ()
    """Bounds that replace ``bounds`` under a condition (first match wins; None: not checked there)."""
    active_when: When | None = None
    """When the loss core reads the field; None: always. An inactive field cannot make two specs unmatched."""
    doc: str = ""
    """What the field means, in a line or two (shown by ``dfpo objectives`` and docs/loss.md)."""

    def __post_init__(self) -> None:
        if self.owner not in OWNERS:
            raise ValueError(f"owner must be one of {OWNERS}, got owner={self.owner!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got kind={self.kind!r}")
        if self.kind == "choice" and self.choices is None:
            raise ValueError("a choice field needs its registry in choices")
        if self.kind in ("number", "optional_number") and self.bounds is None:
            raise ValueError(f"a {self.kind} field needs bounds")
        if not self.source.strip():
            raise ValueError("a field needs the source of its shared default")
        if self.owner != "preset" and not self.doc.strip():
            raise ValueError("a component field needs a doc saying what it does")

    def bounds_for(self, spec: object) -> Bounds | None:
        """The bounds that apply to ``spec`` (a ``bounds_when`` match, else ``bounds``)."""
        for condition, bounds in self.bounds_when:
            if condition.holds(spec):
                return bounds
        return self.bounds


UNIT = Bounds(0.0, 1.0)
UNIT_OPEN = Bounds(0.0, 1.0, low_open=True)
NONNEG = Bounds(0.0, math.inf)
POSITIVE = Bounds(0.0, math.inf, low_open=True)


def spec_field(default: object, info: FieldInfo, **kwargs: object) -> dataclasses.Field:
    """``dataclasses.field`` with ``info`` as its metadata."""
    return dataclasses.field(default=default, metadata={META_KEY: info}, **kwargs)


def component_field(default: object, owner: str, kind: str, source: str, *, trust_region: bool, **more: object) -> dataclasses.Field:
    """The declaration of one component field of ``ObjectiveSpec``, made in its component's module: its default and
    its ``FieldInfo``. The flags are keywords (``trust_region=True`` says what it is at every declaration; ``more``:
    choices, bounds, bounds_when, active_when, doc)."""
    return spec_field(default, FieldInfo(owner=owner, kind=kind, source=source, trust_region=trust_region, **more))


def field_info(cls_or_spec: object, name: str) -> FieldInfo:
    """The ``FieldInfo`` of field ``name``; ValueError naming the field if it has none."""
    for f in dataclasses.fields(cls_or_spec):
        if f.name == name:
            if META_KEY not in f.metadata:
                raise ValueError(f"field {name!r} has no FieldInfo metadata")
            return f.metadata[META_KEY]
    raise ValueError(f"unknown field {name!r}")


def field_infos(cls_or_spec: object) -> dict[str, FieldInfo]:
    """Every field's ``FieldInfo``, in declaration order (fields without one are left out)."""
    return {f.name: f.metadata[META_KEY] for f in dataclasses.fields(cls_or_spec) if META_KEY in f.metadata}


def check_number(name: str, value: object, bounds: Bounds, spec: object) -> None:
    """ValueError naming ``name`` and ``value`` unless ``value`` is a finite number within ``bounds`` (an end that
    names a field is read from ``spec``): ``dfpo.core.settings.check_bounds``, the one bounds check."""
    check_bounds(name, value, bounds, spec)


def check_value(name: str, info: FieldInfo, spec: object) -> None:
    """Check one field of ``spec`` against its declaration; ValueError naming the field and value."""
    value = getattr(spec, name)
    if info.kind == "choice":
        check_choice(name, value, tuple(info.choices))
    elif info.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {name}={value!r}")
    elif info.kind == "count":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {name}={value!r}")
    elif info.kind in ("number", "optional_number"):
        bounds = info.bounds_for(spec)
        if bounds is not None and not (info.kind == "optional_number" and value is None):
            check_number(name, value, bounds, spec)


@dataclass(frozen=True)
class Component:
    """What one component of an objective says about a spec, beside the fields it owns (``FieldInfo.owner``).

    Each hook takes the spec (and, for the pipeline steps, the loss's context); a component that has nothing to
    say for a hook leaves it None. The loss pipeline drops every ``token_filter``'s tokens, runs every ``token_step``
    in component order on the per-token loss (B, T), aggregates it, then adds every ``loss_term``; before all of
    them, every ``logp_step`` on the log-probs.
    """

    owner: str
    """The component (one of ``OWNERS``)."""
    validate: Callable[[object], None] | None = None
    """Raise ValueError naming the fields when this component's settings contradict another component's."""
    required_inputs: Callable[[object], dict[str, str]] | None = None
    """The optional ``policy_loss`` arguments this component needs for a spec, each with the setting that needs it."""
    batch_coupling: Callable[[object], list[str]] | None = None
    """Why this component makes a batch's loss differ from the weighted sum of its micro-batches' losses ([]: it does not)."""
    logp_step: Callable[..., tuple[object, dict[str, object]]] | None = None
    """(spec, logp (B, T), events ``TokenEvents``) -> (logp (B, T), metrics): the log-probs every later step reads, before
    the ratio shape; the same values, with the gradient stopped at some positions (the exact-cancellation arm)."""
    token_filter: Callable[..., tuple[object | None, bool, dict[str, object]]] | None = None
    """(spec, context) -> (dropped (B, T) bool or None, renormalise, metrics): real tokens taken out of the policy gradient
    (and, with renormalise, out of the aggregation's count) before any ``token_step``; the context's ``kept`` and
    ``agg_mask`` are not set yet."""
    token_step: Callable[..., tuple[object, dict[str, object]]] | None = None
    """(spec, context, per_token (B, T)) -> (per_token (B, T), metrics): a change to the per-token loss before aggregation."""
    loss_term: Callable[..., tuple[object | None, dict[str, object]]] | None = None
    """(spec, context) -> (term or None, metrics): a scalar added to the aggregated loss (None: nothing to add)."""
    completion_advantage: Callable[[object], str | None] | None = None
    """Why this component reads one advantage per completion for a spec, so that per-token advantages (B, T) cannot
    reach it (None: it reads them token by token)."""

    def __post_init__(self) -> None:
        if self.owner not in OWNERS:
            raise ValueError(f"owner must be one of {OWNERS}, got owner={self.owner!r}")
