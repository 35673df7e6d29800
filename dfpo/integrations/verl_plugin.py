"""Loaded by verl itself: dfpo declares this module in verl's plugin entry-point group (``verl.plugins``), which
verl imports in every process that imports verl (the driver and each Ray worker), unless
``VERL_USE_EXTERNAL_PLUGINS=none``. Importing it registers every dfpo preset as a verl policy loss, with the
group size read from verl's actor config (``rollout_n``) at each call."""

from __future__ import annotations

from dfpo.integrations.verl import register_dfpo_losses

REGISTERED = register_dfpo_losses()
