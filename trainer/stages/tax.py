"""The learning tax on the LLM (paper Prop. 3.1): how far the policy drifts on tokens the reward never scores.

``eval/tax_kl`` = KL(pi_init || pi_now) of the next-token distribution at the eval prompts' own positions, averaged
over positions: at every prompt position j = 0 .. P - 2 the distribution that predicts prompt token j + 1 (the chat
template, the system turn, the question: tokens the policy never generates and the reward never scores; the last
position, which predicts the first completion token, is left out). pi_init is the policy at step 0 (after any warm
start), scored once at the step-0 evaluation and kept in memory and in the run folder (``TAX_REFERENCE``), so a
resumed run measures against the same pi_init.

Memory: pi_init is kept as its top ``TOP_K`` log-probs and their token ids per position plus the log of the mass
outside them (8 bytes x TOP_K + 4 per position; 2 KB at TOP_K = 256, so 64 prompts x 44 positions hold 5.8 MB where
the whole distributions of a 49k vocabulary would hold 550 MB). The figure is therefore the KL between the two
distributions coarsened to pi_init's top-k tokens and one bin for the rest:

    sum_{v in top-k} p0(v) log(p0(v) / p(v)) + p0(rest) log(p0(rest) / p(rest))

which is at most the full KL (the log-sum inequality) and equal to it when the vocabulary has at most TOP_K tokens
(the tiny model) or pi_now moves no mass within the rest. It is exactly 0 at step 0 (the same forward pass).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ...core.files import WriteFailed, describe_write_error, write_atomic
from ..run.layout import RunDir

TAX_REFERENCE = RunDir.TAX_REFERENCE
"""The run folder's file holding pi_init at the eval prompts' positions (a dict of tensors, read with weights_only);
its name is spelt in ``run.layout``, where ``run.folder`` reads it too."""
TOP_K = 256
"""pi_init's tokens kept exactly per position; the rest is one bin."""
BATCH_PROMPTS = 16
"""Eval prompts per forward pass."""


@dataclass(frozen=True)
class TaxReference:
    """pi_init at every prompt position of the eval prompts, coarsened to its top-k tokens and the rest."""

    top_ids: Tensor
    """(N, k) long: pi_init's k most likely tokens at each of the N positions (all prompts, in order)."""
    top_logp: Tensor
    """(N, k) float32: their log-probabilities."""
    rest_logp: Tensor
    """(N,) float32: log of pi_init's mass outside them (-inf where k covers the vocabulary)."""
    prompts_sha256: str
    """The eval prompts' token ids it was scored on (a resumed run checks it scores the same ones)."""


def prompts_digest(prompt_ids: list[list[int]]) -> str:
    """SHA-256 of the eval prompts' token ids."""
    return hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()


@torch.no_grad()
def prompt_logp(model, prompt_ids: list[list[int]], device, batch_prompts: int = BATCH_PROMPTS):
    """log pi(. | prompt[:j+1]) at every prompt position j = 0 .. P - 2 of every prompt, in order: yields (n, V) float32
    blocks, one per batch of prompts (n = their positions). Right padding, positions counted from each prompt's start."""
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(prompt_ids), batch_prompts):
            part = [p for p in prompt_ids[s : s + batch_prompts]]
            width = max(len(p) for p in part)
            ids = torch.zeros(len(part), width, dtype=torch.long)
            att = torch.zeros(len(part), width, dtype=torch.long)
            for i, p in enumerate(part):
                ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
                att[i, : len(p)] = 1
            position_ids = (att.cumsum(-1) - 1).clamp(min=0)  # (n, P)
            logits = model(
                input_ids=ids.to(device), attention_mask=att.to(device), position_ids=position_ids.to(device), use_cache=False
            ).logits
            keep = att.clone()  # (n, P) the positions predicting a prompt token: every real one but the last
            keep[torch.arange(len(part)), att.sum(-1) - 1] = 0
            yield torch.log_softmax(logits.float()[keep.bool().to(logits.device)], dim=-1)  # (positions, V)
    finally:
        model.train(was_training)


def rest_logp(logp: Tensor, top_ids: Tensor) -> Tensor:
    """(N,) log of the mass of ``logp`` (N, V) outside the tokens ``top_ids`` (N, k); -inf where they cover all of V."""
    return logp.scatter(-1, top_ids, -math.inf).logsumexp(-1)


def build_reference(model, prompt_ids: list[list[int]], device, k: int = TOP_K) -> TaxReference:
    """pi_init's top-k log-probs and rest mass at every prompt position of ``prompt_ids``."""
    ids, lps, rests = [], [], []
    for logp in prompt_logp(model, prompt_ids, device):
        top_logp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (n, k) each
        ids.append(top_ids.cpu())
        lps.append(top_logp.cpu())
        rests.append(rest_logp(logp, top_ids).cpu())
    return TaxReference(torch.cat(ids), torch.cat(lps), torch.cat(rests), prompts_digest(prompt_ids))


