"""``trace_objective``: one objective followed from its preset to its gradient on a small fixed batch
(``dfpo objectives NAME --trace``).

The trace runs ``policy_loss`` once under a profiler (``sys.setprofile``) and records every call it makes into
``dfpo.core.loss``, in the order made, with the value each returns. A call is a **stage** when it is

1. a step of ``policy_loss`` itself: ``LossBatch.of``, the ratio shape (``RATIO_SHAPES``), ``aggregate``, or the
   pipeline hook (``Component.token_filter`` / ``token_step`` / ``loss_term``) of a component the spec switches on
   (one of its fields differs from the shared default, which leaves the loss unchanged); or
2. a call inside a stage that returns tensors, to a function whose docstring names the paper equation it implements
   or, failing that, to a public function (no leading underscore) outside the group bookkeeping of ``groups``.

Every other call is **plumbing** (validation, dtype casts, registry look-ups, adapters, group bookkeeping, the
metrics after the loss) and is only counted, as are the hooks of the components the spec leaves at their defaults. Each stage names its function by the ``def`` line (``core/loss/FILE.py:LINE``,
relative to the package) and the equations its docstring cites. The loss the trace prints is the one
``policy_loss`` returned; the gradient is ``d loss / d logp`` after ``loss.backward()``.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
import textwrap
from dataclasses import dataclass
from types import CodeType

import torch
from torch import Tensor

from .advantages import group_advantages
from .aggregation import aggregate
from .batch import LossBatch
from .core import policy_loss
from .objectives import objective_from_label, resolve_objective
from .shapes import RATIO_SHAPES
from .spec import COMPONENTS, SPEC_FIELDS, ObjectiveSpec

LOSS_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(os.path.dirname(LOSS_DIR))
"""``file:line`` is relative to this folder (the repository root, or the installed ``dfpo`` package): ``core/loss/...``."""
EQUATION = re.compile(r"\b[Ee]qs?\.?\s*\(?(\d+[a-z]?(?:\s*(?:-|/|,|and)\s*\d+[a-z]?)*)\)?")
"""An equation reference in a docstring: ``eq 44``, ``Eq (50)``, ``eqs 59-62``, ``eq 47/79``."""

EXAMPLE_REWARDS = (1.0, 0.0, 0.5, 0.0)
"""The example group's rewards (one group of 4 completions)."""
EXAMPLE_MASK = ((1, 1, 1), (1, 1, 0), (1, 1, 1), (1, 0, 0))
"""Real tokens of the example batch (B, T) = (4, 3): lengths 3, 2, 3, 1."""
EXAMPLE_LOG_RATIO = ((0.10, -0.05, 0.30), (-0.30, 0.10, 0.0), (0.0002, -0.0001, 0.0002), (0.40, 0.0, 0.0))
"""log pi_theta - log pi_old at each token of the example batch (B, T): completion 3 inside GSPO's tight sequence range,
the others outside it; one token (0.3) outside PPO's token range."""
EXAMPLE_TOKENS = ((5, 7, 2), (5, 3, 0), (5, 7, 9), (5, 0, 0))
"""Token ids of the example batch (B, T), passed where the spec reads them (the exact-cancellation arm): every completion
opens with token 5, the one position the whole group shares (eq 2); completions 1 and 3 also share token 7 after it,
an event only part of the group holds."""


@dataclass(frozen=True)
class ExampleBatch:
    """The fixed batch a trace runs on: one group of 4 completions, float64 so every digit printed is exact."""

    rewards: Tensor  # (B,)
    advantages: Tensor  # (B,) from the spec's advantage estimator
    logp: Tensor  # (B, T) with the graph
    old_logp: Tensor  # (B, T)
    mask: Tensor  # (B, T) bool
    group_ids: Tensor  # (B,)
    optional: dict[str, Tensor]
    """The optional ``policy_loss`` inputs the spec needs (entropy, ref_logp, rollout_logp, token_ids), nothing else."""

    def loss_inputs(self) -> dict[str, Tensor]:
        """The keyword arguments of ``policy_loss`` (everything but the objective)."""
        return dict(
            logp=self.logp, old_logp=self.old_logp, advantages=self.advantages, mask=self.mask, group_ids=self.group_ids, **self.optional
        )


