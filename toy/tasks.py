"""Toy tasks: small token-level automata whose completions a tabular policy can sample or enumerate.

A task is a deterministic automaton per prompt. Each state has a parameter row (the policy's
context: the prefix so far, up to states the task declares equivalent) and a set of legal
next tokens; a transition either moves to another state or ends the completion with a reward
and an answer form. Rows may be tied across prompts: the template rows of the ``family`` task
are shared by every prompt, so high-frequency template tokens are updated by every group.

Where this departs from the paper (App. A):
1. ``tenplusten`` keeps the paper's three trajectories, tokenised into words, and by default
   adds one synonym at each template position ("answer"/"result", "is"/"equals"). Without an
   alternative a template context has probability 1 on its token and no drift is possible;
   the synonyms lead to the same next state, so the choice between them is reward-irrelevant
   by construction and any drift there is pure learning tax (Prop. 3.1).
2. The initial policy is a "pretrained" prior (template tokens likely, answers balanced),
   not uniform: the paper's setting is fine-tuning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ILLEGAL = -1
"""``next_state`` value of a token that is not allowed in a state."""
END = -2
"""``next_state`` value of a token that ends the completion."""
WRONG = -1
"""``end_form`` of a completion whose answer is wrong."""


@dataclass(frozen=True)
class Task:
    """A set of prompts, each a deterministic automaton over one vocabulary.

    Shapes: N states, R parameter rows, V tokens, P prompts.
    """

    name: str
    vocab: tuple[str, ...]
    prompts: tuple[str, ...]
    start: Tensor  # (P,) start state of each prompt
    next_state: Tensor  # (N, V) long: next state, ILLEGAL or END
    end_reward: Tensor  # (N, V) float: reward of an END transition (0 elsewhere)
    end_form: Tensor  # (N, V) long: answer form of an END transition, WRONG for a wrong answer
    state_row: Tensor  # (N,) long: parameter row of each state
    prior_logits: Tensor  # (R, V) initial logits, -inf where illegal
    template_rows: Tensor  # (R,) bool: reward-irrelevant rows (every legal token leads to the same state)
    form_names: tuple[str, ...]  # names of the correct answer forms (the equivalent set)
    max_len: int  # longest completion, in tokens

    @property
    def n_rows(self) -> int:
        return int(self.prior_logits.shape[0])

    @property
    def legal(self) -> Tensor:
        """(R, V) bool: tokens allowed at each row."""
        return torch.isfinite(self.prior_logits)

    def decode(self, tokens: list[int]) -> str:
        return " ".join(self.vocab[t] for t in tokens)


class _Builder:
    """Collects states, rows and transitions, then freezes them into a :class:`Task`."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab
        self.tok = {w: i for i, w in enumerate(vocab)}
        self.rows: dict[object, int] = {}
        self.row_prior: list[dict[int, float]] = []
        self.row_template: list[bool] = []
        self.state_row: list[int] = []
        self.edges: list[dict[int, tuple[int, float, int]]] = []  # state -> token -> (next, reward, form)

    def state(self, row_key: object, prior: dict[str, float], template: bool = False) -> int:
        """A new state whose row is ``row_key`` (rows with equal keys are tied)."""
        probs = {self.tok[w]: p for w, p in prior.items()}
        if row_key not in self.rows:
            self.rows[row_key] = len(self.row_prior)
            self.row_prior.append(probs)
            self.row_template.append(template)
        elif self.row_prior[self.rows[row_key]] != probs:
            raise ValueError(f"tied row {row_key!r} is given two different priors")
        self.state_row.append(self.rows[row_key])
        self.edges.append({})
        return len(self.state_row) - 1

    def go(self, state: int, word: str, nxt: int) -> None:
        self.edges[state][self.tok[word]] = (nxt, 0.0, WRONG)

    def end(self, state: int, word: str, reward: float, form: int = WRONG) -> None:
        self.edges[state][self.tok[word]] = (END, reward, form)

    def build(self, name: str, prompts: list[str], starts: list[int], form_names: list[str]) -> Task:
        n, v, r = len(self.state_row), len(self.vocab), len(self.row_prior)
        next_state = torch.full((n, v), ILLEGAL, dtype=torch.long)
        end_reward = torch.zeros(n, v)
        end_form = torch.full((n, v), WRONG, dtype=torch.long)
        for s, edges in enumerate(self.edges):
            for t, (nxt, rew, form) in edges.items():
                next_state[s, t], end_reward[s, t], end_form[s, t] = nxt, rew, form
        prior = torch.full((r, v), -math.inf)
        for row, probs in enumerate(self.row_prior):
            for t, p in probs.items():
                prior[row, t] = math.log(p)
        state_row = torch.tensor(self.state_row, dtype=torch.long)
        for s in range(n):  # every state's legal tokens must be its row's legal tokens
            legal_row = torch.isfinite(prior[state_row[s]])
            if not torch.equal(next_state[s] != ILLEGAL, legal_row):
                raise ValueError(f"state {s} and its row {int(state_row[s])} disagree on the legal tokens")
        task = Task(
            name=name,
            vocab=tuple(self.vocab),
            prompts=tuple(prompts),
            start=torch.tensor(starts, dtype=torch.long),
            next_state=next_state,
            end_reward=end_reward,
            end_form=end_form,
            state_row=state_row,
            prior_logits=prior,
            template_rows=torch.tensor(self.row_template, dtype=torch.bool),
            form_names=tuple(form_names),
            max_len=0,
        )
        return _with_max_len(task)