def coarse_kl(ref_top_logp: Tensor, ref_rest: Tensor, top_ids: Tensor, logp: Tensor) -> Tensor:
    """(N,) KL(pi_init || pi) between the two coarsened to pi_init's top-k tokens and one bin for the rest (module
    docstring); ref_top_logp (N, k), ref_rest (N,), top_ids (N, k), logp (N, V) pi's log-probs."""
    now_top = logp.gather(-1, top_ids)  # (N, k)
    now_rest = rest_logp(logp, top_ids)  # (N,)
    top = (ref_top_logp.exp() * (ref_top_logp - now_top)).sum(-1)  # (N,)
    rest = torch.where(torch.isinf(ref_rest), torch.zeros_like(ref_rest), ref_rest.exp() * (ref_rest - now_rest))  # (N,)
    return top + rest


def tax_kl(model, prompt_ids: list[list[int]], ref: TaxReference, device) -> float:
    """``eval/tax_kl``: the mean over every prompt position of ``coarse_kl`` between ``ref`` and ``model`` now."""
    total, n = 0.0, 0
    for logp in prompt_logp(model, prompt_ids, device):
        rows = slice(n, n + logp.shape[0])
        kl = coarse_kl(ref.top_logp[rows].to(logp.device), ref.rest_logp[rows].to(logp.device), ref.top_ids[rows].to(logp.device), logp)
        total += float(kl.double().sum())
        n += logp.shape[0]
    return total / n if n else math.nan


def save_reference(ref: TaxReference, path: Path) -> None:
    """Write ``ref`` to ``path`` atomically (``core.files.write_atomic``: a temporary ``.NAME.*.tmp`` beside it,
    renamed over it); a full disk or a permission error is ``WriteFailed`` naming the file."""
    path = Path(path)
    data = {"top_ids": ref.top_ids, "top_logp": ref.top_logp, "rest_logp": ref.rest_logp, "prompts_sha256": ref.prompts_sha256}
    try:
        write_atomic(path, lambda fh: torch.save(data, fh))
    except OSError as err:
        raise WriteFailed(f"writing {describe_write_error(path, err)}; eval/tax_kl needs it to go on after a resume") from None


def load_reference(path: Path) -> TaxReference | str:
    """The reference stored at ``path``, or one sentence saying why it cannot be used (read with ``weights_only``: data
    never runs as code)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        ref = TaxReference(data["top_ids"], data["top_logp"], data["rest_logp"], str(data["prompts_sha256"]))
    except FileNotFoundError:
        return f"{path} is missing (the run began before eval/tax_kl was logged, or the file was removed)"
    except Exception as err:  # a damaged or foreign file: the metric is left out, the run goes on
        return f"{path} cannot be read as a tax reference ({type(err).__name__}: {err})"
    n, k = ref.top_ids.shape if ref.top_ids.dim() == 2 else (-1, -1)
    if ref.top_logp.shape != (n, k) or ref.rest_logp.shape != (n,):
        return f"{path} holds tensors of inconsistent shapes"
    return ref


class TaxMeter:
    """``eval/tax_kl`` of a run: the reference is built at the step-0 evaluation and saved to the run folder, or, when
    the run resumes, read from there; without one (a run started before this metric) the key is left out."""

    def __init__(self, model, prompt_ids: list[list[int]], path: Path, device, *, writes: bool):
        self.model, self.prompt_ids, self.path, self.device, self.writes = model, prompt_ids, Path(path), device, writes
        self.ref: TaxReference | None = None
        self.unavailable: str | None = None
        """Why the key is not logged (one sentence), once the reference was looked for and not found."""

    def measure(self, step: int) -> dict:
        """{'eval/tax_kl': value} at ``step``, or {} without a reference."""
        if not self.prompt_ids:
            return {}
        if step == 0:  # the policy at step 0 is pi_init (a run resumed from its step-0 checkpoint gives the same one)
            self.ref, self.unavailable = build_reference(self.model, self.prompt_ids, self.device), None
            if self.writes:
                save_reference(self.ref, self.path)
        elif self.ref is None and self.unavailable is None:
            found = load_reference(self.path)
            if isinstance(found, str):
                self.unavailable = f"eval/tax_kl is not logged: {found}"
            elif found.prompts_sha256 != prompts_digest(self.prompt_ids):
                self.unavailable = f"eval/tax_kl is not logged: {self.path} was scored on other eval prompts than this run's"
            else:
                self.ref = found
        if self.ref is None:
            return {}
        return {"eval/tax_kl": tax_kl(self.model, self.prompt_ids, self.ref, self.device)}
