"""The learning tax on the LLM (paper Prop. 3.1): how far the policy drifts at contexts the reward never tells apart.

Two figures, each KL(pi_init || pi_now) of the next-token distribution averaged over a set of teacher-forced
positions of the eval problems:

- ``eval/template_kl``, the tax where the paper puts it (tasks with an answer template, ``tasks.TEMPLATE_TASKS``):
  at the positions of the template every correct answer starts with, Prop. 3.1's shared contexts. Each eval prompt
  is followed by its template ("12 + 7 + 30 = ", ``tasks.answer_template``, tokenized as inside the full answer:
  ``template_ids``) and the distributions that predict the template's tokens are compared: the positions P - 1 ..
  P + T - 2 of prompt + template. These are contexts the policy generates and the gradient reaches, but whose
  tokens every completion of a group shares, so a group-relative objective that cancels there leaves them be.
- ``eval/tax_kl``, a proxy: at the eval prompts' own positions, j = 0 .. P - 2, the distribution that predicts
  prompt token j + 1 (the chat template, the system turn, the question; the last position, which predicts the
  first completion token, is left out). These positions never get a gradient: what moves them is only what the
  updates elsewhere drag along through shared parameters. The key is kept for the data stored under it.

pi_init is the policy at step 0 (after any warm start), scored once at the step-0 evaluation and kept in memory and
in the run folder (``TAX_REFERENCE``, both sets of positions in one file), so a resumed run measures against the
same pi_init.

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


@dataclass(frozen=True)
class Positions:
    """Where a KL is measured: token sequences and, in each, the span of positions whose next-token distribution
    counts (``spans[i] = (start, stop)``: positions start .. stop - 1 of ``sequences[i]``)."""

    sequences: list[list[int]]
    spans: list[tuple[int, int]]
    digest: str
    """What a stored reference must have been scored on (a resumed run checks it)."""


def prompt_positions(prompt_ids: list[list[int]]) -> Positions:
    """``eval/tax_kl``'s positions: every prompt position but the last (0 .. P - 2, each predicting the next prompt token)."""
    return Positions(prompt_ids, [(0, len(p) - 1) for p in prompt_ids], prompts_digest(prompt_ids))


def template_positions(prompt_ids: list[list[int]], template_ids: list[list[int]]) -> Positions:
    """``eval/template_kl``'s positions: prompt + template, and the positions P - 1 .. P + T - 2 that predict the
    template's T tokens (teacher-forced: the template is fed, not sampled)."""
    sequences = [p + t for p, t in zip(prompt_ids, template_ids)]
    spans = [(len(p) - 1, len(p) + len(t) - 1) for p, t in zip(prompt_ids, template_ids)]
    return Positions(sequences, spans, hashlib.sha256(json.dumps([sequences, spans]).encode()).hexdigest())


def template_ids(tok, prompt_texts: list[str], answers: list[str]) -> list[list[int]]:
    """The token ids of each template (``prompt_texts[i]``, e.g. "12 + 7 + 30 = ") as the tokenizer splits it inside
    its full answer (``answers[i]``, "12 + 7 + 30 = 49"): the tokens of the answer that end within the template, so a
    trailing space that the tokenizer joins to the result's first digit is left to the result."""
    out = []
    for template, answer in zip(prompt_texts, answers):
        enc = tok(answer, add_special_tokens=False, return_offsets_mapping=True)
        out.append([i for i, (_, end) in zip(enc.input_ids, enc.offset_mapping) if end <= len(template)])
    return out


@torch.no_grad()
def position_logp(model, where: Positions, device, batch_prompts: int = BATCH_PROMPTS):
    """log pi(. | sequence[:j+1]) at the positions ``where`` names, every sequence in order: yields (n, V) float32
    blocks, one per batch of sequences (n = their positions). Right padding, positions counted from each sequence's
    start."""
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(where.sequences), batch_prompts):
            part, spans = where.sequences[s : s + batch_prompts], where.spans[s : s + batch_prompts]
            width = max(len(p) for p in part)
            ids = torch.zeros(len(part), width, dtype=torch.long)  # (n, L)
            att = torch.zeros(len(part), width, dtype=torch.long)  # (n, L)
            keep = torch.zeros(len(part), width, dtype=torch.bool)  # (n, L) the positions that count
            for i, (p, (start, stop)) in enumerate(zip(part, spans)):
                ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
                att[i, : len(p)] = 1
                keep[i, start:stop] = True
            position_ids = (att.cumsum(-1) - 1).clamp(min=0)  # (n, L)
            logits = model(
                input_ids=ids.to(device), attention_mask=att.to(device), position_ids=position_ids.to(device), use_cache=False
            ).logits  # (n, L, V)
            yield torch.log_softmax(logits.float()[keep.to(logits.device)], dim=-1)  # (positions, V)
    finally:
        model.train(was_training)


