"""A user reward module whose import takes 60 s: a signal must still end the parent while workers import it."""

import time

time.sleep(60)


def one(prompt, completion, answer):
    return 1.0