def example_batch(spec: ObjectiveSpec) -> ExampleBatch:
    """The example batch for ``spec``: fixed rewards, lengths and log-ratios; advantages from the spec's estimator (eq 43
    for ``adv_scale='group'``)."""
    dtype = torch.float64
    mask = torch.tensor(EXAMPLE_MASK, dtype=torch.bool)  # (4, 3)
    group_ids = torch.zeros(4, dtype=torch.long)  # (4,)
    rewards = torch.tensor(EXAMPLE_REWARDS, dtype=dtype)  # (4,)
    advantages = group_advantages(rewards, group_ids, scale=spec.adv_scale, eps=spec.adv_eps, lengths=mask.sum(-1))  # (4,)
    old_logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.7, -1.2, -0.9], [-1.5, -0.3, -0.8], [-0.4, -1.1, -0.6]], dtype=dtype)  # (4, 3)
    logp = (old_logp + torch.tensor(EXAMPLE_LOG_RATIO, dtype=dtype)).requires_grad_()  # (4, 3)
    values = {
        "entropy": torch.full((4, 3), 0.5, dtype=dtype) + 0.1 * torch.arange(3, dtype=dtype),  # (4, 3)
        "ref_logp": old_logp - 0.1,  # (4, 3)
        "rollout_logp": old_logp + 0.02,  # (4, 3)
        "token_ids": torch.tensor(EXAMPLE_TOKENS),  # (4, 3)
    }
    optional = {name: values[name] for name in spec.required_inputs()}
    return ExampleBatch(rewards, advantages, logp, old_logp, mask, group_ids, optional)


@dataclass(frozen=True)
class Stage:
    """One stage of the trace."""

    depth: int
    """0: a step of ``policy_loss``; 1 and more: inside the stage above."""
    function: str
    where: str
    """``core/loss/FILE.py:LINE``, the line of its ``def``."""
    equation: str
    """The equations its docstring cites ('' when none)."""
    values: str
    """What it returned on the example batch, in one line."""


@dataclass(frozen=True)
class Trace:
    """``trace_objective``'s result."""

    spec: ObjectiveSpec
    batch: ExampleBatch
    stages: tuple[Stage, ...]
    loss: Tensor
    """The loss ``policy_loss`` returned (0-d)."""
    grad: Tensor
    """d loss / d logp (B, T), after ``loss.backward()``."""
    calls: int
    """Calls into ``dfpo.core.loss`` during ``policy_loss`` and the backward (the stages and the plumbing)."""
    files: int
    """The files of ``dfpo.core.loss`` those calls are in."""
    plumbing: tuple[str, ...]
    """The functions of the calls that are not stages, each once, in the order first called."""
    idle: tuple[str, ...]
    """The components whose pipeline hooks ran with the spec at their shared defaults (they change nothing)."""


ROOT = -1
"""The profiler's mark of a ``policy_loss`` frame."""


@dataclass
class Call:
    """One call into ``dfpo.core.loss`` made by ``policy_loss``."""

    code: CodeType
    parent: int | None
    """Index of the calling ``Call`` (None: made by ``policy_loss`` itself)."""
    returned: object = None


def _record(spec: ObjectiveSpec, batch: ExampleBatch) -> tuple[list[Call], Tensor]:
    """Run ``policy_loss`` and the backward under a profiler: every call ``policy_loss`` makes into ``dfpo.core.loss``,
    however deep, in the order made, with its caller among them and its return value."""
    calls: list[Call] = []
    stack: list[int | None] = []  # one per open Python frame: its Call index, ROOT for policy_loss, None otherwise
    root, inside = policy_loss.__code__, [0]

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code is root:
                inside[0] += 1
                stack.append(ROOT)
            elif inside[0] and code.co_filename.startswith(LOSS_DIR):
                parent = next((i for i in reversed(stack) if i is not None and i >= 0), None)
                calls.append(Call(code, parent))
                stack.append(len(calls) - 1)
            else:
                stack.append(None)
        elif event == "return" and stack:
            index = stack.pop()
            if index == ROOT:
                inside[0] -= 1
            elif index is not None:
                calls[index].returned = arg

    inputs, before = batch.loss_inputs(), sys.getprofile()
    sys.setprofile(profile)
    try:
        loss, _ = policy_loss(spec, **inputs)
        loss.backward()
    finally:
        sys.setprofile(before)  # a profiler the caller had running (a debugger, a coverage tool) gets its hook back
    return calls, loss