def prompt_logp(model, prompt_ids: list[list[int]], device, batch_prompts: int = BATCH_PROMPTS):
    """log pi(. | prompt[:j+1]) at every prompt position j = 0 .. P - 2 of every prompt (``prompt_positions``)."""
    return position_logp(model, prompt_positions(prompt_ids), device, batch_prompts)


def rest_logp(logp: Tensor, top_ids: Tensor) -> Tensor:
    """(N,) log of the mass of ``logp`` (N, V) outside the tokens ``top_ids`` (N, k); -inf where they cover all of V."""
    return logp.scatter(-1, top_ids, -math.inf).logsumexp(-1)


def build_reference(model, prompt_ids: list[list[int]] | Positions, device, k: int = TOP_K) -> TaxReference:
    """pi_init's top-k log-probs and rest mass at the positions ``where`` names (token ids: every prompt position)."""
    where = prompt_ids if isinstance(prompt_ids, Positions) else prompt_positions(prompt_ids)
    ids, lps, rests = [], [], []
    for logp in position_logp(model, where, device):
        top_logp, top_ids = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (n, k) each
        ids.append(top_ids.cpu())
        lps.append(top_logp.cpu())
        rests.append(rest_logp(logp, top_ids).cpu())
    return TaxReference(torch.cat(ids), torch.cat(lps), torch.cat(rests), where.digest)


def coarse_kl(ref_top_logp: Tensor, ref_rest: Tensor, top_ids: Tensor, logp: Tensor) -> Tensor:
    """(N,) KL(pi_init || pi) between the two coarsened to pi_init's top-k tokens and one bin for the rest (module
    docstring); ref_top_logp (N, k), ref_rest (N,), top_ids (N, k), logp (N, V) pi's log-probs."""
    now_top = logp.gather(-1, top_ids)  # (N, k)
    now_rest = rest_logp(logp, top_ids)  # (N,)
    top = (ref_top_logp.exp() * (ref_top_logp - now_top)).sum(-1)  # (N,)
    rest = torch.where(torch.isinf(ref_rest), torch.zeros_like(ref_rest), ref_rest.exp() * (ref_rest - now_rest))  # (N,)
    return top + rest


def tax_kl(model, prompt_ids: list[list[int]] | Positions, ref: TaxReference, device) -> float:
    """The mean over the positions ``ref`` was scored at (token ids: every prompt position, ``eval/tax_kl``; a
    ``template_positions``: ``eval/template_kl``) of ``coarse_kl`` between ``ref`` and ``model`` now."""
    where = prompt_ids if isinstance(prompt_ids, Positions) else prompt_positions(prompt_ids)
    total, n = 0.0, 0
    for logp in position_logp(model, where, device):
        rows = slice(n, n + logp.shape[0])
        kl = coarse_kl(ref.top_logp[rows].to(logp.device), ref.rest_logp[rows].to(logp.device), ref.top_ids[rows].to(logp.device), logp)
        total += float(kl.double().sum())
        n += logp.shape[0]
    return total / n if n else math.nan


TEMPLATE_PREFIX = "template_"
"""The file's keys of the template reference: the prompt reference's with this prefix."""


def _entries(ref: TaxReference, prefix: str = "") -> dict:
    return {
        f"{prefix}top_ids": ref.top_ids,
        f"{prefix}top_logp": ref.top_logp,
        f"{prefix}rest_logp": ref.rest_logp,
        f"{prefix}prompts_sha256": ref.prompts_sha256,
    }


def save_reference(ref: TaxReference, path: Path, template: TaxReference | None = None) -> None:
    """Write ``ref`` (and the template positions' reference ``template``, under ``TEMPLATE_PREFIX`` keys) to ``path``
    atomically (``core.files.write_atomic``: a temporary ``.NAME.*.tmp`` beside it, renamed over it); a full disk or a
    permission error is ``WriteFailed`` naming the file."""
    path = Path(path)
    data = _entries(ref) | ({} if template is None else _entries(template, TEMPLATE_PREFIX))
    try:
        write_atomic(path, lambda fh: torch.save(data, fh))
    except OSError as err:
        raise WriteFailed(f"writing {describe_write_error(path, err)}; eval/tax_kl needs it to go on after a resume") from None


