"""Rewards: what scores a completion, and the sandbox its calls run in.

Modules:
    compute.py       exact / last_int / math-verify / equiv / reasoning-gym / user rewards, format reward;
                     ``RewardComputer`` scores a batch (exact, last_int and equiv here, the others in the pool)
    pool.py          the worker processes that run rewards with a deadline, killed and replaced when they hang or die
    worker.py        one such worker (started by path: a fresh interpreter, standard library only) and the protocol
                     both sides share
    process_tree.py  the processes a reward worker started, found and killed whatever session they made

This file imports nothing: a worker for a built-in kind imports ``compute`` (through this package) without torch.
"""