def def_line(code: CodeType) -> int:
    """The line of ``code``'s ``def`` (``co_firstlineno`` is its first decorator's for a decorated function)."""
    line = code.co_firstlineno
    pattern = re.compile(rf"\s*(async\s+)?def\s+{re.escape(code.co_name)}\b")
    for offset in range(50):
        if pattern.match(linecache.getline(code.co_filename, line + offset)):
            return line + offset
    return line


def where(code: CodeType) -> str:
    """``core/loss/FILE.py:LINE`` of ``code``'s ``def``."""
    return f"{os.path.relpath(code.co_filename, PACKAGE_ROOT)}:{def_line(code)}"


def _docstring(code: CodeType) -> str:
    doc = code.co_consts[0] if code.co_consts and isinstance(code.co_consts[0], str) else ""
    return doc or ""


def equations(code: CodeType) -> str:
    """The equation references of ``code``'s docstring, each once, in order ('' when it cites none)."""
    found = [f"eq {m.group(1).replace(' ', '')}" for m in EQUATION.finditer(_docstring(code))]
    return ", ".join(dict.fromkeys(found))


def _hook_owners() -> dict[CodeType, str]:
    """The code of each component's pipeline hook -> the component (``Component.owner``)."""
    owners = {}
    for component in COMPONENTS:
        for hook in (component.logp_step, component.token_filter, component.token_step, component.loss_term):
            if hook is not None and hasattr(hook, "__code__"):
                owners[hook.__code__] = component.owner
    return owners