def load_reference(path: Path, prefix: str = "") -> TaxReference | str:
    """The reference stored at ``path`` (``prefix`` = ``TEMPLATE_PREFIX``: the template positions'), or one sentence
    saying why it cannot be used (read with ``weights_only``: data never runs as code)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        if prefix and f"{prefix}top_ids" not in data:
            return f"{path} holds no reference at the template's positions (written before eval/template_kl was logged)"
        ref = TaxReference(*(data[f"{prefix}{k}"] for k in ("top_ids", "top_logp", "rest_logp")), str(data[f"{prefix}prompts_sha256"]))
    except FileNotFoundError:
        return f"{path} is missing (the run began before eval/tax_kl was logged, or the file was removed)"
    except Exception as err:  # a damaged or foreign file: the metric is left out, the run goes on
        return f"{path} cannot be read as a tax reference ({type(err).__name__}: {err})"
    n, k = ref.top_ids.shape if ref.top_ids.dim() == 2 else (-1, -1)
    if ref.top_logp.shape != (n, k) or ref.rest_logp.shape != (n,):
        return f"{path} holds tensors of inconsistent shapes"
    return ref


@dataclass
class _Site:
    """One set of positions a TaxMeter measures: its key, its positions, its keys' prefix in the file, its reference."""

    key: str
    where: Positions
    prefix: str
    ref: TaxReference | None = None
    missing: str | None = None
    """Why its reference cannot be used (a bare reason), once looked for and not found."""


class TaxMeter:
    """``eval/tax_kl`` of a run, and ``eval/template_kl`` when the task has a template (``template_ids``: the template's
    tokens after each eval prompt): the references are built at the step-0 evaluation and saved to the run folder in
    one file, or, when the run resumes, read from there; a key whose reference is missing (a run started before it
    was logged) is left out, and ``unavailable`` says why."""

    def __init__(
        self, model, prompt_ids: list[list[int]], path: Path, device, *, writes: bool, template_ids: list[list[int]] | None = None
    ):
        self.model, self.prompt_ids, self.path, self.device, self.writes = model, prompt_ids, Path(path), device, writes
        self.sites = [_Site("eval/tax_kl", prompt_positions(prompt_ids), "")]
        if template_ids is not None:
            self.sites.append(_Site("eval/template_kl", template_positions(prompt_ids, template_ids), TEMPLATE_PREFIX))

    @property
    def ref(self) -> TaxReference | None:
        """The prompt positions' reference (``eval/tax_kl``'s)."""
        return self.sites[0].ref

    @property
    def unavailable(self) -> str | None:
        """Why keys are not logged, in one sentence (the keys that share a reason named together); None when all are."""
        reasons: dict[str, list[str]] = {}
        for site in self.sites:
            if site.missing is not None:
                reasons.setdefault(site.missing, []).append(site.key)
        if not reasons:
            return None
        return "; ".join(f"{' and '.join(keys)} {'is' if len(keys) == 1 else 'are'} not logged: {why}" for why, keys in reasons.items())

    def _load(self, site: _Site) -> None:
        found = load_reference(self.path, site.prefix)
        if isinstance(found, str):
            site.missing = found
        elif found.prompts_sha256 != site.where.digest:
            site.missing = f"{self.path} was scored on other eval prompts than this run's"
        else:
            site.ref = found

    def measure(self, step: int) -> dict:
        """{key: value} of every site with a reference at ``step`` ({} without eval prompts)."""
        if not self.prompt_ids:
            return {}
        if step == 0:  # the policy at step 0 is pi_init (a run resumed from its step-0 checkpoint gives the same one)
            for site in self.sites:
                site.ref, site.missing = build_reference(self.model, site.where, self.device), None
            if self.writes:
                save_reference(self.sites[0].ref, self.path, self.sites[1].ref if len(self.sites) > 1 else None)
        for site in self.sites:
            if site.ref is None and site.missing is None:
                self._load(site)
        return {site.key: tax_kl(self.model, site.where, site.ref, self.device) for site in self.sites if site.ref is not None}