def _with_max_len(task: Task) -> Task:
    """Longest path length; raises ValueError if the automaton has a cycle."""
    n = task.next_state.shape[0]
    memo: dict[int, int] = {}

    def longest(s: int, depth: int) -> int:
        if depth > n:
            raise ValueError(f"task {task.name!r} has a cycle: completions would be unbounded")
        if s not in memo:
            best = 0
            for nxt in task.next_state[s].tolist():
                if nxt == END:
                    best = max(best, 1)
                elif nxt >= 0:
                    best = max(best, 1 + longest(nxt, depth + 1))
            memo[s] = best
        return memo[s]

    max_len = max(longest(int(s), 0) for s in task.start)
    return Task(**{**task.__dict__, "max_len": max_len})


def tenplusten(*, distractors: bool = True, p_template: float = 0.7, p_canonical: float = 0.8) -> Task:
    """Paper App. A, "What is 10+10?": tau_1 = The answer is 25 . (R=0), tau_2 = The answer is 20 . (R=1),
    tau_3 = 10 + 10 = 20 . (R=1), tokenised into words (lengths 5, 5 and 6).

    ``distractors`` adds the reward-irrelevant synonyms "result" (for "answer") and "equals"
    (for "is"), each with prior 1 - ``p_canonical``. ``p_template`` is the prior of "The" at the
    first token. Equivalent set: the forms "The ... 20 ." and "10 + 10 = 20 .".
    """
    if not 0 < p_template < 1:
        raise ValueError(f"p_template must be in (0, 1), got p_template={p_template!r}")
    if not 0 < p_canonical <= 1 or (distractors and p_canonical == 1):
        raise ValueError(f"p_canonical must be in (0, 1), got p_canonical={p_canonical!r}")
    vocab = ["The", "answer", "result", "is", "equals", "25", "20", "10", "+", "=", "."]
    b = _Builder(vocab)
    syn = (lambda a, s: {a: p_canonical, s: 1 - p_canonical}) if distractors else (lambda a, s: {a: 1.0})
    root = b.state("root", {"The": p_template, "10": 1 - p_template})
    s_the = b.state("The", syn("answer", "result"), template=distractors)
    s_ans = b.state("The answer", syn("is", "equals"), template=distractors)
    s_is = b.state("The answer is", {"25": 0.5, "20": 0.5})
    s_25 = b.state("The answer is 25", {".": 1.0})
    s_20 = b.state("The answer is 20", {".": 1.0})
    e1 = b.state("10", {"+": 1.0})
    e2 = b.state("10 +", {"10": 1.0})
    e3 = b.state("10 + 10", {"=": 1.0})
    e4 = b.state("10 + 10 =", {"20": 1.0})
    e5 = b.state("10 + 10 = 20", {".": 1.0})
    b.go(root, "The", s_the)
    b.go(root, "10", e1)
    b.go(s_the, "answer", s_ans)
    b.go(s_ans, "is", s_is)
    if distractors:
        b.go(s_the, "result", s_ans)
        b.go(s_ans, "equals", s_is)
    b.go(s_is, "25", s_25)
    b.go(s_is, "20", s_20)
    b.end(s_25, ".", 0.0)
    b.end(s_20, ".", 1.0, form=0)
    b.go(e1, "+", e2)
    b.go(e2, "10", e3)
    b.go(e3, "=", e4)
    b.go(e4, "20", e5)
    b.end(e5, ".", 1.0, form=1)
    return b.build("tenplusten", ["What is 10+10?"], [root], ["The answer is 20 .", "10 + 10 = 20 ."])


