"""The run folder: what a run leaves on disk, and how it stops.

Modules:
    layout.py      ``RunDir``: the file names of a run folder, in one place
    folder.py      the run folder: checked, locked, marked as dfpo's own; never cleared unless it is
    checkpoint.py  checkpoint.pt and checkpoint.json: atomic writes, SHA-256, the config the run was made with
    resume.py      what a resume may change: the checkpoint's config compared key by key; ``resume_config``, the
                   config of ``--resume RUN_DIR`` (``dfpo train``) and ``--run RUN_DIR`` (``dfpo probe``)
    state.py       the run's counters, checkpoints (save/restore) and logs
    logs.py        JSONL logs, TensorBoard/wandb, the rate of the progress lines
    machine.py     the machine a run trained on, one line (summary.json's ``machine``), and its check before it is shown
    signals.py     SIGINT/SIGTERM from the program's first moment to its last: one line, the shell's status
                   before and after the trainer's own handling (``ExitOnSignal``), a checkpoint after the step
                   during it (``StopSignals``); standard library only, imported before anything else
    stop_messages.py  what a run says to a signal: the first one's line at once, what a stop at once leaves
    progress.py    what the run is doing and for how long: the heartbeat, seconds per step, the time left
"""