def switched_on(spec: ObjectiveSpec, owner: str) -> bool:
    """Whether one of ``owner``'s fields differs from the shared default in ``spec`` (a hook of a component at its
    defaults leaves the loss unchanged)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ObjectiveSpec)}
    return any(info.owner == owner and getattr(spec, name) != defaults[name] for name, info in SPEC_FIELDS.items())


def _number(v: float) -> str:
    return f"{v:.4g}"


def describe(value: object, mask: Tensor | None = None) -> str:
    """One line for a stage's return value: tensors with their shape and values (per completion, or per token with
    padding shown as ``.``), a tuple's tensors, a few fields of the loss core's records."""
    if isinstance(value, Tensor):
        v = value.detach()
        if v.ndim == 0:
            return _number(float(v))
        if v.ndim == 1:
            return f"{tuple(v.shape)} [{' '.join(_number(float(e)) for e in v)}]"
        if v.ndim == 2:
            rows = []
            for i, row in enumerate(v):
                real = mask[i] if mask is not None and tuple(mask.shape) == tuple(v.shape) else torch.ones_like(row, dtype=torch.bool)
                shown = bool if v.dtype == torch.bool else _number
                rows.append(" ".join(str(int(e)) if shown is bool else _number(float(e)) if r else "." for e, r in zip(row, real)))
            return f"{tuple(v.shape)} [{' | '.join(rows)}]"
        return f"{tuple(v.shape)}"
    if isinstance(value, LossBatch):
        return f"lengths {describe(value.lengths)}, A {describe(value.adv)}"
    if dataclasses.is_dataclass(value) and hasattr(value, "surrogate"):  # PolicyTerms
        return f"post_clip {describe(value.post_clip)}, weight {describe(value.weight)}"
    if isinstance(value, tuple):
        parts = [describe(e, mask) for e in value if isinstance(e, Tensor)]
        return "; ".join(parts)
    return ""


def _computes(call: Call) -> bool:
    """Rule 2: the call returned tensors, and its function cites an equation or is public outside ``groups``."""
    value = call.returned
    tensors = isinstance(value, Tensor) or (isinstance(value, tuple) and any(isinstance(v, Tensor) for v in value))
    name, file = call.code.co_name, os.path.basename(call.code.co_filename)
    public = not name.startswith(("_", "<")) and file != "groups.py"
    return tensors and (bool(equations(call.code)) or public)


def _stages(spec: ObjectiveSpec, calls: list[Call], mask: Tensor) -> tuple[list[Stage], list[str], list[str]]:
    """The stages (rules 1 and 2 of the module docstring), the plumbing's function names and the components whose
    hooks ran at their defaults."""
    owners = _hook_owners()
    steps = {fn.__code__ for fn in (RATIO_SHAPES[spec.ratio_level], aggregate, LossBatch.of.__func__)}
    shown: dict[int, int] = {}  # call index -> depth, for the calls that are stages
    skipped: set[int] = set()  # hooks of components the spec leaves at their defaults, and what they call
    stages, plumbing, idle = [], [], []
    for i, call in enumerate(calls):
        if call.parent in skipped:
            skipped.add(i)
            continue
        if call.parent is None:
            stage = call.code in steps or (call.code in owners and switched_on(spec, owners[call.code]))
            depth = 0
            if call.code in owners and not stage:
                skipped.add(i)
                idle.append(owners[call.code]) if owners[call.code] not in idle else None
                continue
        else:
            ancestor = call.parent
            while ancestor is not None and ancestor not in shown:
                ancestor = calls[ancestor].parent
            stage = ancestor is not None and _computes(call)
            depth = shown[ancestor] + 1 if ancestor is not None else 0
        if stage:
            shown[i] = depth
            stages.append(Stage(depth, call.code.co_qualname, where(call.code), equations(call.code), describe(call.returned, mask)))
        elif call.code.co_qualname not in plumbing:
            plumbing.append(call.code.co_qualname)
    return stages, plumbing, idle


def trace_objective(objective: str | ObjectiveSpec) -> Trace:
    """Follow ``objective`` (a preset name, a label or a spec) through ``policy_loss`` and its backward on
    ``example_batch``: its stages in the order applied, the loss, the gradient and the plumbing counted."""
    spec = objective_from_label(objective) if isinstance(objective, str) else resolve_objective(objective)
    batch = example_batch(spec)
    calls, loss = _record(spec, batch)
    stages, plumbing, idle = _stages(spec, calls, batch.mask)
    files = {call.code.co_filename for call in calls}
    grad = batch.logp.grad.detach()
    return Trace(spec, batch, tuple(stages), loss.detach(), grad, len(calls), len(files), tuple(plumbing), tuple(idle))


def trace_lines(trace: Trace) -> list[str]:
    """The trace as text: the batch, one line per stage (function, file:line, equation, values), the loss, the gradient
    and the plumbing."""
    spec, b = trace.spec, trace.batch
    out = [
        f"{spec.name}: {spec.description}",
        "",
        f"example batch: one group of 4 completions, float64; lengths {describe(b.mask.sum(-1))}",
        f"  rewards {describe(b.rewards)} -> advantages (adv_scale={spec.adv_scale}) {describe(b.advantages)}",
        f"  log pi - log pi_old per token {describe(b.logp.detach() - b.old_logp, b.mask)}",
        *([f"  token ids {describe(b.optional['token_ids'], b.mask)}"] if "token_ids" in b.optional else []),
        "",
        "stages, in the order policy_loss applies them (indented: inside the stage above):",
    ]
    width = max((2 * s.depth + len(s.function) for s in trace.stages), default=0)
    place = max((len(s.where) for s in trace.stages), default=0)
    for n, s in enumerate(trace.stages, 1):
        name = ("  " * s.depth + s.function).ljust(width)
        out.append(f"{n:>2}. {name}  {s.where.ljust(place)}  {s.equation or '-'}")
        if s.values:
            out.append(f"      -> {s.values}")
    out += [
        "",
        f"loss = {float(trace.loss)!r} (policy_loss's return value, every digit)",
        f"d loss / d logp {describe(trace.grad, b.mask)}",
        "",
    ]
    tail = (
        f"{trace.calls} calls into dfpo.core.loss in {trace.files} files from policy_loss to the gradient: the "
        f"{len(trace.stages)} stages above; the hooks of the components at their defaults ({', '.join(trace.idle) or 'none'}); "
        f"and plumbing: {', '.join(trace.plumbing)}."
    )
    return out + textwrap.wrap(tail, width=110)