def family(
    *,
    k: int = 3,
    n_correct: int = 2,
    n_wrong: int = 2,
    distractors: int = 1,
    prompts: int = 2,
    p_canonical: float = 0.9,
) -> Task:
    """A parametric family: a shared template of ``k`` tokens (each position with ``distractors``
    reward-irrelevant alternatives), then an answer: ``n_correct`` equivalent correct answers of
    lengths 1..n_correct and distinct surface forms, ``n_wrong`` wrong ones.

    The template rows are tied across the ``prompts`` prompts (high-frequency tokens shared by
    every group); the answer rows are per prompt, and prompt p's correct options are a rotation
    of the option list, so prompts differ. Completions per prompt: (1 + distractors)^k * (n_correct + n_wrong).
    """
    for name, value, low in (
        ("k", k, 0),
        ("n_correct", n_correct, 1),
        ("n_wrong", n_wrong, 0),
        ("distractors", distractors, 0),
        ("prompts", prompts, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {name}={value!r}")
    if n_correct + n_wrong < 2:
        raise ValueError(f"n_correct + n_wrong must be >= 2 so that rewards can differ, got {n_correct + n_wrong}")
    if not 0 < p_canonical <= 1 or (distractors > 0 and p_canonical == 1):
        raise ValueError(f"p_canonical must be in (0, 1), got p_canonical={p_canonical!r}")
    n_opt = n_correct + n_wrong
    lengths = [1 + (o % n_correct) for o in range(n_opt)]  # correct options 0..n_correct-1 have lengths 1..n_correct
    tpl = [[f"t{i}"] + [f"t{i}~{j}" for j in range(distractors)] for i in range(k)]
    opt = [[f"a{o}.{j}" for j in range(lengths[o])] for o in range(n_opt)]
    vocab = [w for words in tpl for w in words] + [w for words in opt for w in words]
    b = _Builder(vocab)
    starts = []
    tpl_prior = [{w: (p_canonical if j == 0 else (1 - p_canonical) / distractors) for j, w in enumerate(words)} for words in tpl]
    for p in range(prompts):
        states = [b.state(("tpl", i), tpl_prior[i], template=distractors > 0) for i in range(k)]
        answer = b.state(("answer", p), {words[0]: 1.0 / n_opt for words in opt})
        for i in range(k):
            for w in tpl[i]:
                b.go(states[i], w, states[i + 1] if i + 1 < k else answer)
        correct = {(p + j) % n_opt for j in range(n_correct)}
        for o, words in enumerate(opt):
            state = answer
            for j, w in enumerate(words):
                if j + 1 == len(words):
                    form = (o - p) % n_opt if o in correct else WRONG  # form j = the j-th correct option
                    b.end(state, w, 1.0 if o in correct else 0.0, form)
                else:
                    nxt = b.state(("answer", p, o, j), {words[j + 1]: 1.0})
                    b.go(state, w, nxt)
                    state = nxt
        starts.append(states[0] if k > 0 else answer)
    names = [f"correct answer {j}" for j in range(n_correct)]
    return b.build("family", [f"prompt {p}" for p in range(prompts)], starts, names)


TASKS = {"tenplusten": tenplusten, "family": family}
"""Task builders by name; keyword options are the builder's arguments."""


def make_task(name: str, **options: object) -> Task:
    """The task ``name`` built with ``options``; ValueError naming a bad name or option."""
    if name not in TASKS:
        raise ValueError(f"unknown task={name!r}; known: {', '.join(TASKS)}")
    builder = TASKS[name]
    import inspect

    known = [p for p in inspect.signature(builder).parameters]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for task {name!r}; known: {', '.join(known)}")
    return builder(**options)


def count_completions(task: Task) -> int:
    """Number of distinct completions over all prompts (dynamic programming, no enumeration)."""
    memo: dict[int, int] = {}

    def count(s: int) -> int:
        if s not in memo:
            row = task.next_state[s].tolist()
            memo[s] = sum(1 if nxt == END else count(nxt) for nxt in row if nxt != ILLEGAL)
        return memo[s]

    return sum(count(int(s)) for s in task.start)


@dataclass(frozen=True)
class Enumeration:
    """Every completion of every prompt, padded to the task's max length. C completions, T = max_len."""

    prompt: Tensor  # (C,) prompt index
    rows: Tensor  # (C, T) parameter row of each token's context (0 on padding)
    tokens: Tensor  # (C, T) token ids (0 on padding)
    mask: Tensor  # (C, T) bool, real tokens
    reward: Tensor  # (C,)
    form: Tensor  # (C,) answer form, WRONG if wrong

    @property
    def size(self) -> int:
        return int(self.prompt.shape[0])


def enumerate_completions(task: Task, *, limit: int = 1_000_000) -> Enumeration:
    """All completions, breadth-first and vectorised; ValueError if there are more than ``limit``."""
    total = count_completions(task)
    if total > limit:
        raise ValueError(f"task {task.name!r} has {total} completions, more than the exact-mode limit {limit}")
    T = task.max_len
    legal = task.next_state != ILLEGAL  # (N, V)
    # frontier of partial paths: current state, prompt, tokens and rows so far
    state = task.start.clone()  # (F,)
    prompt = torch.arange(task.start.shape[0])  # (F,)
    toks = torch.zeros(state.shape[0], T, dtype=torch.long)  # (F, T)
    rows = torch.zeros_like(toks)  # (F, T)
    done: list[tuple[Tensor, ...]] = []
    for t in range(T):
        if state.numel() == 0:
            break
        f_idx, tok = torch.nonzero(legal[state], as_tuple=True)  # expand every legal token
        s = state[f_idx]
        new_toks, new_rows = toks[f_idx].clone(), rows[f_idx].clone()
        new_toks[:, t], new_rows[:, t] = tok, task.state_row[s]
        nxt = task.next_state[s, tok]
        ends = nxt == END
        lengths = torch.full((int(ends.sum()),), t + 1)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        done.append((prompt[f_idx][ends], new_rows[ends], new_toks[ends], mask, task.end_reward[s, tok][ends], task.end_form[s, tok][ends]))
        state, prompt, toks, rows = nxt[~ends], prompt[f_idx][~ends], new_toks[~ends], new_rows[~ends]
    parts = [torch.cat(x) for x in zip(*done)]
    order = torch.argsort(parts[0], stable=True)  # completions of one prompt together
    return Enumeration(*(x[order] for x in parts))
